"""One case: a callable on one op × shape × dtype, over several trials.

Each trial draws fresh inputs from one distribution (the last trial also holds NaN and ±Inf).

- Trial 0, call 1: every input is copied into a canary-guarded buffer; every output is a
  guarded buffer passed as ``out=`` and poisoned with NaN (a sentinel for integers). The result
  must meet the output contract, match the float64 reference within tolerance and its NaN/Inf
  pattern, leave canaries and non-in-place inputs bitwise intact, and update in-place
  arguments as the reference does (within the contract's region when it declares one, every
  element outside it bitwise unchanged).
- Trial 0, call 2: the same inputs restored at the same addresses, outputs poisoned with a
  different value: results must be bitwise identical (unless the op declares itself
  nondeterministic); an element holding the poison after both calls was never written.
- Each later trial (or, with one trial, one extra draw): new values written into the same
  buffers, one call: all the checks of call 1, and a wrong result bitwise equal to the
  previous (right) result is a cached result.
- After the first trial without NaN/Inf, a partial update: a few random elements of every
  input the op declares as data (``Contract.data_inputs``, the rule bench's rotating input
  sets follow; by default every floating-point input), 1 in 4096 of each, at least one
  (positions and values, from another input distribution, drawn from the run seed), changed
  in place in the same buffers, one call. Prepared parameters (a quantized weight and its
  scales, a rotary table) keep their values: the changed inputs are always a set a caller
  can hold, and a cache of the data keyed on its address plus a few sampled elements, or on
  anything but every element, returns the previous result here (however it keys the
  prepared parameters). Its values are judged on the whole tensor and,
  sharply, on the output elements whose reference changed.
- Last, the allocating path: the same (partially updated) contents in fresh allocations, the
  candidate called without ``out=`` (it must allocate and return its outputs), judged the
  same way: a candidate right only when handed its output buffer fails here.
- A subject that runs through an interpreter (kernelab's Triton variants on CPU, a user's
  kernel launched there) gets these last two calls on one dtype of each shape, the dtypes
  taken in turn over the shapes (``verify/_runner.py``): they made each of its capped cases
  five calls instead of three.
"""

from __future__ import annotations

import inspect
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kernelab.core import changeable
from kernelab.core.runtime.inputs import DISTRIBUTIONS
from kernelab.numerics import error
from kernelab.ops import as_tuple
from kernelab.verify import _buffers, _checks
from kernelab.verify._tolerance import tolerance
from kernelab.verify._types import CLASSES, CaseResult, Failure


@dataclass
class Subject:
    """What is verified: a callable under a name, called as ``fn(**inputs)``."""

    name: str
    fn: Callable
    prepare: Callable[[dict], dict] | None = None
    #: ``supports(shape)``: None, or why the subject leaves the shape out (the case is skipped).
    supports: Callable | None = None
    #: Whether it runs through an interpreter on CPU (a Triton or Pallas variant); None:
    #: unknown (a user's candidate), found by counting interpreted launches.
    interpreted: bool | None = None


def derive_seed(seed: int, *parts) -> int:
    """A seed for one trial, stable across runs and platforms for the same run seed."""
    return (int(seed) * 1_000_003 + zlib.crc32(repr(parts).encode())) % (2**31 - 1)


def accepts(fn: Callable, name) -> bool:
    """Whether ``fn`` takes keyword argument ``name`` (or every name of a tuple of names)."""
    if not name:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return True
    names = (name,) if isinstance(name, str) else tuple(name)
    return all(n in params for n in names)


def out_kwargs(out_arg, views: list) -> dict:
    """How preallocated outputs are passed: ``out_arg`` a name (one output: the tensor; several:
    a tuple in ``Op.outputs`` order) or a tuple of names, one per output."""
    if isinstance(out_arg, str):
        return {out_arg: views[0] if len(views) == 1 else tuple(views)}
    names = tuple(out_arg)
    if len(names) != len(views):
        raise ValueError(f"out_arg: expected one name per output ({len(views)}), got {list(names)}")
    return dict(zip(names, views, strict=True))


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def inject_specials(inputs: dict, seed: int, allowed=None) -> str | None:
    """Put a NaN, a +Inf and a −Inf into the largest floating-point input (among ``allowed``
    names, when the op's contract limits them); return its name."""
    floats = [
        (v.numel(), k)
        for k, v in inputs.items()
        if isinstance(v, torch.Tensor)
        and v.is_floating_point()
        and v.numel()
        and (allowed is None or k in allowed)
    ]
    if not floats:
        return None
    _, name = max(floats)
    t = inputs[name]
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randperm(t.numel(), generator=gen)[:3]
    for value, i in zip((float("nan"), float("inf"), float("-inf")), flat.tolist(), strict=False):
        idx = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), t.shape))
        t[idx] = value
    return name


@dataclass
class _Expected:
    specs: list  # (name, shape, dtype, device) per output
    targets: list  # (name, ref, base, (tol, source), eager_error) per output and in-place arg
    regions: dict  # in-place argument -> bool mask of the elements the call may write


def _within(t: torch.Tensor, region: torch.Tensor | None) -> torch.Tensor:
    return t if region is None else t.detach().cpu()[region]


def expected(op, inputs: dict, baseline: Callable | None, dtype, device) -> _Expected:
    ref_out, ref_inplace = op.run_reference(inputs)
    base_out, base_inplace = None, {}
    if baseline is not None:
        base_in = _clone(inputs)
        try:
            with np.errstate(all="ignore"):
                base_out = as_tuple(baseline(**base_in))
            base_inplace = {n: base_in[n] for n in ref_inplace}
        except Exception:  # no baseline here: the tolerance falls back to the floor (and says so)
            base_out, base_inplace = None, {}
    names = list(op.outputs)
    if len(names) != len(ref_out):
        names = [f"out{i}" for i in range(len(ref_out))]
    specs = []
    for i, (name, ref) in enumerate(zip(names, ref_out, strict=True)):
        if base_out is not None and i < len(base_out) and isinstance(base_out[i], torch.Tensor):
            specs.append((name, tuple(base_out[i].shape), base_out[i].dtype, base_out[i].device))
        else:
            out_dtype = dtype if ref.is_floating_point() else ref.dtype
            specs.append((name, tuple(ref.shape), out_dtype, torch.device(device)))
    targets = []
    pairs = [
        (name, ref, base_out[i] if base_out is not None and i < len(base_out) else None)
        for i, (name, ref) in enumerate(zip(names, ref_out, strict=True))
    ]
    pairs += [(n, r, base_inplace.get(n)) for n, r in ref_inplace.items()]
    stored = {spec[0]: spec[2] for spec in specs}
    stored.update({n: inputs[n].dtype for n in ref_inplace if isinstance(inputs[n], torch.Tensor)})
    regions = {n: r for n in ref_inplace if (r := op.contract.region(n, inputs)) is not None}
    for name, ref, base in pairs:
        usable = isinstance(base, torch.Tensor) and tuple(base.shape) == tuple(ref.shape)
        region = regions.get(name)
        eager = error(_within(base, region), _within(ref, region)).rel_l2 if usable else None
        on = inputs if name == names[0] and name not in ref_inplace else None
        tol = tolerance(op.contract, dtype, stored.get(name, dtype), eager, ref, inputs, region, on)
        targets.append((name, ref, base if usable else None, tol, eager))
    return _Expected(specs, targets, regions)


class _Trial:
    """The state of one trial: guarded inputs and outputs, results of each call."""

    def __init__(self, case: CaseResult, op, subject: Subject, device, use_out: bool, trial: int):
        self.case, self.op, self.subject = case, op, subject
        self.device, self.use_out, self.trial = device, use_out, trial
        self.inplace = set(op.contract.inplace)

    def fail(self, failures: list[Failure], call: str) -> None:
        have = {(f.cls, f.target) for f in self.case.failures}
        for f in failures:
            if (f.cls, f.target) not in have:
                f.trial, f.call = self.trial, call
                self.case.failures.append(f)
                have.add((f.cls, f.target))

    def setup(self, inputs: dict, exp: _Expected) -> None:
        self.inputs = inputs
        self.guards = {
            k: _buffers.guard(k, v, around_input=True)
            for k, v in inputs.items()
            if isinstance(v, torch.Tensor)
        }
        self.outs = None
        if self.use_out:
            self.outs = [_buffers.output(n, s, d, dev) for n, s, d, dev in exp.specs]

    def load(self, inputs: dict, names=None) -> None:
        """Write ``inputs``' values into the guarded input buffers (same addresses); only
        those of ``names`` when given."""
        for k, g in self.guards.items():
            if names is None or k in names:
                g.view.copy_(inputs[k])

    def call(self, exp: _Expected, poison: int, label: str):
        """Call the subject; check contract, canaries, inputs. Returns {target: tensor}."""
        if self.outs is not None:
            for o in self.outs:
                _buffers.poison(o.view, poison)
        kwargs = {k: self.guards[k].view if k in self.guards else v for k, v in self.inputs.items()}
        if self.outs is not None:
            kwargs.update(out_kwargs(self.op.out_arg, [o.view for o in self.outs]))
        if self.subject.prepare is not None:
            kwargs = self.subject.prepare(kwargs)
        if self.outs is None:  # freed memory of the outputs' size holds poison, not old results
            _buffers.prime_allocator([spec[1:] for spec in exp.specs], poison)
        try:
            # NaN and Inf inputs are intended: numpy (under the interpreter) need not say so.
            with np.errstate(all="ignore"):
                result = self.subject.fn(**kwargs)
            if torch.device(self.device).type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # the candidate's own failure is a verdict, not a crash
            text = str(exc).splitlines()[0] if str(exc) else ""
            msg = f"the call raised {type(exc).__name__}: {text}"
            # A backend's own verdict (a race, an interpreter error) keeps its class.
            cls = getattr(exc, "failure_class", "contract")
            self.fail([Failure(cls if cls in CLASSES else "contract", "call", msg)], label)
            return None
        got, failures = _checks.contract(result, exp.specs, self.outs)
        guards = list(self.guards.values()) + (self.outs or [])
        failures += _checks.canaries(guards)
        for k, g in self.guards.items():
            if k not in self.inplace:
                failures += _checks.unchanged(k, g.view, self.inputs[k])
            elif k in exp.regions:
                failures += _checks.outside_region(k, g.view, self.inputs[k], exp.regions[k])
        self.fail(failures, label)
        if got is None:
            return None
        results = {
            spec[0]: t.detach().clone()
            for spec, t in zip(exp.specs, got, strict=True)
            if t is not None
        }
        for k in self.inplace:
            if k in self.guards:
                results[k] = self.guards[k].view.detach().clone()
        return results

    def judge(self, exp: _Expected, results: dict, label: str, previous=None):
        """Values and NaN pattern of every target.

        ``previous`` = (expected, results) of the call before new values were written into the
        same buffers: a wrong result bitwise equal to that call's correct one is cached.
        """
        for name, ref, base, tol, eager in exp.targets:
            if name not in results:
                continue
            if name in exp.regions:
                m, failures = _checks.region_values(
                    name, results[name], ref, base, tol, eager, exp.regions[name]
                )
            else:
                m, failures = _checks.values(name, results[name], ref, base, tol, eager)
            self.case.add_measure(m)
            if failures and previous is not None and _stale(name, results[name], *previous):
                failures = [
                    Failure(
                        "cached result",
                        name,
                        "new values written into the same input buffers gave the previous "
                        "call's result, bitwise: it was reused, not computed. "
                        + failures[0].message,
                        failures[0].indices,
                        failures[0].got,
                        failures[0].expected,
                    )
                ]
            self.fail(failures, label)


def _stale(name: str, got: torch.Tensor, prev_exp: _Expected, prev_results: dict) -> bool:
    """Whether ``got`` is bitwise the previous call's result, which was right for its inputs."""
    if name not in prev_results or bool(_checks.differs(got, prev_results[name]).any()):
        return False
    region = prev_exp.regions.get(name)
    for target, ref, _, (tol, _source), _ in prev_exp.targets:
        if target == name:
            return error(_within(prev_results[name], region), _within(ref, region)).rel_l2 <= tol
    return False


def run_case(
    op,
    subject: Subject,
    shape,
    shape_set: str,
    dtype: torch.dtype,
    device,
    seed: int,
    trials: int,
    baseline: Callable | None,
    dist_offset: int = 0,
    extra: bool = True,
) -> CaseResult:
    """Verify ``subject`` on one shape and dtype (see the module docstring). ``extra``: make
    the partial-update and allocating calls too (a caller may take them on one dtype of a
    shape only, for a subject that runs through an interpreter)."""
    started = time.perf_counter()
    case = CaseResult(
        op.name, subject.name, shape_set, shape.label, shape.key, str(dtype).removeprefix("torch.")
    )
    use_out = accepts(subject.fn, op.out_arg) and subject.prepare is None
    if not use_out:
        case.notes.append(
            "no out= argument: outputs were allocated by the candidate, so they could not be "
            "poisoned or guarded by canaries (inputs and in-place arguments still are)"
        )
    trial, previous, partial_done = None, None, False
    for t in range(trials + (1 if trials == 1 else 0)):
        dists = distributions_of(op)
        dist = dists[(dist_offset + t) % len(dists)]
        tseed = derive_seed(seed, op.name, shape.key, str(dtype), t)
        inputs = op.inputs(shape, dtype, device, seed=tseed, dist=dist)
        special = getattr(op.contract, "special_inputs", None)
        where = inject_specials(inputs, tseed, special) if t == trials - 1 else None
        case.trials.append({"seed": tseed, "dist": dist, "specials": where})
        exp = expected(op, inputs, baseline, dtype, device)
        if trial is None:
            trial = _Trial(case, op, subject, device, use_out, len(case.trials) - 1)
            trial.setup(inputs, exp)
            first = trial.call(exp, 0, "first")
            if first is None:
                break
            trial.judge(exp, first, "first")
            trial.load(inputs)
            second = trial.call(exp, 1, "repeat")
            if second is None:
                break
            _compare_calls(trial, op, exp, first, second)
            previous = (exp, second)
        else:
            # New values in the same buffers (same addresses): the result must follow them.
            trial.trial, trial.inputs = len(case.trials) - 1, inputs
            trial.load(inputs)
            got = trial.call(exp, t % 2, "new values")
            if got is None:
                break
            trial.judge(exp, got, "new values", previous=previous)
            previous = (exp, got)
        if extra and not partial_done and where is None and not case.failures:
            # from inputs without NaN/Inf, so that every changed element moves some output
            partial_done = True
            previous = _partial_and_allocating(
                case, op, subject, device, trial, exp, inputs, shape, dtype, tseed, baseline,
                dist,
            ) or previous  # fmt: skip
    case.seconds = time.perf_counter() - started
    return case


PARTIAL_EVERY = 4096  # elements of each changed input per changed element (at least one)


def partial_update(op, inputs: dict, fresh: dict, seed: int) -> tuple[dict, dict]:
    """``inputs`` with a few random elements of each data input (``changeable``) taken from
    ``fresh`` (another draw of the same op and shape). Returns (new inputs, {name: indices}).

    Few elements of each: any cache that does not look at every element of its data misses
    the change with high probability (a cache sampling s of an input's n elements sees a
    change with probability about s / PARTIAL_EVERY, or s / n for small tensors), and the
    outputs that depend on those elements must follow.
    """
    gen = torch.Generator().manual_seed(seed)
    new, where = dict(inputs), {}
    for name in changeable(op, inputs):
        v, f = inputs[name], fresh.get(name)
        if not isinstance(f, torch.Tensor) or (f.shape, f.dtype) != (v.shape, v.dtype):
            continue  # another draw with another layout: nothing to take element by element
        n = max(1, v.numel() // PARTIAL_EVERY)
        flat = torch.randperm(v.numel(), generator=gen)[:n]
        idx = tuple(i.to(v.device) for i in torch.unravel_index(flat, v.shape))
        new[name] = v.clone()
        new[name][idx] = f[idx]
        where[name] = idx
    return new, where


def _changed_mask(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor | None:
    """Elements of a float64 reference that moved (NaN compared by bits)."""
    if new.shape != old.shape or not new.numel():
        return None
    moved = _checks.differs(new, old)
    return moved if bool(moved.any()) else None


def _norm(t: torch.Tensor) -> float:
    t = t.to(torch.float64)
    t = t[torch.isfinite(t)]
    return float(t.norm()) if t.numel() else 0.0


def _judge_changed(trial: _Trial, exp: _Expected, prev: _Expected, results: dict, label: str):
    """``judge``, plus a stale-result check on the elements whose reference moved since
    ``prev``: there the result must be nearer the new reference than the old one, unless it
    is as near the new one as eager torch in the same dtype (k times its error) or within the
    tolerance relative to those elements. A reused result fails this however few the
    elements are; an honest one does not, since the change exceeds its rounding."""
    trial.judge(exp, results, label)
    before = {name: ref for name, ref, *_ in prev.targets}
    k = getattr(trial.op.contract, "k", 2.0)
    for name, ref, base, (tol, _source), _eager in exp.targets:
        if name not in results or name not in before:
            continue
        moved = _changed_mask(ref, before[name])
        if moved is None:
            continue
        if name in exp.regions:
            moved = moved & exp.regions[name]
        if not bool(moved.any()):
            continue
        # the moved elements are taken first, then widened: the whole tensor is not copied
        got = results[name].detach().cpu()[moved].to(torch.float64)
        new, old = ref[moved].to(torch.float64), before[name][moved].to(torch.float64)
        d_new, d_old = _norm(got - new), _norm(got - old)
        allowed = tol * _norm(new)
        if base is not None and tuple(base.shape) == tuple(ref.shape):
            allowed = max(allowed, k * _norm(base.detach().cpu()[moved].to(torch.float64) - new))
        if d_new <= allowed or d_old >= d_new:
            continue
        indices, g, e = _buffers.first(moved, results[name], ref)
        trial.fail(
            [
                Failure(
                    "cached result",
                    name,
                    f"after {label}, the {int(moved.sum())} element(s) whose reference changed "
                    f"are nearer the previous reference (distance {d_old:.3e}) than the new "
                    f"one ({d_new:.3e}, allowed {allowed:.3e}): the result was reused, not "
                    "recomputed",
                    indices,
                    g,
                    e,
                )
            ],
            label,
        )


def distributions_of(op) -> tuple[str, ...]:
    """The distributions an op's trials rotate through: those its contract adds, then every
    op's. Added ones go first: with the default two trials a case draws two consecutive
    entries, the second with NaN and Inf planted, and a distribution at an even index lands
    on the clean first trial (after the five common ones, an added sixth was always the one
    whose rows the planted values could cover)."""
    return tuple(getattr(op.contract, "distributions", ())) + DISTRIBUTIONS


def _partial_and_allocating(case, op, subject, device, trial, exp, inputs, shape, dtype, seed,
                            baseline, dist):  # fmt: skip
    """The partial-update call in the same buffers, then the allocating call (module doc)."""
    pseed = derive_seed(seed, op.name, shape.key, str(dtype), "partial")
    # values from another distribution: a changed element moves by more than rounding
    dists = distributions_of(op)
    other = dists[(dists.index(dist) + 1) % len(dists)]
    fresh = op.inputs(shape, dtype, device, seed=pseed, dist=other)
    new, where = partial_update(op, inputs, fresh, pseed)
    if not where:
        return None
    t = len(case.trials)
    case.trials.append(
        {"seed": pseed, "dist": f"{dist}, changed from {other}", "specials": None,
         "kind": "partial update",
         "changed": {k: int(new[k][i].numel()) for k, i in where.items()}}
    )  # fmt: skip
    exp_new = expected(op, new, baseline, dtype, device)
    trial.trial, trial.inputs = t, new
    # restore the in-place arguments only: the rest already holds these values, and a
    # prepared parameter is not written at all (its version counter does not move)
    trial.load(inputs, op.contract.inplace)
    for name, idx in where.items():
        if name in trial.guards:
            trial.guards[name].view[idx] = new[name][idx]  # a few elements, in place
    got = trial.call(exp_new, 1, "partial update")
    if got is None:
        return None
    _judge_changed(trial, exp_new, exp, got, "a partial update in place")
    after = (exp_new, got)
    case.trials.append(
        {"seed": pseed, "dist": f"{dist}, changed from {other}", "specials": None,
         "kind": "allocating",
         "changed": {k: int(new[k][i].numel()) for k, i in where.items()}}
    )  # fmt: skip
    alloc = _Trial(case, op, subject, device, False, t + 1)
    alloc.setup({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in new.items()},
                exp_new)  # fmt: skip
    fresh_got = alloc.call(exp_new, 0, "allocating")
    if fresh_got is not None:
        _judge_changed(alloc, exp_new, exp, fresh_got, "fresh allocations, no out=")
    return after


def _compare_calls(trial: _Trial, op, exp: _Expected, first: dict, second: dict) -> None:
    failures = []
    outputs = {spec[0] for spec in exp.specs}
    for name, ref, *_ in exp.targets:
        if name not in first or name not in second:
            continue
        a, b = first[name], second[name]
        never = torch.zeros(a.shape, dtype=torch.bool)
        if trial.outs is not None and name in outputs:
            never = _checks.unwritten(name, a, b)
            if bool(never.any()):
                failures.append(_checks.unwritten_failure(name, never, b, ref))
        diff = _checks.differs(a, b) & ~never
        if bool(diff.any()) and not op.contract.nondeterministic:
            indices, got, exp_values = _buffers.first(diff, b, a)
            failures.append(
                Failure(
                    "nondeterministic",
                    name,
                    f"{int(diff.sum())} element(s) differ bitwise between two calls on the same "
                    "inputs with different output poisons (a race, or a read of the output "
                    "buffer or other uninitialised memory); shown: second call, expected = first",
                    indices,
                    got,
                    exp_values,
                )
            )
    trial.fail(failures, "repeat")
    if op.contract.nondeterministic:
        trial.judge(exp, second, "repeat")
