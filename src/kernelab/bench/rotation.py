"""Rotating input sets in the timed loop: caches keyed on version counters or sampled elements.

The fresh-input checks after the timed loop write new values with ``copy_``, which bumps the
tensors' version counters and rewrites every element: a cache keyed on (address, version) or
on (address, a few sampled elements) recomputes there, and hits in the timed loop, where the
inputs never change. So the timed loop itself changes them, outside the timed window:

- every sample runs on the next *state* of a cycle; a *slot* is one set of buffers, each with
  two states whose contents differ in a random ``PARTIAL_FRACTION`` of the elements (at
  least one) of every input the op declares as data (``Contract.data_inputs``; by default
  every floating-point input), the new values taken from another draw of the op's own
  inputs. Prepared parameters (a quantized weight and its scales, a per-tensor scale, a
  rotary table) keep their values, so a state is always an input set the op can be called
  with, and its reference is computed on exactly the values the slot holds. A state is
  written through ``.data``: the address stays, the version counter does not move, and a
  few sampled positions rarely see the change;
- slot 0 is the subject's own buffers; in cold mode further slots at new addresses, holding
  another seed's values, are added while all of them fit in ``ROTATION_BYTES`` (hot mode keeps
  one slot: a second address would make its samples cold);
- the last output of a random subset of samples is copied (outside the timed window) with the
  state it was computed from, and checked after the loop against that state's reference.

In-place arguments are restored whole before each call (the call writes them), with the
values of the state. A subject's ``prepare`` (packing, transposition) is applied to every
state; where the prepared forms of two states differ in a way that cannot be written into the
same buffers (a shape or dtype that changes, a value that is not a tensor), the slot keeps one
state only, so that no output is ever checked against a reference of values it did not see.
"""

from __future__ import annotations

import random
import time

import torch

from kernelab.bench import integrity
from kernelab.bench.cache import tensor_bytes
from kernelab.numerics import bits
from kernelab.ops._model import changeable

#: Fraction of each data input's elements that differ between a slot's two states.
PARTIAL_FRACTION = 0.01
#: Extra input sets (new addresses) are added only while all of them fit in this many bytes.
ROTATION_BYTES = 64 * 2**20
MAX_SLOTS = 3
#: Each sample's output is kept for checking with this probability, at most MAX_CHECKS kept
#: (a uniform sample of the loop's samples: reservoir sampling) and CHECK_BYTES of copies.
#: A cache that hits on some visits only is caught with the probability that a kept output
#: is one of them: every output is a candidate for the reservoir.
CHECK_P = 1.0
MAX_CHECKS = 32
CHECK_BYTES = 64 * 2**20
FLAG = "results cached by version counter or sampled elements"


def partial(
    inputs: dict,
    other: dict,
    names,
    gen: torch.Generator,
    fraction: float = PARTIAL_FRACTION,
) -> dict:
    """A copy of ``inputs`` with a random ``fraction`` of the elements (at least one) of each
    tensor in ``names`` taken from ``other`` (the same op's inputs for another seed); a
    0-dim tensor is one element. Every other input is ``inputs``' own object."""
    out = dict(inputs)
    for name in names:
        t, o = inputs.get(name), other.get(name)
        if not isinstance(t, torch.Tensor) or not isinstance(o, torch.Tensor):
            continue
        if o.shape != t.shape or o.dtype != t.dtype:
            continue  # another draw with another layout: nothing to take element by element
        if t.is_complex() or not t.numel():
            continue
        flat = torch.rand(t.numel(), generator=gen) < fraction
        flat[torch.randint(t.numel(), (1,), generator=gen)] = True
        mask = flat.reshape(t.shape).to(t.device)
        out[name] = torch.where(mask, bits(o), bits(t)).view(t.dtype)  # any format, by bits
    return out


def _as_1d_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a 0-dim tensor as a one-element view of its storage (indexable)."""
    return t if t.dim() else t.unsqueeze(0)


def _differences(a: dict, b: dict) -> tuple[dict, list[str]]:
    """Per tensor of ``a``: (indices, ``a``'s values, ``b``'s values) where ``b`` differs
    bitwise (a 0-dim tensor as one element); and the arguments whose difference cannot be
    written into ``a``'s buffers (a shape, dtype or device that changes, a non-tensor)."""
    diffs, unwritable = {}, []
    for n in {**a, **b}:
        t, u = a.get(n), b.get(n)
        both = isinstance(t, torch.Tensor) and isinstance(u, torch.Tensor)
        if not both or (u.shape, u.dtype, u.device) != (t.shape, t.dtype, t.device):
            if not _same(t, u):
                unwritable.append(n)
            continue
        t1, u1 = _as_1d_view(t), _as_1d_view(u)
        idx = (bits(t1) != bits(u1)).nonzero(as_tuple=True)
        if idx[0].numel():
            diffs[n] = (idx, t1[idx].clone(), u1[idx].clone())
    return diffs, unwritable


def _same(x, y) -> bool:
    """Whether two argument values that cannot be compared element by element are the same."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return x is y
    try:
        return x is y or bool(x == y)
    except Exception:  # a value without a truthful ==
        return False


class _State:
    """One content of a slot: the values that differ from the slot's other state."""

    def __init__(self, slot: int, index: int, ref, writes: dict):
        self.slot, self.index, self.ref, self.writes = slot, index, ref, writes

    @property
    def label(self) -> str:
        how = "its own buffers" if self.slot == 0 else f"input set {self.slot}, new addresses"
        return f"{how}, {'partial update' if self.index else 'as written'}"


class Rotation:
    """The states one subject cycles through in its timed loop (see the module docstring)."""

    def __init__(self, slots: list[dict], states: list[_State], inplace, pristine, seed: int):
        self.slots, self.states = slots, states
        self.inplace, self.pristine = inplace, pristine  # per slot: in-place args before a call
        self.pos = -1
        #: the slots' tensors through .data (0-dim ones as one-element views): writes that
        #: leave the version counters alone
        self.alias = [
            {n: _as_1d_view(t.data) for n, t in a.items() if isinstance(t, torch.Tensor)}
            for a in slots
        ]
        #: why a slot keeps one state only (its prepared states cannot share buffers)
        self.notes: list[str] = []
        self.spent = 0.0  # seconds in advance() and keep(), left out of the stopping rule's
        self.rng = random.Random(seed)
        self.seen = 0
        self.room = 0  # copies kept at most, from the size of the first
        self.kept: list[tuple[_State, tuple, dict]] = []
        self.checked = 0  # timed outputs checked, and the states they were computed from
        self.checked_states: set = set()

    def summary(self) -> dict:
        """What the rotation did, for the case's metrics: input sets (slots), states, the
        elements a partial update changed, the timed outputs checked and their states."""
        partial = [s for s in self.states if s.index]
        return {
            "input_sets": len(self.slots),
            "states": len(self.states),
            "changed_elements": sum(i[0].numel() for s in partial for i, _ in s.writes.values()),
            "changed_inputs": sorted({n for s in partial for n in s.writes}),
            "checked_outputs": self.checked,
            "checked_states": len(self.checked_states),
        }

    @property
    def current(self) -> _State:
        return self.states[max(self.pos, 0)]

    @property
    def args(self) -> dict:
        return self.slots[self.current.slot]

    def advance(self) -> dict:
        """Write the next state into its slot (outside the timed window); its arguments."""
        t0 = time.perf_counter()
        self.pos = (self.pos + 1) % len(self.states)
        state = self.current
        args, alias = self.slots[state.slot], self.alias[state.slot]
        for n in self.inplace:
            args[n].copy_(self.pristine[state.slot][n])
        for n, (idx, values) in state.writes.items():
            alias[n].index_put_(idx, values)  # through .data: the version stays
        self.spent += time.perf_counter() - t0
        return args

    def keep(self, result) -> None:
        """Maybe keep a copy of this sample's output and in-place arguments, for :meth:`check`
        (nothing is copied for a sample the reservoir passes over)."""
        t0 = time.perf_counter()
        try:
            self._keep(result)
        finally:
            self.spent += time.perf_counter() - t0

    def _keep(self, result) -> None:
        self.seen += 1
        if self.rng.random() >= CHECK_P:
            return
        if not self.room:
            size = sum(t.numel() * t.element_size() for t in integrity.as_tuple(result)
                       if isinstance(t, torch.Tensor))  # fmt: skip
            self.room = max(2, min(MAX_CHECKS, CHECK_BYTES // max(1, size)))
        j = len(self.kept) if len(self.kept) < self.room else self.rng.randrange(self.seen)
        if j >= self.room or integrity.not_plain(result):
            return
        if j == len(self.kept):
            self.kept.append(self._item(result))
        else:
            self.kept[j] = self._item(result)

    def check(self, result, call) -> tuple[str | None, str | None]:
        """(wrong output, cached) flags from the kept outputs and ``result``, the loop's last
        output, each against the reference of the state it was computed from. Wrong on the
        subject's own inputs as written is a wrong output; wrong only on the other states, a
        cache. Without a kept output on the first state, ``call`` is made on it once more."""
        items = [*self.kept, self._item(result)]
        self.kept = []
        self.checked += len(items)
        self.checked_states |= {(state.slot, state.index) for state, _, _ in items}
        wrong = [(state, state.ref.check(r, args)) for state, r, args in items]
        base = [w for state, w in wrong if state.slot == state.index == 0]
        other = [(state, w) for state, w in wrong if w and (state.slot or state.index)]
        if other and not base:
            args = self.reset()
            base = [self.current.ref.check(call(), args)]
        bad_base = [w for w in base if w]
        if bad_base:
            return f"wrong output of timed calls: {bad_base[0]}", None
        if not other:
            return None, None
        state, why = other[0]
        return None, (
            f"{FLAG}: {len(other)} of {len(items)} checked timed outputs wrong for the inputs "
            f"they were computed from ({state.label}): {why}"
        )

    def _item(self, result) -> tuple:
        args = {n: self.args[n].clone() for n in self.inplace}
        return self.current, integrity.snapshot(result), args

    def reset(self) -> dict:
        """Slot 0 back to its first state (the subject's own inputs, as written)."""
        self.pos = -1
        return self.advance()


def build(op, shape, dtype, device, inputs, ref, runs, seed: int, cold: bool):
    """One :class:`Rotation` per run (its ``subject`` and ``args``); ``inputs`` are the
    case's inputs and ``ref`` their reference."""
    gen = torch.Generator().manual_seed(seed + 7919)
    set_bytes = max(1, tensor_bytes(inputs))
    n_slots = 1
    if cold:
        n_slots = max(1, min(MAX_SLOTS, ROTATION_BYTES // (set_bytes * max(1, len(runs)))))
    names = changeable(op, inputs)
    contents = [(inputs, ref)]
    for s in range(1, n_slots):
        fresh = op.inputs(shape, dtype, device, seed=seed + 100 + s)
        contents.append((fresh, integrity.Reference.build(op, fresh, dtype)))
    states_in = []  # per slot: (first inputs, first ref, partial inputs, partial ref)
    for s, (first, first_ref) in enumerate(contents):
        other = op.inputs(shape, dtype, device, seed=seed + 200 + s)
        second = partial(first, other, names, gen)
        states_in.append((first, first_ref, second, integrity.Reference.build(op, second, dtype)))
    inplace = [n for n in op.contract.inplace if isinstance(inputs.get(n), torch.Tensor)]
    out = []
    for run in runs:
        prep = run.subject.prepare
        slots, states, pristine, notes = [], [], [], []
        for s, (first, first_ref, second, second_ref) in enumerate(states_in):
            a = run.args if s == 0 else prep(integrity.clone_inputs(first)) if prep else None
            if a is None:
                a = integrity.clone_inputs(first)
            b = prep(integrity.clone_inputs(second)) if prep else second
            slots.append(a)
            pristine.append({n: a[n].clone() for n in inplace})
            diffs, unwritable = _differences(a, b)
            states.append(_State(s, 0, first_ref, {n: (i, x) for n, (i, x, _) in diffs.items()}))
            if unwritable:
                notes.append(
                    f"input set {s}: no partial update ({run.subject.name}'s prepared "
                    f"{unwritable} cannot take it in the same buffers)"
                )
                continue
            states.append(_State(s, 1, second_ref, {n: (i, y) for n, (i, _, y) in diffs.items()}))
        rot = Rotation(slots, states, inplace, pristine, seed)
        rot.notes = notes
        out.append(rot)
    return out
