"""Rotating input sets in the timed loop: caches keyed on version counters or sampled elements.

The fresh-input checks after the timed loop write new values with ``copy_``, which bumps the
tensors' version counters and rewrites every element: a cache keyed on (address, version) or
on (address, a few sampled elements) recomputes there, and hits in the timed loop, where the
inputs never change. So the timed loop itself changes them, outside the timed window:

- every sample runs on the next *state* of a cycle; a *slot* is one set of buffers, each with
  two states whose contents differ in a random ``PARTIAL_FRACTION`` of the elements of every
  floating-point input (values drawn from the op's own inputs for another seed). A state is
  written through ``.data``: the address stays, the version counter does not move, and a few
  sampled positions rarely see the change;
- slot 0 is the subject's own buffers; in cold mode further slots at new addresses, holding
  another seed's values, are added while all of them fit in ``ROTATION_BYTES`` (hot mode keeps
  one slot: a second address would make its samples cold);
- the last output of a random subset of samples is copied (outside the timed window) with the
  state it was computed from, and checked after the loop against that state's reference.

A subject's ``prepare`` (packing, transposition) is applied to every state; an argument whose
prepared form does not keep its shape and dtype between states is left as it is.
"""

from __future__ import annotations

import random
import time

import torch

from kernelab.bench import integrity
from kernelab.bench.cache import tensor_bytes
from kernelab.numerics import bits

#: Fraction of each floating-point input's elements that differ between a slot's two states.
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


def partial(inputs: dict, other: dict, gen: torch.Generator, fraction: float = PARTIAL_FRACTION):
    """A copy of ``inputs`` with a random ``fraction`` of each floating-point tensor's elements
    (at least one) taken from ``other`` (the same op's inputs for another seed)."""
    out = dict(inputs)
    for name, t in inputs.items():
        o = other.get(name)
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
            continue  # integer inputs (indices, slots) keep their values
        if not isinstance(o, torch.Tensor) or o.shape != t.shape:
            continue
        flat = torch.rand(t.numel(), generator=gen) < fraction
        flat[torch.randint(t.numel(), (1,), generator=gen)] = True
        mask = flat.reshape(t.shape).to(t.device)
        out[name] = torch.where(mask, bits(o), bits(t)).view(t.dtype)  # any float format
    return out


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
        #: the slots' tensors through .data: writes that leave the version counters alone
        self.alias = [
            {n: t.data for n, t in a.items() if isinstance(t, torch.Tensor)} for a in slots
        ]
        self.spent = 0.0  # seconds in advance() and keep(), left out of the stopping rule's
        self.rng = random.Random(seed)
        self.seen = 0
        self.room = 0  # copies kept at most, from the size of the first
        self.kept: list[tuple[_State, tuple, dict]] = []

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
    contents = [(inputs, ref)]
    for s in range(1, n_slots):
        fresh = op.inputs(shape, dtype, device, seed=seed + 100 + s)
        contents.append((fresh, integrity.Reference.build(op, fresh, dtype)))
    states_in = []  # per slot: (first inputs, first ref, partial inputs, partial ref)
    for s, (first, first_ref) in enumerate(contents):
        other = op.inputs(shape, dtype, device, seed=seed + 200 + s)
        second = partial(first, other, gen)
        states_in.append((first, first_ref, second, integrity.Reference.build(op, second, dtype)))
    inplace = [n for n in op.contract.inplace if isinstance(inputs.get(n), torch.Tensor)]
    out = []
    for run in runs:
        prep = run.subject.prepare
        slots, states, pristine = [], [], []
        for s, (first, first_ref, second, second_ref) in enumerate(states_in):
            a = run.args if s == 0 else prep(integrity.clone_inputs(first)) if prep else None
            if a is None:
                a = integrity.clone_inputs(first)
            b = prep(integrity.clone_inputs(second)) if prep else second
            slots.append(a)
            pristine.append({n: a[n].clone() for n in inplace})
            writes0, writes1 = {}, {}
            for n, t in a.items():
                u = b.get(n)
                if not isinstance(t, torch.Tensor) or not isinstance(u, torch.Tensor):
                    continue
                if u.shape != t.shape or u.dtype != t.dtype or t.is_complex() or n in inplace:
                    continue
                idx = (bits(t) != bits(u)).nonzero(as_tuple=True)
                if idx and idx[0].numel():
                    writes0[n] = (idx, t[idx].clone())
                    writes1[n] = (idx, u[idx].clone())
            for n in inplace:  # restored whole before each call: the second state's values
                mask = bits(pristine[s][n]) != bits(b[n])
                idx = mask.nonzero(as_tuple=True)
                if idx[0].numel():
                    writes0[n] = (idx, pristine[s][n][idx].clone())
                    writes1[n] = (idx, b[n][idx].clone())
            states.append(_State(s, 0, first_ref, writes0))
            states.append(_State(s, 1, second_ref, writes1))
        out.append(Rotation(slots, states, inplace, pristine, seed))
    return out
