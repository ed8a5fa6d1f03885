"""moe_topk through the interpreter: the experts exactly, the weights within float32's
contract; DeepSeek-V3's grouped selection against transformers' router; planted defects caught
by verify."""

import importlib

import pytest
import torch

from kernelab.ops import MOE_TOPK, Shape, moe_topk, moe_topk_ref
from kernelab.ops.moe.moe_topk import moe_topk_torch, moe_topk_triton
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import check

topk_module = importlib.import_module("kernelab.ops.moe.moe_topk")
OP = MOE_TOPK


@pytest.mark.parametrize("shape", OP.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=3)
    weights, ids = check(OP, inputs, moe_topk_triton, torch.bfloat16)
    _, ref_ids = moe_topk_ref(**inputs)
    assert ids.dtype == torch.int32 and torch.equal(ids, ref_ids)  # ties to the lower expert
    assert weights.dtype == torch.float32


@pytest.mark.parametrize("shape", OP.shapes("representative")[1::4], ids=lambda s: s.label)
def test_representative_shapes_at_interpreter_size(shape):
    inputs = OP.inputs(shape.reduced(8), torch.float32, "cpu", seed=4, dist="heavy")
    _, ids = check(OP, inputs, moe_topk_triton, torch.float32)
    assert torch.equal(ids, moe_topk_ref(**inputs)[1])


def test_properties_of_the_weights():
    logits = torch.randn(9, 16)
    w, ids = moe_topk_triton(logits, 4, "softmax", True)
    assert torch.allclose(w.sum(-1), torch.ones(9))
    assert (w[:, :-1] >= w[:, 1:]).all()  # decreasing, as the logits
    assert torch.equal(ids.long(), torch.topk(logits, 4).indices)
    w_all, _ = moe_topk_triton(logits, 16, "softmax", False)
    assert torch.allclose(w_all, torch.softmax(logits, -1).sort(-1, descending=True).values)
    assert torch.equal(moe_topk(logits, 3)[1], moe_topk_torch(logits, 3)[1])


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"router_logits": torch.zeros(4, 8, dtype=torch.int32)}, TypeError, "router_logits"),
        ({"top_k": 9}, ValueError, "top_k: expected at most the number of experts (8)"),
        ({"top_k": 0}, ValueError, "top_k: expected an int >= 1"),
        ({"top_k": 2.0}, TypeError, "top_k: expected an int"),
        ({"scoring": "relu"}, ValueError, "scoring: expected one of"),
        ({"renormalize": 1}, TypeError, "renormalize: expected a bool"),
        ({"n_group": 3}, ValueError, "n_group: expected a divisor of the number of experts (8)"),
        ({"n_group": 8}, ValueError, "n_group: expected groups of at least 2 experts"),
        ({"n_group": 0}, ValueError, "n_group: expected an int >= 1"),
        ({"n_group": 2, "topk_group": 3}, ValueError, "topk_group: expected at most n_group (2)"),
        (
            {"n_group": 4, "topk_group": 1, "top_k": 3},
            ValueError,
            "top_k: expected at most topk_group x experts per group (1 x 2 = 2), got 3",
        ),
        ({"bias": torch.zeros(8, dtype=torch.bfloat16)}, TypeError, "bias: expected dtype"),
        ({"bias": torch.zeros(7)}, ValueError, "bias: expected shape (8,) (one per expert)"),
        ({"bias": torch.zeros(1, 8)}, ValueError, "bias: expected 1 dimensions"),
        ({"routed_scaling_factor": 0.0}, ValueError, "routed_scaling_factor: expected a finite"),
        ({"routed_scaling_factor": float("nan")}, ValueError, "routed_scaling_factor"),
    ],
)
@pytest.mark.parametrize("fn", [moe_topk_triton, moe_topk_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {"router_logits": torch.randn(4, 8), "top_k": 2, **kwargs}
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


MUTANTS = {
    # the last token of each program block gets the next expert's id
    "last token's expert": (
        "idx = tl.minimum(idx, E - 1)",
        "idx = tl.where(rt == T - 1, (tl.minimum(idx, E - 1) + 1) % E, tl.minimum(idx, E - 1))",
    ),
    # ties to the higher expert
    "tie order": (
        "idx = tl.min(tl.where(cand, re[None, :], BLOCK_E), axis=1)",
        "idx = tl.max(tl.where(cand, re[None, :], -1), axis=1)",
    ),
    # renormalised by the sum of all but the last weight
    "renormalised over k-1": ("total += w", "total += tl.where(j < TOPK - 1, w, 0.0)"),
    # DeepSeek-V3's selection: the weights from the biased scores (the key) ...
    "weights from biased scores": (
        "w = tl.sum(tl.where(re[None, :] == idx[:, None], s, 0.0), axis=1)",
        "w = tl.sum(tl.where(re[None, :] == idx[:, None], c, 0.0), axis=1)",
    ),
    # ... the groups ranked by their best expert instead of the sum of their two best ...
    "groups ranked by max": (
        "(top1 + top2)[:, None]",
        "top1[:, None]",
    ),
    # ... the routed scaling factor applied twice
    "scaling factor applied twice": (
        "tl.store(ptr, w / total * scaling, mask=t_ok)",
        "tl.store(ptr, w / total * scaling * scaling, mask=t_ok)",
    ),
    # ... equal group scores to the higher group
    "group tie order": (
        "gi = tl.min(tl.where(open_best, rg[None, :], BLOCK_G), axis=1)",
        "gi = tl.max(tl.where(open_best, rg[None, :], -1), axis=1)",
    ),
}
#: Defects of the NaN contract (see the module docstring), caught by the NaN routing check.
NAN_MUTANTS = {
    # a NaN logit compared as it is (NaN equals nothing: no expert found, or a NaN max)
    "NaN logit not ranked as -inf": (
        'key_all = tl.where(x == x, x, float("-inf"))',
        "key_all = x",
    ),
    # a NaN score or biased score compared as it is
    "NaN key not ranked as -inf": (
        'c = tl.where(free & (c == c), c, float("-inf"))',
        'c = tl.where(free, c, float("-inf"))',
    ),
    # the sigmoid weight taken from the selection key (a chosen NaN expert weighs 0, not NaN)
    "sigmoid weight of the key": (
        "w = tl.sigmoid(tl.sum(tl.where(re[None, :] == idx[:, None], x, 0.0), axis=1))",
        "w = tl.sigmoid(best)",
    ),
    # a kept group removed by a -inf score, which still ties with groups scored -inf
    "kept group marked by -inf": (
        "taken = taken | (rg[None, :] == gi[:, None])",
        'scores = tl.where(rg[None, :] == gi[:, None], float("-inf"), scores)',
    ),
}
SHAPES = [
    Shape("ties T=20 E=16 k=3", {"tokens": 20, "experts": 16},
          {"top_k": 3, "scoring": "softmax", "renormalize": True, "ties": True}, "tokens"),
    Shape("sigmoid T=5 E=8 k=2", {"tokens": 5, "experts": 8},
          {"top_k": 2, "scoring": "sigmoid", "renormalize": True}, "tokens"),
    Shape("grouped T=12 E=64 k=6 3 of 8", {"tokens": 12, "experts": 64},
          {"top_k": 6, "scoring": "sigmoid", "renormalize": True, "n_group": 8,
           "topk_group": 3, "routed_scaling_factor": 2.5, "bias": True}, "tokens"),
    Shape("grouped, tied logits T=16 E=32 k=4 2 of 4", {"tokens": 16, "experts": 32},
          {"top_k": 4, "scoring": "sigmoid", "renormalize": True, "n_group": 4,
           "topk_group": 2, "routed_scaling_factor": 1.0, "bias": False, "ties": True}, "tokens"),
]  # fmt: skip


def _verify():
    return verify_candidate(moe_topk_triton, "moe_topk", shapes=SHAPES, dtypes=[torch.bfloat16],
                            device="cpu", seed=5, trials=1)  # fmt: skip


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_by_verify(monkeypatch, tmp_path, name):
    old, new = MUTANTS[name]
    monkeypatch.setattr(topk_module, "_moe_topk_kernel",
                        mutate(topk_module._moe_topk_kernel, old, new, tmp_path))  # fmt: skip
    report = _verify()
    assert not report.passed
    assert {f.cls for c in report.cases for f in c.failures} <= {"wrong values", "contract"}


# --- NaN logits: one answer in every path -------------------------------------------------------

NAN_CASES = {
    "softmax": dict(scoring="softmax"),
    "sigmoid": dict(scoring="sigmoid"),
    "sigmoid, not renormalised": dict(scoring="sigmoid", renormalize=False),
    "sigmoid, 8 groups, 2 kept, bias": dict(scoring="sigmoid", n_group=8, topk_group=2, bias=True),
    "softmax, bias": dict(scoring="softmax", bias=True),
}


def _nan_logits(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 16, generator=gen)
    x[0, 3] = float("nan")  # one NaN
    x[1, :] = float("nan")  # a whole row
    x[2, 5] = float("inf")
    x[3, 2] = float("-inf")
    x[4, [0, 4, 9, 14]] = float("nan")  # several, among the best ones at top-k = 13
    x[5, :12] = float("nan")  # fewer numbers than top-k: NaN experts chosen, lowest first
    return x


def _nan_disagreements(fn) -> list[str]:
    """Where ``fn`` differs from the reference on NaN logits: ids exactly, NaN where the
    reference has NaN, other weights within float32 rounding."""
    out = []
    for label, kw in NAN_CASES.items():
        for top_k in (4, 13):
            if kw.get("n_group") and top_k > 4:
                continue
            x = _nan_logits()
            args = dict(kw)
            if args.get("bias"):
                args["bias"] = torch.randn(16, generator=torch.Generator().manual_seed(1)) / 10
            w, ids = fn(x, top_k, **args)
            rw, rids = moe_topk_ref(x.double(), top_k, **args)
            nan = torch.isnan(rw)
            if not torch.equal(ids, rids):
                out.append(f"{label} k={top_k}: ids {ids.tolist()} != {rids.tolist()}")
            elif not torch.equal(torch.isnan(w), nan) or not torch.allclose(
                w[~nan].double(), rw[~nan], rtol=1e-5, atol=1e-6
            ):
                out.append(f"{label} k={top_k}: weights {w.tolist()} != {rw.tolist()}")
    return out


@pytest.mark.parametrize("fn", [moe_topk_triton, moe_topk_torch], ids=["triton", "torch"])
def test_nan_logits_give_the_answer_of_the_contract_in_every_path(fn):
    assert _nan_disagreements(fn) == []
    # the contract itself, on one row: NaN ranks as -inf (ties to the lower expert)
    x = torch.tensor([[float("nan"), 1.0, float("-inf"), float("nan"), 0.5]])
    w, ids = fn(x, 4, scoring="sigmoid", renormalize=False)
    assert ids.tolist() == [[1, 4, 0, 2]]
    assert w[0, 2].isnan() and w[0, 3] == 0 and w[0, 0] == torch.sigmoid(torch.tensor(1.0))


@pytest.mark.parametrize("name", list(NAN_MUTANTS))
def test_nan_contract_defects_are_caught(monkeypatch, tmp_path, name):
    old, new = NAN_MUTANTS[name]
    monkeypatch.setattr(topk_module, "_moe_topk_kernel",
                        mutate(topk_module._moe_topk_kernel, old, new, tmp_path))  # fmt: skip
    assert _nan_disagreements(moe_topk_triton)


def test_the_kernel_passes_verify_on_the_same_cases():
    report = _verify()
    assert report.passed, [f.line() for c in report.cases for f in c.failures]
    # with NaN and ±inf planted in the logits (a trial of each case)
    assert all(any(t["specials"] == "router_logits" for t in c.trials) for c in report.cases)


# --- DeepSeek-V3's grouped selection ---------------------------------------------------------


@pytest.mark.parametrize("tokens", [1, 64], ids=["decode", "prefill-64"])
def test_deepseek_v3_routing_at_decode_and_prefill_token_counts(tokens):
    shape = next(s for s in OP.shapes("representative") if "deepseek" in s.label)
    assert shape.dims["experts"] == 256 and shape.params["n_group"] == 8
    shape = Shape(shape.label, {**shape.dims, "tokens": tokens}, shape.params, "tokens")
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=6)
    weights, ids = check(OP, inputs, moe_topk_triton, torch.bfloat16)
    assert torch.equal(ids, moe_topk_ref(**inputs)[1])
    # every token's experts lie in at most topk_group = 4 of the 8 groups of 32
    assert max(len(set((row // 32).tolist())) for row in ids) <= 4
    # renormalised, then x 2.5
    assert torch.allclose(weights.sum(-1), torch.full((tokens,), 2.5))


def test_grouped_selection_keeps_the_best_groups_and_weighs_by_the_unbiased_scores():
    # Two groups of four. Group 1's best expert is the best overall, but group 0 has the larger
    # sum of its two best: group 0 is kept. The bias makes expert 3 beat expert 0; its weight
    # is still its own sigmoid.
    logits = torch.tensor([[2.0, 1.9, -3.0, 1.0, 3.0, -3.0, -3.0, -3.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
    for fn in (moe_topk_triton, moe_topk_torch, moe_topk_ref):
        w, ids = fn(logits, 2, "sigmoid", False, 2, 1, bias, 2.0)
        assert ids.tolist() == [[3, 0]], fn.__name__
        assert torch.allclose(w.float(), 2.0 * torch.sigmoid(torch.tensor([[1.0, 2.0]])))


def test_grouped_routing_equals_transformers_deepseek_v3_router():
    modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    config = pytest.importorskip("transformers").DeepseekV3Config(
        hidden_size=32, n_routed_experts=64, num_experts_per_tok=6, n_group=8, topk_group=3,
        routed_scaling_factor=2.5, norm_topk_prob=True,
    )  # fmt: skip
    router = modeling.DeepseekV3TopkRouter(config)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
        router.e_score_correction_bias.copy_(torch.randn(64, generator=gen) * 0.1)
        logits, want_w, want_ids = router(torch.randn(40, 32, generator=gen) / 4)
    bias = router.e_score_correction_bias
    for fn in (moe_topk_triton, moe_topk_torch):
        w, ids = fn(logits, 6, "sigmoid", True, 8, 3, bias, 2.5)
        # transformers' topk(sorted=False) leaves the order open: compare sorted by expert
        order, want_order = ids.long().sort(-1), want_ids.sort(-1)
        assert torch.equal(order.values, want_order.values), fn.__name__
        got_w = w.gather(1, order.indices)
        assert torch.allclose(got_w, want_w.gather(1, want_order.indices), rtol=1e-6, atol=0)


@pytest.mark.parametrize("fn", [moe_topk_triton, moe_topk_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("groups", [(1, 1), (4, 2)])
def test_a_bias_that_is_not_finite_is_refused_when_checked(fn, bad, groups):
    """Checked (the default): refused naming the expert. Unchecked: both paths choose the same
    experts (a NaN biased score ranks as −inf; an infinite one decides the choice)."""
    logits, bias = torch.randn(6, 16, generator=torch.Generator().manual_seed(3)), torch.zeros(16)
    bias[5] = bad
    args = {"router_logits": logits, "top_k": 4, "scoring": "sigmoid", "bias": bias}
    args.update(n_group=groups[0], topk_group=groups[1])
    with pytest.raises(ValueError, match=r"^bias: expected finite values, got .* at expert 5$"):
        fn(**args)
    _, ids = fn(**args, check=False)
    _, other = (moe_topk_torch if fn is moe_topk_triton else moe_topk_triton)(**args, check=False)
    assert torch.equal(ids, other)
    assert (5 in ids[0].tolist()) == (bad == float("inf"))
