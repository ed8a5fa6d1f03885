"""kernelab's attention inside transformers: registration, ordinary generate on dynamic and
static caches, continuous batching on the paged cache in place, fallbacks, and the parity
check against planted defects. On CPU the public ops run kernelab's torch variants (same
routes, same arguments); the ``interpret`` tests run the Triton kernels through the
interpreter."""

import importlib
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import kernelab.ops as ko
from kernelab.models import (
    AttentionParityError,
    _attention,
    build,
    register_attention,
    serving,
    unregister_attention,
)
from tests.serving_helpers import count_calls, frozen_gc, prompts

GenerationConfig = importlib.import_module("transformers").GenerationConfig
ContinuousBatchingConfig = importlib.import_module("transformers").ContinuousBatchingConfig


@pytest.fixture(scope="module", autouse=True)
def _quick_gc():
    yield from frozen_gc()


@pytest.fixture(autouse=True)
def _clean():
    _attention._WARNED.clear()
    yield
    unregister_attention()


@pytest.fixture
def calls(monkeypatch):
    """How often each kernelab op ran (the routes taken)."""
    return count_calls(monkeypatch)


_MODELS = {}


def model(name="tiny-llama", head_dim=64, **config):
    key = (name, head_dim, tuple(sorted(config.items())))
    if key not in _MODELS:
        m = build(name, head_dim=head_dim)
        for k, v in config.items():
            setattr(m.config, k, v)
            for layer in m.model.layers:
                setattr(layer.self_attn, k, v)
        _MODELS[key] = m
    return _MODELS[key]


GREEDY = dict(do_sample=False, eos_token_id=-1, pad_token_id=0)


# --- registration -----------------------------------------------------------------------------


def _mapping():
    from transformers.modeling_utils import AttentionInterface

    return AttentionInterface._global_mapping


def test_registration_is_explicit_idempotent_and_undone():
    assert "kernelab" not in _mapping()  # importing kernelab.models registered nothing
    register_attention()
    register_attention()
    assert _mapping()["kernelab"] is _attention.attention_forward
    m = model()
    register_attention(m, check=False)
    register_attention(m, check=False)  # a no-op
    assert m.config._attn_implementation == "kernelab"
    assert "init_continuous_batching" in vars(m)
    unregister_attention(m)
    unregister_attention(m)
    assert m.config._attn_implementation == "sdpa"
    assert "init_continuous_batching" not in vars(m)
    unregister_attention()
    assert "kernelab" not in _mapping()


def test_a_foreign_kernelab_registration_is_an_error_not_an_override():
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register("kernelab", lambda *a, **k: None)
    try:
        with pytest.raises(ValueError, match="'kernelab' is already registered"):
            register_attention()
    finally:
        del AttentionInterface._global_mapping["kernelab"]


def test_an_unserved_architecture_is_refused_naming_it():
    m = model()
    m.config.model_type = "phi3"
    try:
        with pytest.raises(ValueError, match="architecture 'phi3' is not served"):
            register_attention(m, check=False)
    finally:
        m.config.model_type = "llama"


# --- ordinary generate ------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_gives_the_tokens_of_sdpa(preset, cache, calls):
    m = model(preset)
    ids = torch.tensor(prompts([11, 11], seed=3))
    opts = dict(max_new_tokens=6, **GREEDY)
    if cache == "static":
        opts["cache_implementation"] = "static"
    want = m.generate(ids, **opts)
    register_attention(m, check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        got = m.generate(ids, **opts)
    assert torch.equal(got, want)
    # prefill through attention_prefill, decode through the cache tensor as pages
    assert calls["attention_prefill"] == 2 and calls["paged_attention"] == 2 * 5


def test_dense_cache_pages_are_views_of_the_cache():
    cache = torch.randn(3, 2, 40, 64)
    pages, tables = _attention._as_pages(cache)
    assert pages.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    page = pages.shape[1]
    for b in range(3):
        for j in range(40):
            got = pages[tables[b, j // page], j % page]
            assert torch.equal(got, cache[b, :, j])


def test_padding_falls_back_to_sdpa_with_one_warning(calls):
    m = model()
    ids = torch.tensor(prompts([9, 9], seed=4))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: not a causal prefix
    opts = dict(max_new_tokens=3, attention_mask=mask, **GREEDY)
    want = m.generate(ids, **opts)
    register_attention(m, check=False)
    with pytest.warns(RuntimeWarning, match="not a causal prefix") as caught:
        got = m.generate(ids, **opts)
    assert torch.equal(got, want)
    assert sum("kernelab attention" in str(w.message) for w in caught) == 1


def test_an_unserved_head_dim_falls_back_with_one_warning():
    m = model(head_dim=None)  # the tiny preset's 16
    ids = torch.tensor(prompts([6], seed=5))
    want = m.generate(ids, max_new_tokens=3, **GREEDY)
    register_attention(m, check=False)
    with pytest.warns(RuntimeWarning, match="head_dim 16 is not served"):
        got = m.generate(ids, max_new_tokens=3, **GREEDY)
    assert torch.equal(got, want)


# --- continuous batching ----------------------------------------------------------------------

#: 16 requests: some longer than several 16-token pages, some of one token; a cache too small
#: to hold them all at once, so that finished requests' blocks are freed and reused
LENGTHS = [3, 70, 17, 1, 45, 16, 33, 8, 64, 2, 29, 50, 5, 40, 12, 21]
CB = dict(page_size=16, num_blocks=24, max_batch_tokens=96)


def _generate_batch(m, lengths, max_new_tokens=5, **cb):
    gen = GenerationConfig(max_new_tokens=max_new_tokens, **GREEDY)
    config = ContinuousBatchingConfig(**{**CB, **cb})
    out = m.generate_batch(prompts(lengths, seed=7), gen, continuous_batching_config=config)
    return {k: list(r.generated_tokens) for k, r in out.items()}


def _cb_parity(preset, calls, lengths=LENGTHS, max_new_tokens=5):
    m = model(preset)
    want = _generate_batch(m, lengths, max_new_tokens)
    register_attention(m, check=False)
    got = _generate_batch(m, lengths, max_new_tokens)
    assert got == want
    assert len(got) == len(lengths)
    # in place: every step wrote through kv_cache_write and read pages through paged_attention
    assert calls["kv_cache_write"] > 0 and calls["paged_attention"] > 0
    pages_needed = sum(-(-(n + max_new_tokens) // 16) for n in lengths)
    assert pages_needed > CB["num_blocks"]  # so blocks were freed and reused


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_generate_batch_gives_the_tokens_of_transformers_paged_path(preset, calls):
    _cb_parity(preset, calls)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_generate_batch_through_the_triton_interpreter(preset, calls, interpret):
    _cb_parity(preset, calls, max_new_tokens=3)


def test_a_continuous_batching_fallback_gives_the_tokens_of_transformers_paged_path():
    # head_dim 16 is not served: every layer falls back to sdpa on the K/V transformers
    # gathers; transformers builds no mask for "kernelab", so without the one the fallback is
    # given (built from the cumulative lengths) sdpa would attend across the packed sequences
    m = model(head_dim=None)
    lengths = [3, 40, 17, 1, 30]
    want = _generate_batch(m, lengths, 4)
    register_attention(m, check=False)
    with pytest.warns(RuntimeWarning, match="head_dim 16 is not served"):
        assert _generate_batch(m, lengths, 4) == want


def test_block_tables_from_read_indices():
    # two sequences of 20 and 5 keys in pages 3, 7 and 2 of 16 tokens
    read = torch.cat([torch.arange(48, 64), torch.arange(112, 116), torch.arange(32, 37)])
    cu_k = torch.tensor([0, 20, 25], dtype=torch.int32)
    tables = _attention.block_tables(read, cu_k, 20, 16)
    assert tables.tolist() == [[3, 7], [2, 0]]


# --- the parity check and planted defects -----------------------------------------------------


def test_the_parity_check_passes_an_honest_integration():
    m = model()
    register_attention(m)
    assert m.config._attn_implementation == "kernelab"


def test_a_sliding_window_passes_the_parity_check_and_generates_the_tokens_of_sdpa(calls):
    m = model("tiny-mistral", sliding_window=4)  # shorter than the probes: the window applies
    ids = torch.tensor(prompts([10], seed=8))
    want = m.generate(ids, max_new_tokens=4, **GREEDY)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        register_attention(m)
        got = m.generate(ids, max_new_tokens=4, **GREEDY)
    assert torch.equal(got, want) and calls["paged_attention"] > 0


def _refused(m, module="model.layers.0.self_attn"):
    with pytest.raises(AttentionParityError) as info:
        register_attention(m)
    assert module in str(info.value)
    assert m.config._attn_implementation == "sdpa"  # left on the previous implementation
    assert "init_continuous_batching" not in vars(m)


def test_a_block_table_row_read_one_off_is_refused_naming_the_module(monkeypatch):
    monkeypatch.setattr(_attention, "_TABLE_ROW_SHIFT", 1)
    _refused(model())


def test_a_window_off_by_one_is_refused(monkeypatch):
    m = model("tiny-mistral", sliding_window=4)
    monkeypatch.setattr(
        _attention, "_window_left", lambda module, w: int(w or module.sliding_window)
    )
    _refused(m)


def test_a_slot_written_one_off_is_refused(monkeypatch):
    # only the continuous-batching probe writes through kv_cache_write
    real = ko.kv_cache_write
    monkeypatch.setattr(ko, "kv_cache_write", lambda k, v, kc, vc, slots, **o: real(
        k, v, kc, vc, slots + 1, **o))  # fmt: skip
    _refused(model("tiny-qwen2"))


def test_parity_state_is_restored_after_a_refusal(monkeypatch):
    monkeypatch.setattr(_attention, "_TABLE_ROW_SHIFT", 1)
    m = model()
    with pytest.raises(AttentionParityError):
        register_attention(m)
    assert id(m) not in serving._MODELS and id(m.config) not in _attention._FALLBACKS
