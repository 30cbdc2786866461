"""analysis.claims: each claim's three-way verdict follows the numbers (synthetic results with known
answers); the command's checks and publishing are tested in test_analysis_provenance.py."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import claims, publish
from analysis.frames import selection_samples
from analysis.provenance import PoolingError

AR_SPEED = {2000: 20.0, 8000: 10.0, 32000: 4.0}


def frame(speed: dict, contexts=(2000, 8000), tasks=("summarization", "qa", "code"), prompts=3,
          noise=0.02, match=True) -> pd.DataFrame:
    """One row per (ctx, task, method, prompt): tokens/s = AR's * speed[label](ctx) * (1 +- noise)."""
    rows = []
    for ctx in contexts:
        for task in tasks:
            for p in range(prompts):
                jitter = 1 + noise * (p - 1)
                ar = AR_SPEED[ctx] * (1 + 0.05 * p)
                for label, factor in {"ar": lambda c: 1.0, **speed}.items():
                    method, _, k = label.partition(" k=")
                    tps = ar * factor(ctx) * (1 if label == "ar" else jitter)
                    rows.append({"model": "m", "task": task, "ctx": ctx, "method": method,
                                 "k": float(k) if k else math.nan, "budget": math.nan, "prompt_id": f"{p:03d}",
                                 "tokens_per_s": tps, "speedup_vs_ar": tps / ar,
                                 "outputs_match_ar": None if label == "ar" else match,
                                 "mean_accepted": 1.0 if label == "ar" else 2.0 + (int(k) if k else 4) / 4})
    return pd.DataFrame(rows)


GOOD = {"sparsespec": lambda c: 1.2 + c / 10_000,                 # rises with context, ahead of everything
        "sparsespec_fixed k=4": lambda c: 1.1 + c / 12_000,
        "sparsespec_fixed k=8": lambda c: 1.0 + c / 12_000,
        "sparsespec_fixed k=16": lambda c: 0.9 + c / 12_000,
        "streaming": lambda c: 0.9, "snapkv_static": lambda c: 0.9, "layerskip": lambda c: 0.8}


def verdicts(df) -> dict[str, str]:
    """Each claim's verdict, keyed by its check's name (claim_controller -> "controller")."""
    verdicts = claims.check_claims(claims.samples(df))
    return {check.__name__.removeprefix("claim_"): c.verdict for check, c in zip(claims.CLAIMS, verdicts)}


def test_claims_that_hold_in_the_numbers_are_reproduced():
    v = verdicts(frame(GOOD))
    assert v["context_growth"] == "reproduced"
    assert v["across_tasks"] == "reproduced"
    assert v["controller"] == "reproduced"
    assert v["selection"] == "reproduced"
    assert v["quality"] == "reproduced"
    assert v["beats_other_drafters"] == "not measurable here"            # nothing at 20K or more


def test_claims_whose_interval_excludes_the_effect_are_contradicted():
    bad = {**GOOD, "sparsespec": lambda c: 1.5 - c / 20_000,    # falls with context, behind fixed k=4 at 8K
           "sparsespec_fixed k=4": lambda c: 1.6,               # the controller behind k=4 everywhere
           "streaming": lambda c: 1.9}                           # streaming ahead of recycled top-K
    v = verdicts(frame(bad, match=False))
    assert v["context_growth"] == "contradicted"
    assert v["controller"] == "contradicted"
    assert v["selection"] == "contradicted"
    assert v["quality"] == "contradicted"


def test_a_tie_is_inconclusive_not_contradicted():
    """The controller equal to fixed k=4 (prompt jitter only) and a flat speed-up: the intervals hold 1,
    so neither claim is reproduced, and neither is contradicted."""
    tied = {**GOOD, "sparsespec": GOOD["sparsespec_fixed k=4"]}
    assert verdicts(frame(tied))["controller"] == "inconclusive"
    flat = {**GOOD, "sparsespec": lambda c: 1.3}
    assert verdicts(frame(flat))["context_growth"] == "inconclusive"


def test_long_context_comparison_needs_both_other_drafters_and_every_task():
    v = verdicts(frame(GOOD, contexts=(8000, 32000), tasks=("code",)))
    assert v["beats_other_drafters"] == "not measurable here"            # LayerSkip ran, assisted drafting did not
    assert v["across_tasks"] == "not measurable here"            # one task only
    both = {**GOOD, "assisted": lambda c: 0.7}
    assert verdicts(frame(both, contexts=(8000, 32000), tasks=("code",)))["beats_other_drafters"] == "reproduced"
    slow = {**both, "assisted": lambda c: 6.0}
    assert verdicts(frame(slow, contexts=(8000, 32000), tasks=("code",)))["beats_other_drafters"] == "contradicted"


def test_paired_ratio_is_the_geometric_mean_of_per_prompt_ratios():
    df = frame(GOOD, contexts=(8000,), tasks=("code",))
    fixed = df["method"] == "sparsespec_fixed"
    df.loc[fixed, "tokens_per_s"] *= df.loc[fixed, "prompt_id"].map({"000": 0.97, "001": 1.0, "002": 1.03})
    rows = claims.samples(df)
    ci = claims.paired_ratio(rows, "sparsespec", "sparsespec_fixed k=16")
    a = rows[rows["label"] == "sparsespec"].set_index("prompt_id")["tokens_per_s"]
    b = rows[rows["label"] == "sparsespec_fixed k=16"].set_index("prompt_id")["tokens_per_s"]
    assert ci.ratio == pytest.approx(np.exp(np.log(a / b).mean())) and ci.n == 3
    assert ci.ratio != pytest.approx((a / b).mean())        # not the arithmetic mean of the ratios
    assert ci.low * ci.high == pytest.approx(ci.ratio ** 2)  # symmetric on the log scale
    assert claims.standing(ci) == "ahead"


def sweep(speed: dict, k: int = 16, tasks=("qa", "code", "retrieval"), prompts=4, noise=0.02) -> pd.DataFrame:
    """A draft-budget sweep at one k (what `experiment=selection_budget_cpu` records): per task and prompt,
    tokens/s = AR's * speed[(draft, budget)], streaming's with +-noise so paired ratios vary."""
    rows = []
    for task in tasks:
        for p in range(prompts):
            ar, jitter = 10.0 * (1 + 0.05 * p), 1 + noise * (p - 1.5)
            for (method, budget), factor in speed.items():
                tps = ar * factor * (jitter if method == "streaming" else 1)
                rows.append({"model": "m", "task": task, "ctx": 8000.0, "method": method, "k": float(k),
                             "budget": budget, "budget_frac": budget, "prompt_id": f"{p:03d}", "tokens_per_s": tps,
                             "speedup_vs_ar": tps / ar, "mean_accepted": 3.0, "outputs_match_ar": True,
                             "run_c_draft_s": 0.04, "run_c_verify_s": 0.3, "run_select_s_per_round": 0.005})
    return pd.DataFrame(rows)


TOPK_AHEAD = {("sparsespec_fixed", 0.05): 1.5, ("streaming", 0.05): 1.0,
              ("sparsespec_fixed", 0.1): 1.6, ("streaming", 0.1): 1.2}


def selection_claim(matrix: dict, swept: pd.DataFrame | None) -> claims.Claim:
    return claims.claim_selection(claims.samples(frame(matrix)), None if swept is None else selection_samples(swept))


def test_a_budget_sweep_adds_the_k16_comparisons_pooled_over_its_cells():
    claim = selection_claim(GOOD, sweep(TOPK_AHEAD))
    pooled = claim.pooled.set_index("comparison")
    at5 = "recycled top-K (k=16, budget 5%) / streaming"
    assert {at5, "recycled top-K (k=16, budget 10%) / streaming"} <= set(pooled.index)
    assert pooled.loc[at5, "n"] == "n = 12 prompts in 3 cells"
    # per prompt 1.5 / jitter: the geometric mean of 1 / (1 +- 0.01, 0.03) is 1.5 to 3 decimals
    assert pooled.loc[at5, "estimate [95% CI]"].startswith("1.50×")
    assert claim.verdict == "reproduced" and at5 in claim.summary
    per_cell = claim.evidence[claim.evidence["k"] == 16]
    assert len(per_cell) == 6 and set(per_cell["budget"]) == {"5%", "10%"} and set(per_cell["standing"]) == {"ahead"}


def test_a_tie_at_k16_makes_the_selection_claim_inconclusive_and_a_loss_contradicts_it():
    tied = {key: 1.3 for key in TOPK_AHEAD}                              # equal speeds: jitter only
    assert selection_claim(GOOD, None).verdict == "reproduced"          # the matrix's k=4 alone
    assert selection_claim(GOOD, sweep(tied)).verdict == "inconclusive"
    behind = {**TOPK_AHEAD, ("streaming", 0.05): 2.0}
    assert selection_claim(GOOD, sweep(behind)).verdict == "contradicted"


def test_a_sweep_at_another_k_or_budget_adds_nothing():
    other_k = selection_claim(GOOD, sweep(TOPK_AHEAD, k=4))
    other_budget = selection_claim(GOOD, sweep({("sparsespec_fixed", 0.2): 1.5, ("streaming", 0.2): 1.0}))
    for claim in (other_k, other_budget):
        assert not claim.pooled["comparison"].str.contains("k=16").any()
        assert (claim.evidence["k"] == 4).all()


def test_the_summary_names_each_deciding_estimate_its_interval_and_n():
    found = {check.__name__: c for check, c in zip(claims.CLAIMS, claims.check_claims(claims.samples(frame(GOOD))))}
    controller = found["claim_controller"].summary
    assert "controller / k=4" in controller and "n = 18 prompts in 6 cells" in controller
    assert " [" in controller and "×" in controller
    assert set(found["claim_controller"].pooled["verdict"]) == {"reproduced"}
    assert "per doubling" in found["claim_context_growth"].summary


def test_a_prompt_decoded_twice_in_one_cell_is_refused():
    df = frame(GOOD, contexts=(8000,), tasks=("code",))
    df["run"] = "a"
    twice = pd.concat([df, df.assign(run="b")])
    with pytest.raises(PoolingError, match="appears in 2 runs"):
        claims.samples(twice)


def test_readme_block_is_replaced_between_markers_and_a_missing_block_is_an_error(tmp_path):
    text = f"intro\n{publish.MARK_BEGIN}\nold\n{publish.MARK_END}\noutro\n"
    assert publish.replace_block(text, "NEW") == "intro\nNEW\noutro\n"
    with pytest.raises(SystemExit, match="claims:begin"):
        publish.replace_block("no markers", "NEW")


def test_prefill_savings_count_every_method_but_one_per_shared_prefill():
    def ar_row(run, prompt, prefill_s, sharers, ctx=32000):
        return {"run": f"matrix/{run}/0_m_qa_ctx{ctx}/ar", "model": "m", "ctx": ctx, "method": "ar",
                "prompt_id": prompt, "prefill_s": prefill_s, "prefill_sharers": sharers}
    df = pd.DataFrame([ar_row("m_32k", "000", 100.0, 5), ar_row("m_32k", "001", 200.0, 5),
                       ar_row("m_8k", "000", 30.0, 1, ctx=8000)])             # prefilled alone: nothing saved
    table = publish.prefill_savings(df, walls={"m_32k": 1800.0})
    assert len(table) == 1
    row = table.iloc[0]
    assert (row["ctx"], row["prompts"], row["methods per prefill"]) == ("32K", 2, "5")
    assert row["prefills saved"] == 8                                     # 2 prompts x (5 - 1)
    assert row["prefill time saved"] == "20 min"                          # (100 + 200) s x 4
    assert row["prefill s/prompt"] == "150 [100, 200]"
    assert row["chunk wall time"] == "30 min"
    assert publish.prefill_savings(df, walls={})["chunk wall time"].iloc[0] == "–"


def test_chunk_wall_times_sum_the_sittings_of_a_chunk(tmp_path):
    (tmp_path / "wall_times.tsv").write_text("a\t600\t2026-01-01T00:00:00Z\nb\t60\tx\na\t300\ty\n")
    assert publish.chunk_wall_seconds(tmp_path) == {"a": 900.0, "b": 60.0}
    assert publish.chunk_wall_seconds(tmp_path / "missing") == {}
