"""kernelab's attention inside transformers: ``register_attention`` / ``unregister_attention``.

    from kernelab.models import register_attention
    register_attention(model)              # parity-checked; then generate / generate_batch
    model.generate(ids, max_new_tokens=32)
    model.generate_batch(prompts, generation_config)

``register_attention()`` registers ``"kernelab"`` with transformers' ``AttentionInterface``
(and, for its masks, sdpa's mask function, so masks follow sdpa's rules), explicitly, never at
import; calling it again is a no-op. With a model it also switches that model to ``"kernelab"``
(``set_attn_implementation``), serves a paged cache handed to it in place (``_paged_cache``)
and, with ``check``, compares a few tokens — a prefill and decode steps through a cache, two
sequences — with the model's previous implementation: beyond the dtype's contract the model is
switched back and :class:`AttentionParityError` names the first attention module that
differs. ``unregister_attention(model)`` restores that model; without a model, every registered
model is restored and ``"kernelab"`` leaves the interfaces.

Gemma-2 is served (its softcap, its scale query_pre_attn_scalar^-0.5 and its alternating
sliding-window layers go to the kernels; ``_attention``'s note). Its default implementation is
eager (sdpa refuses a softcap), and for continuous batching transformers 5.24 swaps eager for
``"paged|eager"``, which ignores ``softcap``: its own ``generate_batch`` on Gemma-2 gives the
tokens of the model without the cap (measured on ``tiny-gemma2``: every request's tokens
differ from its ``generate``). So the check's continuous-batching reference for a model whose
previous implementation is eager and whose attention is soft-capped is the model's own eager
function on transformers' gathered K/V and mask (``_eager_reference``), not ``"paged|eager"``.
The probe is W + 4 tokens for a window W up to 252 (Gemma-2's 4096 is longer: its window is
then not reached by the check; the tests reach it on ``tiny-gemma2``).

Relies on (transformers 5.x): ``AttentionInterface.register``, ``AttentionMaskInterface.
register`` (``masking_utils``), ``sdpa_mask``, ``PreTrainedModel.set_attn_implementation``,
``DynamicCache``, and for continuous batching what ``_paged_cache`` lists.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref

import torch

from kernelab.models import _attention, _paged_cache, _parity

NAME = "kernelab"

#: models switched to "kernelab": id -> (weak model, previous implementation, hook handle)
_MODELS: dict[int, tuple[weakref.ref, str, object]] = {}


class AttentionParityError(RuntimeError):
    """kernelab's attention disagreed with the model's previous implementation."""


def _interfaces():
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    return AttentionInterface, AttentionMaskInterface, sdpa_mask


def is_registered() -> bool:
    attn, _, _ = _interfaces()
    return attn._global_mapping.get(NAME) is _attention.attention_forward


def _register_global() -> None:
    attn, mask, sdpa_mask = _interfaces()
    current = attn._global_mapping.get(NAME)
    if current is not None and current is not _attention.attention_forward:
        raise ValueError(
            f"attention: {NAME!r} is already registered with transformers by "
            f"{getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', current)}"
        )
    attn.register(NAME, _attention.attention_forward)
    mask.register(NAME, sdpa_mask)


def register_attention(model=None, *, check: bool = True, check_tokens: int = 8):
    """Register ``"kernelab"`` with transformers (idempotent); with ``model``, switch it to it.

    Returns ``model`` (or None). Raises :class:`AttentionParityError` (the model left on its
    previous implementation) when ``check`` finds a divergence, and ValueError for a model
    whose architecture is not served (Llama, Mistral, Qwen2, Qwen3, Gemma-2)."""
    _register_global()
    if model is None:
        return None
    reason = _attention.arch_unsupported(model.config)
    if reason:
        raise ValueError(f"model: {reason}")
    if id(model) in _MODELS:
        return model
    previous = model.config._attn_implementation or "sdpa"
    if previous == NAME:
        raise ValueError(f"model: already set to {NAME!r} outside register_attention")
    probe = _parity.probe_inputs(model, _probe_length(model, check_tokens)) if check else None
    reference = _trace(model, probe, previous) if check else None
    _switch(model, previous)
    if check:
        try:
            _check_against(model, probe, reference, previous)
        except BaseException:
            unregister_attention(model)
            raise
    return model


def _switch(model, previous: str) -> None:
    model.set_attn_implementation(NAME)
    _attention._FALLBACKS[id(model.config)] = (previous, _fallback_function(model, previous))
    hook = model.register_forward_pre_hook(_paged_cache.pre_forward_hook, with_kwargs=True)
    if hasattr(model, "init_continuous_batching"):
        model.init_continuous_batching = _continuous_batching_entry(model)
    _MODELS[id(model)] = (weakref.ref(model), previous, hook)


def _continuous_batching_entry(model):
    """The model's ``init_continuous_batching`` (which ``generate_batch`` calls), for a model on
    "kernelab". transformers 5.24's manager accepts only "sdpa", "paged|eager" and flash
    implementations by name (``switch_to_cb_friendly_attn``); kernelab's attention takes
    sdpa's masks and arguments, so the manager is built while the model reads as "sdpa", with
    ``auto_switch_to_flash`` off (it would replace kernelab), and the model reads "kernelab"
    again before any step runs. Set on the instance only; ``unregister_attention`` removes it."""
    import copy

    original = type(model).init_continuous_batching.__get__(model)

    def init_continuous_batching(generation_config=None, continuous_batching_config=None,
                                 *args, **kwargs):  # fmt: skip
        from transformers import ContinuousBatchingConfig

        cb = copy.copy(continuous_batching_config or ContinuousBatchingConfig())
        cb.auto_switch_to_flash = False
        config = model.config
        config._attn_implementation = "sdpa"
        try:
            return original(generation_config, cb, *args, **kwargs)
        finally:
            config._attn_implementation = NAME

    return init_continuous_batching


def _fallback_function(model, name: str):
    attn, _, _ = _interfaces()
    if name in attn._global_mapping and name != NAME:
        return attn._global_mapping[name]
    import sys

    # "eager": the model's own module-level function
    for module in model.modules():
        mod = sys.modules.get(type(module).__module__)
        fn = getattr(mod, "eager_attention_forward", None)
        if fn is not None:
            return fn
    return None


def unregister_attention(model=None) -> None:
    """Restore ``model``'s previous attention; without a model, restore every registered model
    and remove ``"kernelab"`` from transformers' interfaces. Idempotent."""
    targets = [model] if model is not None else [ref() for ref, _, _ in list(_MODELS.values())]
    for m in targets:
        if m is None or id(m) not in _MODELS:
            continue
        _, previous, hook = _MODELS.pop(id(m))
        hook.remove()
        m.__dict__.pop("init_continuous_batching", None)
        _attention._FALLBACKS.pop(id(m.config), None)
        m.set_attn_implementation(previous)
    if model is None:
        _MODELS.clear()
        attn, mask, _ = _interfaces()
        if attn._global_mapping.get(NAME) is _attention.attention_forward:
            del attn._global_mapping[NAME]
            mask._global_mapping.pop(NAME, None)


# --- the parity check -----------------------------------------------------------------------


def _probe_batch(model, probe: torch.Tensor) -> torch.Tensor:
    """Two different sequences (so that reading the other sequence's cache shows)."""
    other = torch.roll(probe, 1, dims=-1) * 7 % model.config.vocab_size
    return torch.cat([probe, other])


@torch.no_grad()
def _dense_probe(model, probe, steps: int = 3) -> None:
    """A prefill of the probe's first tokens and ``steps`` decode steps through a
    DynamicCache feeding its next tokens, for two sequences."""
    from transformers import DynamicCache

    ids = _probe_batch(model, probe)
    split = max(1, ids.shape[1] - steps)
    cache = DynamicCache(config=model.config)
    # transformers 5.24 renames past_key_values to cache (Gemma-2 warns on the old name)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    model(input_ids=ids[:, :split], use_cache=True, **{name: cache})
    for t in range(split, ids.shape[1]):
        model(input_ids=ids[:, t : t + 1], use_cache=True, **{name: cache})


@torch.no_grad()
def _paged_probe(model, probe) -> None:
    """Two requests through transformers' continuous batching with a paged cache of 16-token
    pages: the longer one past a page, then decode steps that read the cache (skipped where
    this transformers has no continuous batching)."""
    if not hasattr(model, "generate_batch"):
        return
    from transformers import ContinuousBatchingConfig, GenerationConfig

    ids = _probe_batch(model, probe)
    long = torch.cat([ids[0], ids[1], ids[0]]).tolist()[: max(17, ids.shape[1])]
    prompts = [long, ids[1, : max(2, ids.shape[1] // 2)].tolist()]
    gen = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=16, max_batch_tokens=64)
    model.generate_batch(prompts, gen, continuous_batching_config=cb, warmup=False)


def _probe_length(model, tokens: int) -> int:
    """``tokens``, or W + 4 for a sliding window W ≤ 252 (so that the window is reached)."""
    window = getattr(model.config, "sliding_window", None)
    if isinstance(window, int) and 0 < window <= 252:
        return max(tokens, window + 4)
    return tokens


def eager_paged_is_wrong(model, previous: str) -> bool:
    """transformers runs continuous batching on "paged|eager" for an eager model, and that
    function ignores ``softcap`` (transformers 5.24)."""
    return previous == "eager" and bool(getattr(model.config, "attn_logit_softcapping", None))


@contextlib.contextmanager
def _eager_reference(model, previous: str):
    """The model on "kernelab" in reference mode: every attention call runs ``previous``'s
    function on transformers' own cache update (gathered K/V) and mask, the mask built by
    transformers' ``build_attention_mask`` (``_attention._fallback_mask``)."""
    _switch(model, previous)
    _attention._REFERENCE.add(id(model.config))
    try:
        yield
    finally:
        _attention._REFERENCE.discard(id(model.config))
        unregister_attention(model)


def _trace(model, probe, reference_of: str | None = None) -> tuple[list, list]:
    """Logits of every forward pass of both probes, and every attention module's output, in
    execution order (the scheduling is deterministic, so two implementations see the same
    batches). ``reference_of``: the model's implementation, when this is the reference."""
    logits, attn = [], []
    names = {id(m): n for n, m in model.named_modules()}
    head = model.get_output_embeddings()
    handles = [head.register_forward_hook(lambda mod, a, out: logits.append(out.detach().clone()))]
    for m in model.modules():
        if type(m).__name__.endswith("Attention"):
            handles.append(m.register_forward_hook(
                lambda mod, a, out: attn.append((names.get(id(mod)), out[0].detach().clone()))
            ))  # fmt: skip
    try:
        _dense_probe(model, probe)
        if reference_of is not None and eager_paged_is_wrong(model, reference_of):
            with _eager_reference(model, reference_of):
                _paged_probe(model, probe)
        else:
            _paged_probe(model, probe)
    finally:
        for h in handles:
            h.remove()
    return logits, attn


def _check_against(model, probe, reference, previous: str) -> None:
    from kernelab.numerics import error

    dtype = _parity.model_dtype(model)
    tol = _parity.tolerance(dtype)
    logits, attn = _trace(model, probe)
    ref_logits, ref_attn = reference
    if len(logits) != len(ref_logits):
        worst = float("inf")
    else:
        worst = max(error(g, r).rel_l2 for g, r in zip(logits, ref_logits, strict=True))
    if worst <= tol:
        return
    where = "no attention module alone (the combination)"
    for (name, a), (_, b) in zip(attn, ref_attn, strict=False):
        err = error(a, b).rel_l2 if a.shape == b.shape else float("inf")
        if not err <= tol:
            where = f"{name} (rel L2 {err:.2e} > {tol:.1e})"
            break
    raise AttentionParityError(
        f"model: with attn_implementation={NAME!r} the logits differ from {previous!r} by rel L2 "
        f"{worst:.2e} > {tol:.1e} ({dtype}); first attention module that differs: {where}; the "
        f"model was left on {previous!r}"
    )
