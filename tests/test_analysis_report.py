"""sparsespec.harness.report: ratios print as `1.14x [1.02, 1.27]` (a geometric mean and its log-scale
interval), one prompt without an interval, and acceptance as – where nothing was drafted."""
from __future__ import annotations

from sparsespec.harness import report


def metrics(**extra) -> dict:
    base = {"n_prompts": 5, "tokens_per_s": 3.0, "speedup_vs_ar": 1.14, "speedup_vs_ar_ci95_low": 1.02,
            "speedup_vs_ar_ci95_high": 1.27, "mean_accepted": 2.5, "acceptance_rate": 0.375,
            "outputs_match_ar": 1.0, "c_draft_s": 0.01, "c_verify_s": 0.02, "c_verify_s_by_k": {"4": 0.02},
            "bound": 1.5, "bound_reached": 0.8, "prefill_s_mean": 1.0, "c_ar_s": 0.03}
    return {**base, **extra}


def test_a_ratio_prints_as_its_geometric_mean_and_bracketed_interval():
    assert report.speedup_line(metrics()) == "1.14x [1.02, 1.27] (geometric mean over 5 prompts, 95% CI on the log scale)"
    row = report.bench_row("sparsespec", {"run": {"method": "sparsespec"}, "metrics": metrics()})
    assert row["speed-up (geo. mean, 95% CI)"] == "1.14x [1.02, 1.27]"
    batched = metrics(batch_size=2, batch_tokens_per_s=5.0, batch_speedup_vs_ar=1.3, batch_speedup_vs_ar_ci95_low=1.1,
                      batch_speedup_vs_ar_ci95_high=1.6, sequence_latency_s_mean=2.0)
    row = report.bench_row("sparsespec", {"run": {"method": "sparsespec"}, "metrics": batched})
    assert row["batch speed-up vs batched AR (geo. mean, 95% CI)"] == "1.30x [1.10, 1.60]"


def test_one_prompt_prints_its_speedup_and_says_there_is_no_interval():
    one = metrics(n_prompts=1, speedup_vs_ar=1.5, speedup_vs_ar_ci95_low=None, speedup_vs_ar_ci95_high=None)
    assert report.speedup_line(one) == "1.50x (1 prompt: no interval below 2 prompts)"
    assert report.bench_row("sparsespec", {"run": {"method": "sparsespec"}, "metrics": one})[
        "speed-up (geo. mean, 95% CI)"] == "1.50x"


def test_acceptance_is_a_dash_for_ar_and_for_a_run_that_drafted_nothing():
    drafted = {"run": {"method": "pld"}, "metrics": metrics()}
    idle = {"run": {"method": "pld"}, "metrics": metrics(acceptance_rate=0.0, c_verify_s_by_k={"0": 0.02})}
    ar = {"run": {"method": "ar"}, "metrics": metrics(acceptance_rate=0.0, c_verify_s_by_k={"0": 0.02})}
    rejected = {"run": {"method": "pld"}, "metrics": metrics(acceptance_rate=0.0)}     # drafted, none accepted
    assert report.bench_row("pld", drafted)["acceptance"] == "37.5%"
    assert report.bench_row("pld", idle)["acceptance"] == report.NOTHING
    assert report.bench_row("ar", ar)["acceptance"] == report.NOTHING
    assert report.bench_row("pld", rejected)["acceptance"] == "0.0%"


def test_the_run_table_shows_a_dash_when_no_sample_drafted():
    run = {"method": "pld", "model": "m", "task": "qa", "source": "embedded", "ctx": 100, "max_new_tokens": 8}
    sample = {"context_tokens": 90, "ar_prefill_s": None, "ar_decode_s": None, "outputs_match_ar": None,
              "rounds": [{"drafted": 0, "accepted": 0, "emitted": 1}]}
    m = metrics(acceptance_rate=0.0, ar_tokens_per_s=None, prefill_s_mean=1.0, decode_s_mean=2.0, score_mean=None,
                bound=None)
    table = report.format_table(run, m, [sample], "out")
    assert "0.0%" not in table and f"| {report.NOTHING}" in table.split("acceptance rate")[1].splitlines()[0]
