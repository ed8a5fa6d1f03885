"""compare judges a variant against the interleaved reference, round by round.

Synthetic runs built as the bench builds them: every round, each subject takes one batch of
samples, scaled by the machine's state in that round (shared by every subject of the case,
as interleaving makes it) and by the subject's own process-level term; the stopping rule's
view (rel_ci, converged) is computed as the bench computes it.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kernelab import ledger
from kernelab.bench.stats import StopRule, summarize
from kernelab.cli import app
from kernelab.ledger.compare import (
    MIN_ROUNDS,
    compare_runs,
    relative_rounds,
    round_medians,
    round_spread,
)

runner = CliRunner()
SHAPES = ("r1c4096", "r32c4096", "r1c8192")
RULE = StopRule(rel_ci=0.03, min_samples=10, min_time=0.0, max_time=1.0)
PROV = {"device": {"key": "Test CPU|2|8GB"}, "versions": {"torch": "2.13.0+cpu"}}


def make_run(rng, machine=1.0, load=0.1, kernel=1.0, apart=0.0, rounds=25, batch=20, torch=None):
    """One run: a candidate and eager torch per shape, interleaved by rounds.

    ``machine``: the whole process's speed (both subjects); ``load``: log-sd of the machine's
    state from round to round; ``kernel``: the candidate's code (2.0: a planted 2x
    slowdown); ``own``: log-sd of a process-level term of the candidate alone (code placed
    differently in a new process), drawn once per run.
    """
    cases = []
    for si, shape in enumerate(SHAPES):
        states = machine * rng.lognormal(0, load, size=rounds)
        for variant, base in (("candidate:c", 1e-5 * kernel), ("torch", 1.2e-5)):
            base = base * (si + 1)
            samples, batches = [], []
            for k, state in enumerate(states):
                batches.append([k, len(samples)])
                mine = state * rng.lognormal(0, apart) if apart else state
                samples.extend((base * mine * rng.lognormal(0, 0.02, size=batch)).tolist())
            summary = summarize(samples)
            metrics = {**summary.as_dict(), "converged": RULE.converged(summary, 1.0)}
            metrics["batches"] = batches
            cases.append(
                {
                    "op": "rmsnorm",
                    "variant": variant,
                    "shape_key": shape,
                    "dtype": "float32",
                    "device": "cpu",
                    "mode": "cold",
                    "metrics": metrics,
                    "flags": [],
                    "samples": samples,
                }
            )
    prov = dict(PROV, versions={"torch": torch or "2.13.0+cpu"})
    return {"cases": cases, "provenance": prov}


def verdicts(result, variant="candidate:c"):
    return [c.verdict for c in result.cases if c.variant == variant]


def test_round_medians_follow_the_stored_batches():
    case = {"samples": [1.0, 3.0, 2.0, 10.0, 12.0, 5.0], "metrics": {"batches": [[0, 0], [2, 3]]}}
    assert round_medians(case) == {0: 2.0, 2: 10.0}
    ref = {"samples": [1.0, 1.0, 5.0, 5.0], "metrics": {"batches": [[0, 0], [1, 2]]}}
    assert relative_rounds(case, ref) == [2.0]  # round 2 has no reference batch: left out


@pytest.mark.parametrize(
    "batches",
    [None, "0,0", [[0, 0], [1]], [[0, 0], [1, 9]], [[0, 3], [1, 0]], [[0, -1]], [[0, 0.5]]],
)
def test_round_medians_refuse_a_record_that_does_not_fit(batches):
    case = {"samples": [1.0, 2.0, 3.0, 4.0], "metrics": {"batches": batches}}
    assert round_medians(case) == {}


def test_round_spread_is_half_the_p10_p90_ratio():
    assert round_spread([1.0] * 20) == 0.0
    assert round_spread([1.0] * 10 + [1.44] * 10) == pytest.approx(0.2)
    assert round_spread([1.0, 2.0]) == 0.0  # too few rounds to say
    assert MIN_ROUNDS >= 5


def test_identical_code_in_a_slower_process_is_never_called_slower():
    """The whole second process 1.4x slower (the failure seen on a loaded VM): the candidate
    is judged against torch in the same rounds and comes out the same; torch's own cases are
    within the drift of the other groups. No regression, exit status 0."""
    rng = np.random.default_rng(1)
    for i in range(10):
        a = {"id": f"a{i}", **make_run(rng, load=0.15)}
        b = {"id": f"b{i}", **make_run(rng, machine=1.4, load=0.15)}
        result = compare_runs(a, b)
        assert not result.regressions
        assert set(verdicts(result)) <= {"ambiguous", "unreliable"}, verdicts(result)
        converged = {
            c["shape_key"]
            for c in b["cases"] + a["cases"]
            if c["variant"] == "torch" and c["metrics"]["converged"]
        }
        for c in result.cases:  # judged against torch wherever torch converged in both runs
            if c.variant == "candidate:c" and c.basis == "absolute":
                assert c.shape_key not in converged or c.verdict == "unreliable"
        assert set(verdicts(result, "torch")) == {"unreliable"}


def test_a_process_level_term_of_the_candidate_alone_is_unreliable_not_slower():
    """A shift that hits the candidate and not the reference (8-15 %, what a new process can
    do to one code's placement) in runs whose rounds disagree by as much: within the machine
    spread, so unreliable, never slower."""
    rng = np.random.default_rng(2)
    a = make_run(rng, apart=0.12)
    for shift in (1.08, 1.15, 0.87):
        b = make_run(rng, apart=0.12, kernel=shift)
        result = compare_runs({"id": "a", **a}, {"id": "b", **b})
        assert not result.regressions
        got = verdicts(result)
        assert set(got) <= {"unreliable", "ambiguous"}, (shift, got)
        assert "unreliable" in got
        assert all(c.spread >= 0.1 for c in result.cases if c.variant == "candidate:c")


def test_planted_2x_slowdown_is_confirmed_even_when_the_machine_moved():
    rng = np.random.default_rng(3)
    for machine in (1.0, 1.4, 0.7):
        a = {"id": "a", **make_run(rng, load=0.05, apart=0.05)}
        b = {"id": "b", **make_run(rng, machine=machine, load=0.05, apart=0.05, kernel=2.0)}
        result = compare_runs(a, b)
        cand = [c for c in result.cases if c.variant == "candidate:c"]
        assert [c.verdict for c in cand] == ["slower"] * 3, [c.note for c in cand]
        assert {c.basis for c in cand} == {"vs torch"}
        assert all(c.regression and 1.8 < c.ratio < 2.2 for c in cand)
        assert not any(c.regression for c in result.cases if c.variant == "torch")


def test_planted_2x_speedup_is_faster_even_when_the_machine_slowed():
    rng = np.random.default_rng(4)
    a = {"id": "a", **make_run(rng, load=0.15)}
    b = {"id": "b", **make_run(rng, machine=1.5, load=0.15, kernel=0.5)}
    result = compare_runs(a, b)
    assert verdicts(result) == ["faster"] * 3 and not result.regressions
    # absolute times moved only 0.75x; against torch it is 0.5x
    assert all(0.45 < c.ratio < 0.55 for c in result.cases if c.variant == "candidate:c")


def test_a_machine_noisier_than_the_change_makes_even_2x_unreliable():
    """Rounds that disagree by a factor of 4 (p10 to p90): a 2x change is not told."""
    rng = np.random.default_rng(5)
    a = {"id": "a", **make_run(rng, load=0.05)}
    b = make_run(rng, load=0.05, kernel=2.0)
    for c in b["cases"]:  # the candidate's rounds alone swing: the reference cannot cancel it
        if c["variant"] == "candidate:c":
            marks = [s for _, s in c["metrics"]["batches"]] + [len(c["samples"])]
            for k in range(len(marks) - 1):
                f = 3.0 if k % 2 else 0.6
                c["samples"][marks[k] : marks[k + 1]] = [
                    x * f for x in c["samples"][marks[k] : marks[k + 1]]
                ]
    result = compare_runs(a, {"id": "b", **b})
    assert set(verdicts(result)) == {"unreliable"} and not result.regressions


def test_a_different_torch_is_not_a_reference():
    rng = np.random.default_rng(6)
    a = {"id": "a", **make_run(rng)}
    b = {"id": "b", **make_run(rng, kernel=2.0, torch="2.14.0+cpu")}
    result = compare_runs(a, b)
    assert {c.basis for c in result.cases} == {"absolute"}
    assert any("torch differs" in n for n in result.notes)


def test_unconverged_reference_falls_back_to_absolute_and_runs_without_rounds_too():
    rng = np.random.default_rng(7)
    a = make_run(rng)
    b = make_run(rng, kernel=2.0)
    for c in b["cases"]:
        if c["variant"] == "torch":
            c["metrics"]["converged"] = False
    result = compare_runs({"id": "a", **a}, {"id": "b", **b})
    assert {c.basis for c in result.cases if c.variant == "candidate:c"} == {"absolute"}
    assert verdicts(result) == ["slower"] * 3  # 2x still beyond every spread
    for run in (a, b):
        for c in run["cases"]:
            del c["metrics"]["batches"]
    old = compare_runs({"id": "a", **a}, {"id": "b", **b})
    assert {c.basis for c in old.cases} == {"absolute"}


def _record(path, run, label):
    with ledger.open(path) as db:
        return db.record_run("bench", run["cases"], run["provenance"], label=label)


def test_cli_exit_code_fires_only_on_a_confirmed_regression(tmp_path):
    path = str(tmp_path / "l.sqlite")
    rng = np.random.default_rng(8)
    a = _record(path, make_run(rng, load=0.15), "a")
    same = _record(path, make_run(rng, machine=1.4, load=0.15), "same")
    slow = _record(path, make_run(rng, machine=1.4, load=0.15, kernel=2.0), "slow")
    out = runner.invoke(app, ["compare", a, same, "--ledger", path, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["counts"]["regressions"] == 0 and data["counts"]["slower"] == 0
    out = runner.invoke(app, ["compare", a, slow, "--ledger", path])
    assert out.exit_code == 1, out.output
    assert "vs torch" in out.output and "3 regression(s)" in out.output
