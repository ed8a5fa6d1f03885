"""verify's partial-update trial changes the op's declared data inputs (``Contract.data_inputs``,
the rule bench's rotating input sets follow), never a prepared parameter: planted caches that
key the prepared weights as a weight-preprocessing cache would (by version counter, or by
their whole contents) and the data by address plus a few sampled elements are caught as
cached results for several ops with prepared parameters; eager torch passes."""

import hashlib

import pytest
import torch

from kernelab.core import changeable
from kernelab.ops import Shape, get
from kernelab.verify import verify_candidate

SEED = 20261203

#: Shapes where a prepared parameter is the largest floating-point input (the input the trial
#: changed before it followed the declared data), with enough data elements that a few
#: sampled ones rarely see a single changed element.
SHAPES = {
    "fp8_gemm": Shape("7x200x67 per-row +bias", {"M": 7, "N": 200, "K": 67},
                      {"scaling": "row", "bias": True}, batch_dim="M"),
    "fp8_block_gemm": Shape("5x130x200", {"M": 5, "N": 130, "K": 200}, {}, batch_dim="M"),
    "fused_moe_fp8": Shape("T=64 E=4 k=2 64x32", {"tokens": 64, "experts": 4, "topk": 2,
                           "hidden": 64, "intermediate": 32}, {}, batch_dim="tokens"),
    "fused_moe_w4a16": Shape("T=32 E=8 k=2 128x256 g64", {"tokens": 32, "experts": 8, "topk": 2,
                             "hidden": 128, "intermediate": 256}, {"group_size": 64},
                             batch_dim="tokens"),
}  # fmt: skip
OPS = list(SHAPES)


def _verdict(fn, op_name, shape=None):
    op = get(op_name)
    report = verify_candidate(fn, op_name, shapes=[shape or SHAPES[op_name]], dtypes=op.dtypes[-1:],
                              device="cpu", seed=SEED, trials=2)  # fmt: skip
    return report, {f.cls for c in report.cases for f in c.failures}


def _bytes(t):
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _sampled(t, samples=4):
    flat = t.reshape(-1)
    return t.data_ptr(), _bytes(flat[:: max(1, flat.numel() // samples)][:samples])


def _by_version(t):
    return t.data_ptr(), t._version


def _by_contents(t):
    return t.data_ptr(), hashlib.sha1(_bytes(t)).hexdigest()


def prepared_cache(op_name, prepared_key, data_key=_sampled):
    """A result cache: the op's data inputs keyed by ``data_key`` (address and 4 sampled
    elements), every other tensor (the prepared weights and scales) by ``prepared_key``."""
    op = get(op_name)
    fn, memo = op.variants["torch"].fn, {}

    def cand(**kw):
        out = kw.pop("out", None)
        data = set(changeable(op, kw))
        key = tuple(
            (name, data_key(v) if name in data else prepared_key(v))
            for name, v in kw.items()
            if isinstance(v, torch.Tensor) and v.numel()
        )
        if key not in memo:
            memo.clear()
            memo[key] = fn(**kw).clone()
        y = memo[key]
        return y.clone() if out is None else out.copy_(y)

    return cand


CACHES = {"prepared weights by version": _by_version, "prepared weights by contents": _by_contents}


@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("cache", list(CACHES))
def test_a_cache_of_the_data_by_sampled_elements_is_caught(cache, op_name):
    report, classes = _verdict(prepared_cache(op_name, CACHES[cache]), op_name)
    assert not report.passed, f"{cache} on {op_name} passed"
    assert "cached result" in classes, (cache, op_name, classes)


@pytest.mark.parametrize("op_name", OPS)
def test_an_honest_cache_keyed_on_every_data_element_passes(op_name):
    report, classes = _verdict(prepared_cache(op_name, _by_version, _by_contents), op_name)
    assert report.passed, classes


def _largest_float(inputs):
    floats = [(v.numel(), k) for k, v in inputs.items()
              if isinstance(v, torch.Tensor) and v.is_floating_point()]  # fmt: skip
    return max(floats)[1]


@pytest.mark.parametrize("op_name", OPS)
def test_the_largest_float_input_is_a_prepared_parameter_on_these_shapes(op_name):
    op = get(op_name)
    inputs = op.inputs(SHAPES[op_name], op.dtypes[-1], "cpu")
    assert _largest_float(inputs) not in op.contract.data_inputs


@pytest.mark.parametrize("op_name", OPS)
def test_eager_torch_passes_and_only_data_inputs_change(op_name):
    report, classes = _verdict(get(op_name).variants["torch"].fn, op_name)
    assert report.passed, classes
    part = [t for c in report.cases for t in c.trials if t.get("kind") == "partial update"]
    assert part, "no partial update was made"
    declared = set(get(op_name).contract.data_inputs)
    assert part[0]["changed"] and set(part[0]["changed"]) <= declared, part[0]["changed"]


def test_rope_changes_positions_and_the_rotated_tensors_never_its_table():
    """rope's cos/sin table is its largest input; its data are the positions (integers, valid
    element by element) and the query and key it rotates in place."""
    shape = next(s for s in get("rope").shapes("edge") if "partial rotary" in s.label)
    report, classes = _verdict(get("rope").variants["torch"].fn, "rope", shape)
    assert report.passed, classes
    part = next(t for c in report.cases for t in c.trials if t.get("kind") == "partial update")
    assert set(part["changed"]) == {"positions", "query", "key"}, part["changed"]
