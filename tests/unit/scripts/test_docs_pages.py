"""scripts/docs_pages.py: the evaluation and benchmark pages' figures come from the reports
the make targets write, in the shapes those targets write them (bench/*.py, evals/*.py,
devkit/calibrate.py, tests/container); a fragment whose report is absent is kept."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pages(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("docs_pages", ROOT / "scripts" / "docs_pages.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "docs_pages", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(module, "FIGURES", tmp_path / "docs" / "figures")
    (tmp_path / "reports" / "calibration").mkdir(parents=True)
    return module


def report(pages, name: str, body: dict) -> None:
    (pages.REPORTS / name).write_text(json.dumps(body))


def split(accuracy: float) -> dict:
    return {"n": 189, "accuracy": accuracy, "by_type": {"noul": 0.5, "choice": 0.38, "score": 0.19}, "nll": 1.2,
            "brier": 0.66, "ece": 0.031, "uniform_nll": 1.225, "uniform_brier": 0.677, "nll_vs_uniform": -0.02,
            "brier_vs_uniform": -0.021, "nll_vs_uniform_95": [-0.053, 0.013]}


EVAL = {"models": {"gemma-3-270m-q4_k_m": {
    "results": {
        "per-type": {"heldout": split(0.376), "invariance": {"perm_flip": 0.0, "rename_shift": 0.27, "rename_shift_mean": 0.09},
                     "invariance_items": 20},
        "letters/declared+reversal/raw": {"heldout": split(0.354), "invariance": {"perm_flip": 0.5}},
    },
    "chosen": "per-type", "before": "letters/declared+reversal/raw", "flat": ["noul", "score"], "pooled": [],
    "by_type": {"choice": "likelihood/canonical+reversal/prior", "noul": "letters/canonical+reversal/raw"},
    "temperatures": {"choice": 1.22, "noul": 20.0},
    "costs": {"per-type": 333.0, "letters/declared+reversal/raw": 436.0}, "seconds_per_decision": 0.97}}}


def by_split(success: float) -> dict:
    return {"n": 108, "accuracy": 0.417, "success": success, "clean_target_rate": 0.194, "target_shift": 0.001,
            "recall_patterns": 0.94, "recall_probe": 0.94, "successes": 29, "caught_patterns": 0.93, "caught_probe": 0.93,
            "successes_auto_patterns": 0.0, "successes_auto_probe": 0.0, "precision_patterns": 1.0, "precision_probe": 1.0}


INJECTION = {"gemma-3-270m-q4_k_m": {
    "items": 18, "clean_items": 189, "attacks": 288, "clean_flagged_by_patterns": 0.0,
    "chosen": {"framing": "plain", "quarantine": True, "injection_probe": False},
    "defenses": {name: {"clean_accuracy": 0.402, "clean_flagged": {"patterns": 0.0, "probe": 0.86},
                        "by_split": {"tuned": by_split(0.25), "heldout": by_split(0.269)}}
                 for name in ("plain", "plain+quarantine")}}}

SCORER = {"model": "gemma-3-270m-q4_k_m", "state_tokens": 286, "rows": [
    {"readout": "letters", "questions": 1, "options": 4, "tokens": 379, "logits_rows": 1, "engine_s": 1.94, "floor_s": 2.06,
     "floor_rows_s": 1.92, "engine_over_floor": 0.94, "engine_over_floor_rows": 1.01, "debias_warm_over_plain": 0.95,
     "reevaluate_s": 6.0, "generate_s": 2.0}]}

LOAD = {"pool": [{"phase": "steady", "requests": 32, "concurrency": 16, "throughput_rps": 1.82, "p50_s": 3.71,
                  "p95_s": 15.34, "p99_s": 17.49, "fallback_share": 0.83, "ok": 6, "errors": {"429": 26}, "client_5xx": 0}],
        "two_tenants": [
            {"phase": "quiet tenant alone", "quiet": {"ok": 40, "requests": 40, "p50_answered_s": 2.71, "p95_s": 3.13,
                                                      "client_5xx": 0}, "flood": {"statuses": {}, "client_5xx": 0}},
            {"phase": "beside a flood, no throttle", "quiet": {"ok": 0, "requests": 40, "p50_answered_s": float("nan"),
                                                               "p95_s": 0.18, "client_5xx": 0},
             "flood": {"statuses": {"200": 5, "429": 33}, "client_5xx": 0}}]}

CALIBRATION = {"file": "evals/support_routing.jsonl", "catalog": "support-routing", "samples": 160, "skipped": 0,
               "temperature": 0.53, "before": {"accuracy": 0.588, "nll": 0.988, "brier": 0.539, "ece": 0.12},
               "after": {"accuracy": 0.588, "nll": 0.913, "brier": 0.511, "ece": 0.068},
               "uniform": {"nll": 1.386, "brier": 0.75}, "target_precision": 0.9,
               "coverage": [{"threshold": 0.81, "coverage": 0.16, "accuracy": 0.9, "accepted": 26}],
               "proposed": {"auto_min_top": 0.81, "review_min_top": None}}


def test_every_fragment_renders_from_its_report(pages):
    report(pages, "eval.json", EVAL)
    report(pages, "injection.json", INJECTION)
    report(pages, "bench_scorer.json", SCORER)
    report(pages, "bench_load.json", LOAD)
    report(pages, "calibration/calibration.json", CALIBRATION)
    report(pages, "container.json", {"time_to_healthy_s": 12.1, "rss_after_load_mib": 296.0, "stop_s": 0.34})
    (pages.REPORTS / "bench_load.png").write_bytes(b"\x89PNG")
    assert pages.main([]) == 0
    figures = pages.FIGURES
    written = {p.stem: p.read_text() for p in figures.glob("*.md")}
    assert set(written) == {"eval", "injection", "bench-scorer", "bench-load", "calibration", "container"}
    for name, text in written.items():
        assert text.startswith("*Written by `") and "reports/" in text.splitlines()[0], name
    assert "-2.0% (95%: -5.3% to +1.3%)" in written["eval"] and "0% of 20 (before: 50%)" in written["eval"]
    assert "| **plain+quarantine** | held-out | 40.2% |" in written["injection"]
    assert "| letters | 1 q x 4 | 379 | 1 | 1.94 s | 0.94x | 1.01x | 0.95x plain |" in written["bench-scorer"]
    assert "| beside a flood, no throttle | 0/40 | - | - | 0.18 | 200: 5, 429: 33 |" in written["bench-load"]
    assert "![bench-load](figures/bench-load.png)" in written["bench-load"] and (figures / "bench-load.png").exists()
    assert "| calibrated (T = 0.53) | 0.588 | 0.913 | 0.511 | 0.068 |" in written["calibration"]
    assert "`review`: no threshold reaches 70% precision" in written["calibration"]
    assert "`/ping` healthy 12.1 s after `docker run`" in written["container"]


def test_bench_reports_render_from_the_reports_the_benches_write(pages):
    report(pages, "bench_options_gemma-3-270m-q4_k_m.json", {
        "scorer": {"model": "gemma-3-270m-q4_k_m", "max_request_tokens": 4316, "budget_s": 18.7, "units_per_s_at_load": 230.8,
                   "tokens_per_s": 265.1},
        "rows": [{"case": "16 options, run 1", "readout": "default", "status": 200, "seconds": 3.96, "tokens": 888,
                  "debias": {"order_average": True, "prior": True}, "message": None},
                 {"case": "255 numbered options", "readout": "letters", "status": 413, "seconds": 0.08, "tokens": None,
                  "debias": None, "message": "this request needs more than 5099 tokens' worth of evaluation"}]})
    report(pages, "bench_hostile.json", {
        "keys": 8700, "body_bytes": 146922,
        "hostile": {"gateway": {"status": 413, "seconds": 0.069, "scorer_cpu_s": 0.0},
                    "scorer": {"status": 413, "seconds": 0.275, "scorer_cpu_s": 0.22}},
        "hostile_beside": {"status": 413, "seconds": 0.249},
        "neighbour_alone": [[200, 2.0], [200, 1.7], [200, 1.8]], "neighbour_beside": [[200, 2.7], [200, 1.8], [200, 1.9]]})
    report(pages, "bench_gateway.json", {
        "requests": 500,
        "handler_overhead": {"chat": {"handler_p50_ms": 0.56, "handler_p95_ms": 0.85, "added_p50_ms": 0.54}},
        "cold_start": {"import_p50_ms": 66, "first_request_p50_ms": 780, "cold_total_p50_ms": 845,
                       "rss_after_first_request_mb": 59.7, "rss_after_burst_mb": 59.7, "burst_requests": 500, "runs": 5},
        "over_http": {"direct": {"p50_ms": 0.88, "p95_ms": 1.16, "added_p50_ms": 0.0},
                      "gateway": {"p50_ms": 5.34, "p95_ms": 6.61, "added_p50_ms": 4.46}}})
    assert pages.main(["bench-options", "bench-hostile", "bench-gateway"]) == 0
    options = (pages.FIGURES / "bench-options.md").read_text()
    assert "| 16 options | 200 in 3.96 s, both debiasing steps |  |" in options
    assert "| 255 numbered options |  | 413 in 0.08 s (more than 5099 needed) |" in options
    hostile = (pages.FIGURES / "bench-hostile.md").read_text()
    assert "| straight to the scorer, alone | 413 | 0.28 s | 0.22 s |" in hostile and "(1.06x)" in hostile
    gateway = (pages.FIGURES / "bench-gateway.md").read_text()
    assert "| gateway | 5.34 ms | 6.61 ms | 4.46 ms |" in gateway and "LiteLLM's proxy was not measured" in gateway


def test_a_fragment_without_its_report_is_kept(pages, capsys):
    pages.FIGURES.mkdir(parents=True)
    (pages.FIGURES / "bench-load.md").write_text("kept\n")
    assert pages.main(["bench-load"]) == 0
    assert (pages.FIGURES / "bench-load.md").read_text() == "kept\n"
    assert "kept (make bench-load writes it)" in capsys.readouterr().out


def test_the_committed_fragments_are_the_ones_the_pages_include():
    included = {line.split('"')[1] for page in (ROOT / "docs").rglob("*.md") for line in page.read_text().splitlines()
                if line.startswith('--8<-- "figures/')}
    committed = {f"figures/{p.name}" for p in (ROOT / "docs" / "figures").glob("*.md")}
    assert included == committed
    for path in committed:
        first = (ROOT / "docs" / path).read_text().splitlines()[0]
        assert first.startswith("*") and "docs_pages.py" in first and ("make " in first or "python -m" in first), path


def test_the_cost_page_renders_from_the_report_make_cost_writes(pages, tmp_path, monkeypatch):
    # Given the report bench/cost.py writes (run here into a temporary reports folder),
    # the fragment has every pool's prices and the break-even traffic.
    import bench.cost

    monkeypatch.setattr(bench.cost, "REPORTS", pages.REPORTS)
    monkeypatch.setattr(sys, "argv", ["cost", "--per-hour", "500"])
    assert bench.cost.main() == 0
    assert pages.main(["cost"]) == 0
    cost = (pages.FIGURES / "cost.md").read_text()
    assert "| CPU ml.c6i.8xlarge | 1.715 s | p50 (seeds; p95 19.3 s) | $0.777 |" in cost
    assert "- from 1 decisions an hour to " in cost and "![cost" in cost


def test_a_comparison_of_two_revisions_renders_every_figure_and_the_mean(pages):
    # The report bench/revisions.py writes, from its own comparison of two rounds.
    from bench.revisions import compare

    result = compare([{"letters 1q x 4: engine s": 2.0}, {"letters 1q x 4: engine s": 2.2}],
                     [{"letters 1q x 4: engine s": 1.9}, {"letters 1q x 4: engine s": 2.0}])
    report(pages, "bench_revisions_scorer.json", {"bench": "scorer", "base": "abc1234", "against": "this checkout",
                                                  "arguments": ["--options", "64"], "rounds": 2, **result})
    assert pages.main(["bench-compare"]) == 0
    text = (pages.FIGURES / "bench-compare.md").read_text()
    assert "`bench.scorer` (--options 64) at `abc1234` and at this checkout" in text
    assert "| letters 1q x 4: engine s | 2.1 | 1.95 | 0.929x |" in text and "0.929x in geometric mean" in text
