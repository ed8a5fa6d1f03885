"""Integrity checks around a timed loop (METHOD.md, "Known ways a kernel or harness fools
itself"). Each returns a flag naming the class of cheat, or nothing.

- the outputs of the timed calls, checked against the float64 reference after the loop;
- work left running after return: the output read right after return differs from the same
  output read after the device is synchronised and new host threads have finished;
- the synchronised host clock against the timer: a disagreement beyond dispatch overhead;
- results cached by pointer (fresh values written into the same buffers) or by shape or call
  count (fresh inputs at new addresses); by version counter or sampled elements in
  :mod:`kernelab.bench.rotation`; work on other threads and background load in
  :mod:`kernelab.bench.threads`;
- a time below the speed-of-light floor (see :mod:`kernelab.bench.roofline`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from kernelab.numerics import bits, error, special_mismatch
from kernelab.ops import as_tuple

#: Host-clock time per call may exceed the timer's by this factor (plus dispatch) before the
#: two are said to disagree: enough for noise on a busy host, far below a hidden workload.
HOST_FACTOR = 2.0
HOST_SLACK_S = 5e-6
#: How long to wait for work left behind before reading outputs a second time.
SETTLE_S = 0.01
JOIN_TIMEOUT_S = 5.0


def clone_inputs(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def bitwise_equal(a, b) -> bool:
    """Same bits (NaN equals NaN), for tensors or tuples of tensors."""
    a, b = as_tuple(a), as_tuple(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x is not y and x != y:
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        xb = x.detach().contiguous().reshape(-1).view(torch.uint8)
        yb = y.detach().contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(xb, yb):
            return False
    return True


def not_plain(result) -> str | None:
    """Why the timed call's outputs are not plain, materialised tensors (verify's output
    contract), or None. A tensor subclass or a tensor-like object can defer the work to the
    first read, which bench's own checks would then do after the clock stopped."""
    for i, item in enumerate(as_tuple(result)):
        if item is None:
            continue
        if type(item) is not torch.Tensor:
            what = type(item).__module__ + "." + type(item).__qualname__
            return f"output {i} is a {what}, not a plain torch.Tensor (lazy or wrapped)"
        if item.layout != torch.strided:
            return f"output {i} has layout {item.layout}, not torch.strided"
        if item.device.type == "meta":
            return f"output {i} is a meta tensor: nothing was computed"
    return None


def snapshot(result) -> tuple:
    return tuple(r.detach().clone() if isinstance(r, torch.Tensor) else r for r in as_tuple(result))


@dataclass
class Reference:
    """The float64 reference for one input set and the tolerance per checked tensor.

    An in-place argument whose contract declares a region (the cache slots a step writes) is
    checked as verify checks it: within the region against the reference, and everywhere else
    bitwise against its values before the call (rel L2 over a whole cache would let one wrong
    slot among millions of elements pass)."""

    outputs: tuple
    inplace: dict
    tolerances: list[float]
    #: in-place argument -> (mask of the elements it may write, its values outside, on CPU)
    untouched: dict = field(default_factory=dict)

    @classmethod
    def build(cls, op, inputs: dict, dtype: torch.dtype) -> Reference:
        """The reference of ``inputs`` (before any call wrote them) and tolerances derived
        from eager torch's error on these same inputs."""
        outs, inplace = op.run_reference(inputs)
        untouched = {}
        for n in inplace:
            mask = op.contract.region(n, inputs)
            if mask is not None:
                untouched[n] = (mask, inputs[n].detach().cpu()[~mask].clone())
        eager = None
        if op.eager is not None:
            args = clone_inputs(inputs)
            eager_out = as_tuple(op.eager(**args))
            eager = list(eager_out) + [args[n] for n in inplace]
        names = [None] * len(outs) + list(inplace)
        refs = list(outs) + list(inplace.values())
        tols = []
        for i, (name, ref) in enumerate(zip(names, refs, strict=True)):
            base = None
            if eager is not None:
                base = error(*_within(untouched.get(name), eager[i], ref)).rel_l2
            tols.append(op.contract.tolerance_for(dtype, base)[0])
        return cls(outs, inplace, tols, untouched)

    def check(self, result, inputs: dict) -> str | None:
        """None when ``result`` (and the in-place arguments in ``inputs``) are right."""
        got = list(as_tuple(result))
        if len(got) != len(self.outputs):
            return f"expected {len(self.outputs)} output(s), got {len(got)}"
        got += [inputs[n] for n in self.inplace]
        names = [f"output {i}" for i in range(len(self.outputs))] + list(self.inplace)
        refs = list(self.outputs) + list(self.inplace.values())
        checks = list(zip(names, got, refs, self.tolerances, strict=True))
        n_out = len(self.outputs)  # in-place arguments first: an output may be one of them
        for name, g, r, tol in checks[n_out:] + checks[:n_out]:
            if not isinstance(g, torch.Tensor):
                return f"{name} is {type(g).__name__}, not a tensor"
            if tuple(g.shape) != tuple(r.shape):
                return f"{name} has shape {tuple(g.shape)}, expected {tuple(r.shape)}"
            kept = self.untouched.get(name)
            if kept is not None:
                outside = g.detach().cpu()[~kept[0]]
                changed = _changed(outside, kept[1])
                if changed:
                    return f"{name}: {changed} element(s) changed outside the region it may write"
            g, r = _within(kept, g, r)
            if bool(special_mismatch(g, r).any()):
                return f"{name}: NaN/Inf pattern differs from the reference"
            err = error(g, r).rel_l2
            if not err <= tol:
                return f"{name}: error {err:.2e} > tolerance {tol:.2e}"
        return None


def _within(kept, *tensors):
    """``tensors`` restricted to a region's elements (all of them without a region)."""
    if kept is None:
        return tensors
    return tuple(t.detach().cpu()[kept[0]] for t in tensors)


def _changed(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of two same-dtype 1-D tensors differ bit for bit."""
    return int((bits(a.contiguous()) != bits(b.contiguous())).sum())


def new_threads(before: set) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def settle(timer, before: set) -> int:
    """Synchronise the device and join host threads started since ``before``; count them."""
    timer.sync()
    left = new_threads(before)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t in left:
        t.join(max(0.0, deadline - time.monotonic()))
    time.sleep(SETTLE_S)
    timer.sync()
    return len(left)


def returned_early(fn, timer) -> tuple[bool, int, object]:
    """Call once; compare the output read at return with the output after settling.

    Returns (outputs changed after return, threads left running, the settled result).
    """
    timer.sync()
    before = set(threading.enumerate())
    result = fn()
    early = snapshot(result)
    threads = settle(timer, before)
    return not bitwise_equal(early, snapshot(result)), threads, result


def host_clock(fn, timer, calls: int) -> tuple[float, int]:
    """Per-call seconds of ``calls`` calls on the host clock, until all their work is done.

    The clock stops after the device is synchronised and host threads the calls started have
    finished. Returns (seconds per call, threads that were still running at return).
    """
    timer.sync()
    before = set(threading.enumerate())
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    timer.sync()
    left = new_threads(before)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t in left:
        t.join(max(0.0, deadline - time.monotonic()))
    return (time.perf_counter_ns() - t0) * 1e-9 / calls, len(left)


def host_disagrees(host_s: float, timed_s: float, dispatch_s: float) -> bool:
    """Whether the synchronised host time exceeds the timer's beyond dispatch overhead."""
    return host_s > HOST_FACTOR * timed_s + dispatch_s + HOST_SLACK_S


def refill(inputs: dict, fresh: dict) -> None:
    """Write ``fresh`` values into the tensors of ``inputs`` (same addresses, new data)."""
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and isinstance(fresh.get(k), torch.Tensor):
            v.copy_(fresh[k])
