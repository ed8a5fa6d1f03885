"""``kernelab serve-bench``: the workload, the two runs' token comparison, the metrics, the
ledger; planted defects make its comparison fail."""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from kernelab import ledger
from kernelab.cli import app
from kernelab.models import _attention
from kernelab.workloads import serve_bench as serve
from tests.serving_helpers import frozen_gc


@pytest.fixture(scope="module", autouse=True)
def _quick_gc():
    yield from frozen_gc()


def test_draw_requests_is_seeded_and_checked():
    a = serve.draw_requests(6, 256, 40, 8, seed=3)
    assert a == serve.draw_requests(6, 256, 40, 8, seed=3)
    assert a != serve.draw_requests(6, 256, 40, 8, seed=4)
    assert all(10 <= len(r.prompt) <= 70 and 4 <= r.max_new_tokens <= 12 for r in a)
    timed = serve.draw_requests(6, 256, 40, 8, seed=3, rate=100.0)
    arrivals = [r.arrival_s for r in timed]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    with pytest.raises(ValueError, match="rate: expected a positive"):
        serve.draw_requests(2, 256, 40, 8, rate=0.0)
    with pytest.raises(ValueError, match="lengths: expected 2"):
        serve.draw_requests(2, 256, 40, 8, lengths=[(3, 4)])


def test_a_lengths_file_is_parsed_not_executed(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("# prompt output\n12 4\n30, 2\n")
    assert serve.read_lengths(str(f)) == [(12, 4), (30, 2)]
    f.write_text("12 4\n__import__('os') 3\n")
    with pytest.raises(ValueError, match="line 2: expected two integers"):
        serve.read_lengths(str(f))


def _bench(tmp_path, *extra):
    db = tmp_path / "ledger.sqlite"
    args = ["serve-bench", "--preset", "tiny-llama", "--device", "cpu", "--requests", "8",
            "--prompt-len", "24", "--output-len", "4", "--json", "--ledger", str(db),
            *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :]), db


def test_serve_bench_json_says_the_tokens_are_identical_with_every_metric(tmp_path):
    out, db = _bench(tmp_path)
    assert out["tokens_identical"] is True and out["requests_identical"] == 8
    assert [r["attention"] for r in out["runs"]] == ["sdpa", "kernelab"]
    for r in out["runs"]:
        assert r["output_tokens"] == sum(q["output"] for q in out["requests"])
        assert r["output_tokens_per_s"] > 0
        assert 0 < r["ttft_s"]["p50"] <= r["ttft_s"]["p99"]
        assert 0 < r["itl_s"]["p50"] <= r["itl_s"]["p99"]
        assert 0 < r["blocks"]["peak"] <= out["num_blocks"]
        assert 0 <= r["fragmentation"] < 1
        assert 0 < r["attention_share"] < 1
    with ledger.open(str(db)) as d:
        run = d.get_run(out["run_id"])
    assert run["kind"] == "serve-bench"


def test_serve_bench_reports_differing_tokens_under_a_planted_defect(tmp_path, monkeypatch):
    # the block-table row defect, after registration's parity check (which would refuse it)
    real = serve.run_once

    def defective(model, *a, **k):
        if model.config._attn_implementation == "kernelab":
            monkeypatch.setattr(_attention, "_TABLE_ROW_SHIFT", 1)
        return real(model, *a, **k)

    monkeypatch.setattr(serve, "run_once", defective)
    out, _ = _bench(tmp_path, "--no-ledger")
    assert out["tokens_identical"] is False and out["first_difference"] is not None
