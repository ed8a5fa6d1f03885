"""verify: the correctness harness (METHOD.md, "Correct first").

For each op × variant × shape × dtype, several trials with fresh inputs from the distributions
of ``kernelab.core.runtime.inputs.DISTRIBUTIONS`` (the last trial also holds a NaN, a +Inf and
a −Inf),
each seed derived from one run seed that is printed and can be given back with ``seed=``:

- float64 reference on the CPU on the same inputs; relative L2, max absolute and relative
  error, and the worst element, for every output and every in-place argument;
- tolerance ``max(k × eager-torch error, floor)`` from the op's ``Contract`` (or the
  contract's fixed value); for bfloat16/float16 targets of an op that declares its reduction,
  derived from the case instead (``_tolerance``: the reference's own rounding, the declared
  narrowings, the reduction length), so that one more rounding of partial results fails;
  reported with where it came from;
- outputs passed as ``out=`` views into larger buffers, canaries on both sides and in gaps;
  poisoned before the call (NaN, sentinels for integers) and again with a different poison on
  a second call at the same addresses: unwritten elements and bitwise nondeterminism;
- inputs copied into canary-guarded buffers (NaN canaries reveal out-of-bounds reads), and
  bitwise unchanged afterwards, except the contract's in-place arguments, which must match the
  reference's in-place result (only within the region the contract declares for one, every
  element outside it bitwise unchanged);
- NaN/Inf pattern equal to the reference's (as stored in the output's dtype);
- the output contract: a plain ``torch.Tensor`` of the expected shape, dtype and device, the
  ``out=`` buffer when one was passed;
- later calls with new values in the same buffers: a wrong result equal to the previous one
  is a cached result;
- ``audit()``: null candidates that each op's checks must reject.

Failure classes (``CLASSES``): contract, out-of-bounds write, mutated input, wrote outside its
in-place region (an in-place argument with a declared region changed outside it), unwritten
elements, nondeterministic, cached result, NaN mismatch, wrong values. The JSON form of a
``Report`` (``Report.as_dict()``, ``kernelab verify --json``) is documented in docs/verify.md.

On CPU, Triton variants run through the interpreter and batch sizes are capped (4 rows for
representative shapes, 32 for the others; labels show ``[rows→4]``); the ``compile`` variant
runs only when asked for by name.
"""

from kernelab.verify._audit import NULLS, audit
from kernelab.verify._custom import user_op, verify_custom
from kernelab.verify._record import ledger_cases, run_provenance
from kernelab.verify._runner import DEFAULT_TRIALS, new_seed, verify, verify_candidate
from kernelab.verify._stage import stage
from kernelab.verify._types import CLASSES, AuditEntry, CaseResult, Failure, Measure, Report

__all__ = [
    "CLASSES",
    "DEFAULT_TRIALS",
    "NULLS",
    "AuditEntry",
    "CaseResult",
    "Failure",
    "Measure",
    "Report",
    "audit",
    "ledger_cases",
    "new_seed",
    "run_provenance",
    "stage",
    "user_op",
    "verify",
    "verify_candidate",
    "verify_custom",
]
