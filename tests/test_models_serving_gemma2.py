"""kernelab's attention serving Gemma-2 inside transformers: the soft-capped logits, the scale
query_pre_attn_scalar^-0.5 and the alternating sliding-window layers, in ordinary generate
(dynamic and static caches) and in continuous batching (full layers on the paged cache in
place, sliding layers on the K/V transformers gathers from its ring buffer); the fallbacks'
masks; and the parity check against planted defects. ``tiny-gemma2``: window 12, cap 1.0."""

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

transformers = importlib.import_module("transformers")
GenerationConfig = transformers.GenerationConfig
ContinuousBatchingConfig = transformers.ContinuousBatchingConfig

WINDOW = 12
GREEDY = dict(do_sample=False, eos_token_id=-1, pad_token_id=0)


@pytest.fixture(scope="module", autouse=True)
def _quick_gc():
    yield from frozen_gc()


@pytest.fixture(autouse=True)
def _clean():
    _attention._WARNED.clear()
    yield
    unregister_attention()
    _attention._REFERENCE.clear()


@pytest.fixture
def calls(monkeypatch):
    """How often each kernelab op ran (the routes taken)."""
    return count_calls(monkeypatch)


_MODELS = {}


def model(head_dim=64, softcap=1.0):
    key = (head_dim, softcap)
    if key not in _MODELS:
        m = build("tiny-gemma2", head_dim=head_dim)
        m.config.attn_logit_softcapping = softcap
        for layer in m.model.layers:
            layer.self_attn.attn_logit_softcapping = softcap
        _MODELS[key] = m
    m = _MODELS[key]
    assert m.config._attn_implementation == "eager"  # left as built
    return m


def _no_fallback():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error", RuntimeWarning)
    return ctx


# --- the preset ---------------------------------------------------------------------------------


def test_tiny_gemma2_alternates_windows_and_its_cap_window_and_scale_matter():
    m = model()
    assert m.config.layer_types == ["sliding_attention", "full_attention"]
    attn = [layer.self_attn for layer in m.model.layers]
    assert [a.sliding_window for a in attn] == [WINDOW, None]
    assert attn[0].scaling == 32**-0.5 != m.config.head_dim**-0.5
    ids = torch.tensor(prompts([WINDOW + 8], seed=1))

    def logits(**change):
        saved = [{k: getattr(a, k) for k in change} for a in attn]
        for a in attn:
            for k, v in change.items():
                setattr(a, k, v)
        try:
            with torch.no_grad():
                return m(ids).logits
        finally:
            for a, s in zip(attn, saved, strict=True):
                for k, v in s.items():
                    setattr(a, k, v)

    base = logits()
    for change in ({"attn_logit_softcapping": None}, {"scaling": m.config.head_dim**-0.5}):
        rel = ((logits(**change) - base).norm() / base.norm()).item()
        assert rel > 1e-2, change  # a dropped cap or a wrong scale shows in the logits
    # the window matters past it: the same prompt with an unreached window differs there only
    m.config.sliding_window = 4096
    try:
        wide = logits()
    finally:
        m.config.sliding_window = WINDOW
    assert torch.equal(wide[:, :WINDOW], base[:, :WINDOW])
    assert not torch.allclose(wide[:, WINDOW:], base[:, WINDOW:], atol=1e-3)


def test_the_window_convention_matches_transformers_mask_at_the_boundary():
    # transformers: key j visible from query i when i - W < j <= i; kernelab: window_left = W-1
    from transformers.masking_utils import sliding_window_causal_mask_function

    allowed = sliding_window_causal_mask_function(WINDOW)
    n = 2 * WINDOW + 3
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    mask = allowed(zero, zero, i, j).expand(n, n)
    assert mask[WINDOW, 1] and not mask[WINDOW, 0]  # the boundary: W keys, itself included
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(n, h, 64, generator=gen) for h in (4, 2, 2))
    cu = torch.tensor([0, n], dtype=torch.int32)
    rep = lambda x: x.repeat_interleave(2, 1).transpose(0, 1)  # noqa: E731
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), rep(k), rep(v), attn_mask=mask
    ).transpose(0, 1)
    window_left = _attention._window_left(None, WINDOW)
    assert window_left == WINDOW - 1
    got = ko.attention_prefill(q, k, v, cu, cu, window_left=window_left)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    off = ko.attention_prefill(q, k, v, cu, cu, window_left=WINDOW)
    assert not torch.allclose(off, want, atol=1e-3)


# --- ordinary generate -------------------------------------------------------------------------


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_gives_the_tokens_of_eager(cache, calls):
    m = model()
    ids = torch.tensor(prompts([WINDOW + 9, WINDOW + 9], seed=3))  # past the window
    opts = dict(max_new_tokens=6, **GREEDY)
    if cache == "static":
        opts["cache_implementation"] = "static"
    want = m.generate(ids, **opts)
    register_attention(m, check=False)
    ctx = _no_fallback()
    try:
        got = m.generate(ids, **opts)
    finally:
        ctx.__exit__(None, None, None)
    assert torch.equal(got, want)
    # both layers: the prefill through attention_prefill, decode through the cache as pages
    assert calls["attention_prefill"] == 2 and calls["paged_attention"] == 2 * 5


def test_an_eager_fallback_gets_eager_masks_not_sdpas():
    # head_dim 16 is not served: the fallback is Gemma-2's eager, which adds its mask to the
    # scores; kernelab's masks are sdpa's (boolean, or None for causal), so they are converted
    m = model(head_dim=None)
    ids = torch.tensor(prompts([WINDOW + 5], seed=5))
    want = m.generate(ids, max_new_tokens=4, **GREEDY)
    register_attention(m, check=False)
    with pytest.warns(RuntimeWarning, match="head_dim 16 is not served"):
        got = m.generate(ids, max_new_tokens=4, **GREEDY)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["eager", "paged|eager"])
def test_fallback_masks_in_eager_form(name):
    q, k = torch.zeros(1, 4, 5, 64), torch.zeros(1, 2, 9, 64)
    lowest = torch.finfo(torch.float32).min
    causal = _attention._fallback_mask(name, None, q, k, 3, {})  # sdpa's None: causal, top-left
    i, j = torch.arange(5)[:, None], torch.arange(9)[None, :]
    assert torch.equal(causal[0, 0] == 0, (j <= i) & (j > i - 3))
    assert causal.dtype == torch.float32 and causal.min() == lowest
    boolean = torch.rand(1, 1, 5, 9) > 0.5
    assert torch.equal(
        _attention._fallback_mask(name, boolean, q, k, 0, {})[0, 0] == 0, boolean[0, 0]
    )
    assert _attention._fallback_mask(name, None, q[:, :, :1], k, 0, {}) is None
    assert _attention._fallback_mask("sdpa", boolean, q, k, 0, {}) is boolean


def test_continuous_batching_fallback_masks_are_built_from_the_lengths():
    # transformers builds no mask for "kernelab": without one, a fallback would attend across
    # sequences; the mask has transformers' block-diagonal causal form, with the window
    q, k = torch.zeros(1, 4, 6, 64), torch.zeros(1, 2, 10, 64)
    kwargs = {"cu_seq_lens_q": torch.tensor([0, 1, 5]), "cu_seq_lens_k": torch.tensor([0, 4, 9])}
    bias = _attention._fallback_mask("eager", None, q, k, 3, kwargs)[0, 0] == 0
    want = torch.zeros(6, 10, dtype=torch.bool)
    want[0, 1:4] = True  # a decode step past 3 keys: the last 3 of its 4 keys (window 3)
    for r in range(4):  # 4 new queries over 5 keys: bottom-right causal, window 3
        pos = 1 + r
        want[1 + r, 4 + max(0, pos - 2) : 4 + pos + 1] = True
    assert torch.equal(bias, want)  # row 5 (padding) sees nothing


# --- continuous batching ------------------------------------------------------------------------

#: 12 requests: shorter and longer than the window (11, 12, 13 at its boundary), some past
#: several 16-token pages, some of one token, in a cache too small for all at once (blocks are
#: freed and reused)
LENGTHS = [3, 70, 13, 1, 45, 12, 33, 11, 64, 2, 29, 50]
CB = dict(page_size=16, num_blocks=24, max_batch_tokens=96)


def _generate_batch(m, lengths, max_new_tokens, **cb):
    gen = GenerationConfig(max_new_tokens=max_new_tokens, **GREEDY)
    config = ContinuousBatchingConfig(**{**CB, **cb})
    out = m.generate_batch(prompts(lengths, seed=7), gen, continuous_batching_config=config)
    return {k: list(r.generated_tokens) for k, r in out.items()}


def _generate_each(m, lengths, max_new_tokens):
    """transformers' own path that applies the cap: generate, one request at a time, eager."""
    out = {}
    for i, p in enumerate(prompts(lengths, seed=7)):
        ids = m.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, **GREEDY)
        out[f"req_{i}"] = ids[0, len(p) :].tolist()
    return out


def _cb_parity(calls, lengths=LENGTHS, max_new_tokens=5, **cb):
    m = model()
    want = _generate_each(m, lengths, max_new_tokens)
    register_attention(m, check=False)
    ctx = _no_fallback()
    try:
        got = _generate_batch(m, lengths, max_new_tokens, **cb)
    finally:
        ctx.__exit__(None, None, None)
    assert got == want and len(got) == len(lengths)
    # the full layer in place (kv_cache_write, paged_attention on the pages); the sliding layer
    # on transformers' gathered ring buffer (attention_prefill)
    assert calls["kv_cache_write"] > 0 and calls["paged_attention"] > 0
    assert calls["attention_prefill"] > calls["kv_cache_write"]
    pages_needed = sum(-(-(n + max_new_tokens) // 16) for n in lengths)
    assert pages_needed > {**CB, **cb}["num_blocks"]


def test_generate_batch_gives_the_tokens_of_transformers_generate(calls):
    _cb_parity(calls)


@pytest.mark.slow
def test_generate_batch_through_the_triton_interpreter(calls, interpret):
    _cb_parity(calls, lengths=[3, 40, 13, 1, 29, 12, 11, 20], max_new_tokens=3, num_blocks=8)


def test_without_the_cap_generate_batch_gives_the_tokens_of_transformers_paged_path(calls):
    m = model(softcap=None)
    want = _generate_batch(m, LENGTHS, 4)  # "paged|eager": right when there is no cap
    register_attention(m, check=False)
    assert _generate_batch(m, LENGTHS, 4) == want
    assert calls["paged_attention"] > 0


def test_transformers_paged_eager_still_drops_the_cap():
    # Why the parity check's continuous-batching reference for Gemma-2 is its eager function
    # on transformers' gathered K/V (serving._eager_reference) rather than "paged|eager": if
    # this fails, transformers applies the cap there now and the workaround can go.
    lengths = [3, 20]
    m = model()
    assert serving.eager_paged_is_wrong(m, "eager")
    assert _generate_batch(m, lengths, 3) != _generate_each(m, lengths, 3)


def test_a_continuous_batching_fallback_gives_the_tokens_of_generate():
    m = model(head_dim=None)  # 16: not served; every layer falls back to eager, gathered K/V
    lengths = [3, 30, 13, 1, 20]
    want = _generate_each(m, lengths, 3)
    register_attention(m, check=False)
    with pytest.warns(RuntimeWarning, match="head_dim 16"):
        assert _generate_batch(m, lengths, 3) == want


# --- the parity check and planted defects -------------------------------------------------------


def test_the_parity_check_passes_an_honest_gemma2_and_reaches_the_window():
    m = model()
    assert serving._probe_length(m, 8) == WINDOW + 4
    ctx = _no_fallback()
    try:
        register_attention(m)
    finally:
        ctx.__exit__(None, None, None)
    assert m.config._attn_implementation == "kernelab"


def _planted(monkeypatch, **change):
    """Run the integration's routes with some of transformers' arguments altered."""
    real = _attention._route

    def route(module, query, key, value, mask, scaling, sliding_window, softcap, *rest):
        args = {"scaling": scaling, "softcap": softcap, **change}
        if callable(args["scaling"]):
            args["scaling"] = args["scaling"](module)
        return real(module, query, key, value, mask, args["scaling"], sliding_window,
                    args["softcap"], *rest)  # fmt: skip

    monkeypatch.setattr(_attention, "_route", route)


DEFECTS = {
    "window off by one": lambda mp: mp.setattr(
        _attention, "_window_left", lambda module, w: int(w or module.sliding_window or 0) or -1
    ),
    "softcap dropped": lambda mp: _planted(mp, softcap=None),
    "scale from the head size": lambda mp: _planted(mp, scaling=lambda m: m.head_dim**-0.5),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_a_planted_defect_is_refused_naming_the_module(defect, monkeypatch):
    DEFECTS[defect](monkeypatch)
    m = model()
    with pytest.raises(AttentionParityError) as info:
        register_attention(m)
    # the first attention module that differs: the sliding layer for the window, the first
    # layer for a cap or scale
    assert "first attention module that differs: model.layers.0.self_attn" in str(info.value)
    assert m.config._attn_implementation == "eager"  # left on the previous implementation
    assert "init_continuous_batching" not in vars(m) and not _attention._REFERENCE


def test_serve_bench_says_why_transformers_tokens_differ_on_gemma2(tmp_path):
    from kernelab.workloads import serve_bench as serve

    result = serve.run("tiny-gemma2", requests=3, prompt_len=20, output_len=3,
                       profile_dir=tmp_path)  # fmt: skip
    assert "ignores the attention softcap" in result["baseline_note"]
    assert [r["attention"] for r in result["runs"]] == ["eager", "kernelab"]
    assert not result["tokens_identical"]  # transformers' paged|eager drops the cap
