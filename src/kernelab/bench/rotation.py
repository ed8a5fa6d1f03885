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
- in cold mode the slots are also copied to new addresses until the copies hold twice the
  last-level cache (:func:`kernelab.bench.cache.copies_for_cold`): the samples visit the
  copies in a shuffled order, each copy in one of its slot's states, moved to the next state
  after its visit (outside the timed window, a whole cycle before its next use, by then
  evicted): every sample reads inputs that are not in the cache, with no flush;
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
from kernelab.bench.cache import copies_for_cold, replicate, tensor_bytes
from kernelab.core import changeable
from kernelab.numerics import bits

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
        how = "its own values" if self.slot == 0 else f"input set {self.slot}"
        return f"{how}, {'partial update' if self.index else 'as written'}"


class _Copy:
    """One place a subject's arguments live: the slot's own buffers or a copy of them at new
    addresses (cold mode); it holds one of its slot's states at a time."""

    __slots__ = ("alias", "args", "held", "slot")

    def __init__(self, slot: int, args: dict, held: int = 0):
        self.slot, self.args, self.held = slot, args, held
        #: through .data (0-dim tensors as one-element views): writes that leave the version
        #: counters alone
        self.alias = {
            n: _as_1d_view(t.data) for n, t in args.items() if isinstance(t, torch.Tensor)
        }


class Places:
    """Where the subjects that take the same arguments live: the slots' buffers and, in cold
    mode, copies of them at new addresses, each copy holding one of its slot's states; one
    cycle through them shared by those subjects, so that between two visits of a copy all the
    others were read, whichever subject read them.

    The copies are visited in a fixed shuffled order (slot 0's own buffers first) in which the
    states alternate, so that no copy follows its neighbour in memory and consecutive samples
    read different states; after its visit a copy moves to its slot's next state, outside the
    timed window and a whole cycle before it is used again. Slot 0's own buffers are written
    right before each use instead: subjects with different prepared forms may still share
    some of them (in hot mode, the only place, every sample then writes its state first, as it
    must)."""

    def __init__(self, slots: list[dict], states: list[_State], inplace, pristine, seed: int):
        self.slots, self.states = slots, states
        self.inplace, self.pristine = inplace, pristine  # per slot: in-place args before a call
        self.of_slot = [[s for s in states if s.slot == k] for k in range(len(slots))]
        self.copies = [_Copy(k, a) for k, a in enumerate(slots)]
        self.order = list(range(len(self.copies)))
        self.rng = random.Random(seed)
        self.pos = -1
        #: why a slot keeps one state only (its prepared states cannot share buffers)
        self.notes: list[str] = []

    def spread(self, total: int) -> None:
        """Copies of the slots at new addresses, ``total`` places in all with the slots' own
        buffers, visited in a shuffled order (slot 0's buffers first). Copy j of a slot starts
        in its state j mod (its states), so that both states of every slot are met from the
        first cycle; the order takes the two starting states in turn, so that even a loop of
        three samples checks outputs of both (a loop that stops early on a slow host)."""
        extra = max(0, total - len(self.slots))
        n = len(self.slots)
        for k in range(n):
            count = extra // n + (k < extra % n)
            for j, args in enumerate(replicate(self.slots[k], count), start=1):
                c = _Copy(k, args)
                if j % len(self.of_slot[k]):
                    self._write(c, j % len(self.of_slot[k]))
                self.copies.append(c)
        # shuffled within each starting state, then the states taken in turn: consecutive
        # samples meet different states (as far as their counts allow), however few they are
        by_state: list[list[int]] = [[], []]
        for i in range(1, len(self.copies)):
            by_state[min(self.copies[i].held, 1)].append(i)
        for group in by_state:
            self.rng.shuffle(group)
        first, then = by_state[1], by_state[0]  # copy 0 (the subject's own) is in state 0
        turns = [i for pair in zip(first, then, strict=False) for i in pair]
        self.order = [0, *turns, *first[len(then) :], *then[len(first) :]]

    def state(self, c: _Copy) -> _State:
        return self.of_slot[c.slot][c.held]

    def _write(self, c: _Copy, held: int) -> None:
        """``c`` to its slot's state ``held``: in-place arguments restored whole, then the
        state's values written."""
        c.held = held
        for n in self.inplace:
            c.args[n].copy_(self.pristine[c.slot][n])
        for n, (idx, values) in self.of_slot[c.slot][held].writes.items():
            c.alias[n].index_put_(idx, values)  # through .data: the version stays

    def next(self) -> _Copy:
        """The copy used last to its next state, then the next copy, ready for a call."""
        own = self.copies[0]
        if self.pos >= 0:
            c = self.copies[self.order[self.pos % len(self.copies)]]
            held = (c.held + 1) % len(self.of_slot[c.slot])
            if c is own:
                c.held = held  # written right before its next use (below)
            else:
                self._write(c, held)
        self.pos += 1
        c = self.copies[self.order[self.pos % len(self.copies)]]
        if c is own:
            self._write(c, c.held)
        return c

    def first(self) -> _Copy:
        """Slot 0's own buffers in their first state (the inputs as written); the cycle goes
        on from where it was."""
        own = self.copies[0]
        self._write(own, 0)
        return own


class Rotation:
    """One subject's timed loop over :class:`Places` (see the module docstring): the copy each
    sample used, and the outputs kept to be checked against its state's reference."""

    def __init__(self, places: Places, seed: int):
        self.places = places
        self._at: _Copy = places.copies[0]
        self.rng = random.Random(seed)
        self.spent = 0.0  # seconds in advance() and keep(), left out of the stopping rule's
        self.seen = 0
        self.room = 0  # copies kept at most, from the size of the first
        self.kept: list[tuple[_State, tuple, dict]] = []
        self.checked = 0  # timed outputs checked, and the states they were computed from
        self.checked_states: set = set()

    @property
    def slots(self) -> list[dict]:
        return self.places.slots

    @property
    def notes(self) -> list[str]:
        """Why a slot keeps one state only (its places')."""
        return self.places.notes

    @property
    def states(self) -> list[_State]:
        return self.places.states

    @property
    def copies(self) -> list[_Copy]:
        return self.places.copies

    @property
    def inplace(self) -> list[str]:
        return self.places.inplace

    def summary(self) -> dict:
        """What the rotation did, for the case's metrics: input sets (slots), the copies of
        them the samples rotate through (shared with the subjects that take the same
        arguments), states, the elements a partial update changed, the timed outputs checked
        and their states."""
        partial = [s for s in self.states if s.index]
        return {
            "input_sets": len(self.slots),
            "copies": len(self.copies),
            "states": len(self.states),
            "changed_elements": sum(i[0].numel() for s in partial for i, _ in s.writes.values()),
            "changed_inputs": sorted({n for s in partial for n in s.writes}),
            "checked_outputs": self.checked,
            "checked_states": len(self.checked_states),
        }

    def held_bytes(self) -> int:
        """Bytes of arguments its places hold: the slots and their copies (each copy holds
        what its slot does; a copy's views share one block per argument)."""
        per_slot = [tensor_bytes(a) for a in self.slots]
        return sum(per_slot[c.slot] for c in self.copies)

    @property
    def current(self) -> _State:
        return self.places.state(self._at)

    @property
    def args(self) -> dict:
        return self._at.args

    def advance(self) -> dict:
        """The next place's arguments in its state (outside the timed window)."""
        t0 = time.perf_counter()
        self._at = self.places.next()
        self.spent += time.perf_counter() - t0
        return self.args

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

    def check(self, result) -> tuple[str | None, str | None]:
        """(wrong output, cached) flags from the kept outputs and ``result``, the loop's last
        output, each against the reference of the state it was computed from. A wrong output
        that is right for another state of the rotation is a result of earlier inputs: a
        cache; one right for none, a wrong output (which wins when there are both)."""
        items = [*self.kept, self._item(result)]
        self.kept = []
        self.checked += len(items)
        self.checked_states |= {(state.slot, state.index) for state, _, _ in items}
        stale, wrong = [], []
        for state, r, args in items:
            why = state.ref.check(r, args)
            if why is None:
                continue
            earlier = any(o is not state and o.ref.check(r, args) is None for o in self.states)
            (stale if earlier else wrong).append((state, why))
        if wrong:
            return f"wrong output of timed calls: {wrong[0][1]}", None
        if not stale:
            return None, None
        state, why = stale[0]
        return None, (
            f"{FLAG}: {len(stale)} of {len(items)} checked timed outputs wrong for the inputs "
            f"they were computed from and right for other inputs of the rotation "
            f"({state.label}): {why}"
        )

    def _item(self, result) -> tuple:
        args = {n: self.args[n].clone() for n in self.inplace}
        return self.current, integrity.snapshot(result), args

    def reset(self) -> dict:
        """The subject's own buffers back to their first state (its inputs, as written)."""
        t0 = time.perf_counter()
        self._at = self.places.first()
        self.spent += time.perf_counter() - t0
        return self.args


def build(op, shape, dtype, device, inputs, ref, runs, seed: int, cold: bool, cache_size: int = 0):
    """One :class:`Rotation` per run (its ``subject`` and ``args``); ``inputs`` are the
    case's inputs and ``ref`` their reference. With a ``cache_size`` (cold mode), the slots
    are copied to new addresses until each :class:`Places` holds twice the cache
    (:func:`cache.copies_for_cold`; none where a flush must do instead), the copies of a slot
    starting in its two states alternately. Runs called on the same arguments (no prepared
    form) share one :class:`Places`: one set of copies, one cycle."""
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
    shared: dict[int, Places] = {}  # subjects called on the case's own arguments share places
    out = []
    for run in runs:
        prep = run.subject.prepare
        key = id(run.args)
        if key in shared:
            out.append(Rotation(shared[key], seed))
            continue
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
        places = Places(slots, states, inplace, pristine, seed)
        places.notes = notes
        if prep is None:
            shared[key] = places
        out.append(Rotation(places, seed))
    groups = list({id(r.places): r.places for r in out}.values())
    if cache_size:
        each = [tensor_bytes(p.slots[0]) for p in groups]
        copies = copies_for_cold(each, cache_size, device)
        for p in groups:
            p.spread(copies or 1)
    return out
