"""analysis.selection: the budget sweep's tables follow the numbers (synthetic results with known
answers), and the command reads a real harness sweep end to end."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import selection
from analysis.frames import SELECTION_CELL
from analysis.provenance import PoolingError, check_poolable
from helpers import log_scale_interval

AR = 10.0
SPEED = {("sparsespec_fixed", 0.02): 1.5, ("streaming", 0.02): 1.0,     # top-K holds, the window collapses
         ("sparsespec_fixed", 0.1): 1.6, ("streaming", 0.1): 1.6}      # both fine at a wide budget


def frame(prompts: int = 3) -> pd.DataFrame:
    rows = []
    for (method, budget), factor in SPEED.items():
        for p in range(prompts):
            jitter = 1 + 0.03 * (p - 1) * (method == "streaming")        # streaming alone varies: paired ratios vary
            tps = AR * (1 + 0.1 * p) * factor * jitter
            rows.append({"model": "m", "task": "qa", "ctx": 8000.0, "method": method, "k": 4.0,
                         "budget": budget, "budget_frac": budget, "prompt_id": f"{p:03d}", "tokens_per_s": tps,
                         "speedup_vs_ar": tps / (AR * (1 + 0.1 * p)), "mean_accepted": 1 + 2 * factor,
                         "outputs_match_ar": True, "run_c_draft_s": 0.04 + budget / 10, "run_c_verify_s": 0.3,
                         "run_select_s_per_round": 0.005, "run": "sweep/0_m_qa_ctx8000", "commit": "a" * 40,
                         "code": "code-1"})
    rows.append({**rows[0], "method": "ar", "budget": float("nan"), "budget_frac": float("nan")})
    return pd.DataFrame(rows)


def test_same_budget_comparison_is_paired_per_prompt():
    same = selection.same_budget_table(selection.selection_samples(frame()))
    by_budget = same.set_index("budget")
    assert list(same["vs"]) == ["streaming", "streaming"]
    assert by_budget.loc[0.02, "standing"] == "ahead"
    assert by_budget.loc[0.02, "top-K / other"].startswith("1.50×")
    assert by_budget.loc[0.1, "standing"] == "tied"                   # equal speeds, jitter only
    assert by_budget.loc[0.02, "tokens/round (top-K)"] == pytest.approx(4.0)
    assert by_budget.loc[0.02, "tokens/round (other)"] == pytest.approx(3.0)
    assert by_budget.loc[0.02, "top-K accepts more on"] == "3 of 3 prompts"
    assert by_budget.loc[0.1, "top-K accepts more on"] == "0 of 3 prompts"        # equal, not more


def test_budget_table_gives_each_draft_its_acceptance_speed_and_costs():
    table = selection.budget_table(selection.selection_samples(frame())).set_index(["draft", "budget"])
    assert table.loc[("streaming", 0.02), "tokens_per_round"] == pytest.approx(3.0)
    assert table.loc[("sparsespec_fixed", 0.1), "speedup_vs_ar"] == pytest.approx(1.6)
    assert table.loc[("sparsespec_fixed", 0.1), "c_draft_ms"] == pytest.approx(50.0)
    assert table.loc[("streaming", 0.02), "n"] == 3 and table["outputs_match_ar"].all()



def test_budget_table_speedup_is_a_geometric_mean_with_a_log_scale_interval():
    df = frame()
    table = selection.budget_table(selection.selection_samples(df)).set_index(["draft", "budget"])
    row = table.loc[("streaming", 0.02)]
    want = log_scale_interval(df.loc[(df["method"] == "streaming") & (df["budget_frac"] == 0.02), "speedup_vs_ar"])
    assert (row["speedup_vs_ar"], row["low"], row["high"]) == pytest.approx(want)
    shown = selection.fmt(table.reset_index()).set_index(["draft", "budget"]).loc[("streaming", "2%"), "speedup_vs_ar"]
    assert shown == f"{want[0]:.2f}× [{want[1]:.2f}, {want[2]:.2f}]"


def test_same_budget_acceptance_is_compared_over_the_prompts_both_decoded():
    df = frame(prompts=3)
    df.loc[(df["method"] == "streaming") & (df["prompt_id"] == "002"), "budget_frac"] = float("nan")   # not run
    df.loc[(df["method"] == "sparsespec_fixed") & (df["prompt_id"] == "002"), "mean_accepted"] = 99.0   # unpaired
    same = selection.same_budget_table(selection.selection_samples(df)).set_index("budget")
    assert same.loc[0.02, "prompts"] == 2 and same.loc[0.02, "tokens/round (top-K)"] == pytest.approx(4.0)


def test_each_draft_is_compared_at_its_own_best_budget():
    best = selection.best_budget_table(selection.selection_samples(frame())).iloc[0]
    assert best["top-K best budget"] == 0.1 and best["other best budget"] == 0.1
    assert best["top-K speed-up"] == pytest.approx(1.6)
    assert best["standing"] == "tied"


def test_a_prompt_decoded_twice_by_one_draft_is_an_error_not_an_average():
    df = frame()
    again = df[df["method"] == "streaming"].head(1).assign(run="rerun/0_m_qa_ctx8000")
    with pytest.raises(PoolingError, match="prompt 000 of streaming b=2% at m/qa/8000/k=4 appears in 2 runs"):
        check_poolable(selection.selection_samples(pd.concat([df, again])), cell=SELECTION_CELL)


def test_a_selection_cell_of_mixed_code_is_refused_but_two_k_sweeps_are_two_cells():
    df = frame()
    mixed = df.assign(code=np.where(df["method"] == "streaming", "code-2", "code-1"))
    with pytest.raises(PoolingError, match="runs of m/qa/8000/k=4 were made from 2 versions of the code"):
        check_poolable(selection.selection_samples(mixed), cell=SELECTION_CELL)
    check_poolable(selection.selection_samples(mixed), allow_mixed_commits=True, cell=SELECTION_CELL)
    at_16 = df.assign(k=16.0, code="code-2", run="sweep_k16/0_m_qa_ctx8000")
    check_poolable(selection.selection_samples(pd.concat([df, at_16])), cell=SELECTION_CELL)   # k=4 and k=16 apart


def test_the_selection_command_refuses_an_unpoolable_sweep_in_one_line_before_writing(tmp_path, monkeypatch, capsys):
    df = frame()
    again = df[df["method"] == "streaming"].head(1).assign(run="rerun/0_m_qa_ctx8000")
    monkeypatch.setattr(selection, "results_or_exit", lambda folder: pd.concat([df, again]))
    assert selection.main([str(tmp_path), "--doc", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: prompt 000 of streaming b=2% at m/qa/8000/k=4") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    mixed = df.assign(code=np.where(df["method"] == "streaming", "code-2", "code-1"))
    monkeypatch.setattr(selection, "results_or_exit", lambda folder: mixed)
    assert selection.main([str(tmp_path), "--doc", "none"]) == 2 and "--allow-mixed-commits" in capsys.readouterr().err
    assert selection.main([str(tmp_path), "--doc", "none", "--allow-mixed-commits"]) == 0
    assert (tmp_path / "selection.md").exists()


def test_results_without_a_budgeted_draft_exit_with_one_line():
    with pytest.raises(SystemExit, match="experiment=selection_budget_cpu"):
        selection.selection_samples(frame().assign(budget_frac=float("nan")))


@pytest.mark.slow   # a harness sweep in-process
def test_selection_command_reads_a_harness_budget_sweep(harness_run, tmp_path):
    run, _, _ = harness_run
    entries = ["sparsespec_fixed:k=3,budget=0.2", "streaming:k=3,budget=0.2",
               "sparsespec_fixed:k=3,budget=0.5", "streaming:k=3,budget=0.5", "sparsespec_fixed:k=3,budget=0.2,recent=8"]
    summaries = run(tmp_path / "sweep", "num_prompts=3", f"bench.methods=[{','.join(repr(e) for e in entries)}]")
    doc = tmp_path / "benchmark.md"
    doc.write_text(f"before\n{selection.MARK_BEGIN}\nold\n{selection.MARK_END}\nafter\n")
    assert selection.main([str(tmp_path / "sweep"), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert (tmp_path / "sweep" / "figures" / "selection_budget.png").stat().st_size > 0
    assert "recent=8" in (tmp_path / "sweep" / "selection.md").read_text()

    from analysis.load import load_results
    from sparsespec.harness.entries import entry_folder
    table = selection.budget_table(selection.selection_samples(load_results(tmp_path / "sweep")))
    assert len(table) == len(entries) and table["outputs_match_ar"].all()
    for entry in entries[:4]:
        method, _, options = entry.partition(":")
        budget = float(options.split("budget=")[1])
        row = table[(table["draft"] == method) & (table["budget"] == budget)].iloc[0]
        assert row["n"] == 3
        lines = (tmp_path / "sweep" / entry_folder(entry) / "samples.jsonl").read_text().splitlines()
        assert row["speedup_vs_ar"] == pytest.approx(log_scale_interval([json.loads(x)["speedup_vs_ar"]
                                                                         for x in lines])[0])
        assert row["tokens_per_round"] == pytest.approx(sum(json.loads(x)["mean_accepted"] for x in lines) / 3)


def test_a_baseline_run_without_a_k_option_reads_the_k_it_resolved():
    """`streaming:budget=0.02` sets no k: the row takes the controller and k the run resolved
    (summary.json run.method_options), so a budget sweep's baselines group by k like top-K's rows."""
    from analysis.load import rows_from_records
    summary = {"config": {"method": {"name": "streaming", "options": {"budget": 0.02, "k": None}}},
               "run": {"method": "streaming", "method_options": {"controller": "fixed", "k": 4, "budget": 0.02}}}
    row = rows_from_records(summary, [{"prompt_id": "000", "tokens_per_s": 5.0}], "run")[0]
    assert row["controller"] == "fixed" and row["k"] == 4
    summary["config"]["method"]["options"]["k"] = 8                   # an explicit option wins
    assert rows_from_records(summary, [{"prompt_id": "000"}], "run")[0]["k"] == 8
