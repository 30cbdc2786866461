"""The one definition of every statistic (sparsespec/stats.py), and that its users call it:
Generation, the harness's summary, the lm-eval statistics; plus EOS handling and the table formatter."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from helpers import log_scale_interval
from sparsespec import stats
from sparsespec.engine import eos
from sparsespec.lm_eval import stats as lm_eval_stats
from sparsespec.engine.generation import Generation, Round
from sparsespec.harness.results import aggregate, batch_metrics, build_sample
from sparsespec.tables import markdown_table


def rnd(drafted: int, accepted: int, *, emitted: int | None = None, draft_s: float = 0.0, verify_s: float = 0.1,
        select_s: float = 0.0, steps: int | None = None) -> Round:
    return Round(drafted=drafted, accepted=accepted, emitted=accepted + 1 if emitted is None else emitted,
                 entropies=[0.0] * drafted, draft_s=draft_s, verify_s=verify_s, select_s=select_s,
                 draft_steps=drafted if steps is None else steps)


# ---------------------------------------------------------------- the definitions

def test_acceptance_rate_is_pooled_over_rounds_not_a_mean_of_rates():
    rounds = [rnd(10, 10), rnd(2, 0)]             # per-round rates 1.0 and 0.0: their mean would be 0.5
    totals = stats.round_totals(rounds)
    assert stats.acceptance_rate(totals.accepted, totals.drafted) == pytest.approx(10 / 12)
    assert stats.acceptance_rate(0, 0) == 0.0


def test_mean_accepted_counts_the_bonus_token_so_ar_is_one():
    ar = [rnd(0, 0) for _ in range(5)]
    totals = stats.round_totals(ar)
    assert stats.mean_accepted(totals.emitted, totals.rounds) == 1.0
    spec = stats.round_totals([rnd(4, 3), rnd(4, 1)])          # 4 + 2 tokens in 2 rounds
    assert stats.mean_accepted(spec.emitted, spec.rounds) == 3.0


def test_round_totals_read_dataclasses_and_their_json_dicts_alike():
    from dataclasses import asdict
    rounds = [rnd(4, 2, draft_s=0.4, select_s=0.01), rnd(3, 3, draft_s=0.3, steps=4)]
    assert stats.round_totals(rounds) == stats.round_totals([asdict(r) for r in rounds])


def test_mean_ci_is_student_t_over_prompts():
    values = [1.2, 1.5, 1.3, 1.6]
    ci = stats.mean_ci(values)
    mean = sum(values) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    half = 3.182446305284263 * sd / 2                       # t_{0.975, 3}, from a table
    assert (ci.n, ci.mean, ci.std) == (4, pytest.approx(mean), pytest.approx(sd))
    assert (ci.low, ci.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert stats.mean_ci([2.0]) == stats.Estimate(2.0, None, None, 1)
    assert stats.mean_ci([]).mean is None
    assert stats.mean_ci([1.0, float("nan"), 3.0]).n == 2


@pytest.mark.parametrize("values", [[1.2, 1.5], [1.2, 1.5, 1.3], [0.1, 2.0, -0.4, 3.3, 0.7], list(range(31))])
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_mean_ci_is_scipy_t_interval_for_small_samples(values, level):
    """The interval is scipy's one-sample t interval to the last few bits (a normal quantile, or a t
    quantile off by a degree of freedom, misses it by 1e-3 or more)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    want = scipy_stats.ttest_1samp(values, 0.0).confidence_interval(level)
    ci = stats.mean_ci(values, level)
    assert (ci.low, ci.high) == (pytest.approx(want.low, rel=1e-13), pytest.approx(want.high, rel=1e-13))
    assert type(ci.low) is float and type(ci.high) is float          # JSON-ready in summary.json


SKEWED = [0.4, 0.5, 0.6, 12.0]          # one large ratio: the arithmetic interval reaches below 0


def test_a_skewed_set_of_ratios_gets_a_positive_log_scale_interval():
    assert stats.mean_ci(SKEWED).low < 0                      # what the arithmetic interval would claim
    ci = stats.geometric_ci(SKEWED)
    mean, low, high = log_scale_interval(SKEWED)
    assert (ci.n, ci.mean, ci.low, ci.high) == (4, pytest.approx(mean), pytest.approx(low), pytest.approx(high))
    assert 0 < ci.low < ci.mean < ci.high
    assert ci.std == pytest.approx(stats.mean_ci([math.log(r) for r in SKEWED]).std)   # the SD of the logs


def test_geometric_ci_cancels_reciprocal_ratios_and_gives_no_interval_for_one():
    assert stats.geometric_ci([2.0, 0.5]).mean == pytest.approx(1.0)      # the arithmetic mean would be 1.25
    assert stats.geometric_ci([1.5]) == stats.Estimate(1.5, None, None, 1)
    assert stats.geometric_ci([]).mean is None
    assert stats.geometric_ci([None, 2.0, float("nan"), 8.0]).mean == pytest.approx(4.0)


def test_a_ratio_that_is_not_positive_is_named():
    with pytest.raises(ValueError, match="positive.*got 0.0"):
        stats.geometric_ci([1.2, 0.0])


def test_a_speedup_needs_both_rates_measured():
    assert stats.speedup(6.0, 3.0) == 2.0
    assert stats.speedup(0.0, 3.0) is None and stats.speedup(6.0, 0.0) is None and stats.speedup(None, 3.0) is None


def test_one_interval_type_reads_as_a_mean_and_as_a_ratio():
    """mean_ci, geometric_ci and analysis' estimates return one type: the harness reads mean/std,
    analysis ratio/cells/p/how, both low/high/n."""
    from analysis import estimates
    ci = stats.geometric_ci([1.2, 1.5, 1.3])
    assert type(ci) is type(stats.mean_ci([1.0, 2.0])) is type(estimates.geometric([1.2, 1.5])) is stats.Estimate
    assert estimates.Estimate is stats.Estimate
    assert ci.ratio == ci.mean and ci.std == pytest.approx(stats.mean_ci([math.log(r) for r in (1.2, 1.5, 1.3)]).std)
    assert ci.text() == f"{ci.mean:.2f}× [{ci.low:.2f}, {ci.high:.2f}]" and ci.verdict() == stats.REPRODUCED
    assert ci.sample() == "n = 3 prompts in 1 cell"
    assert stats.Estimate(1.5, None, None, 1).text() == "1.50× (n=1)" and stats.mean_ci([]).text() == "–"


def test_cost_metrics_and_the_bound():
    # 4 draft steps of 10 ms and a 50 ms verification, twice; one round of 2 steps and 30 ms
    rounds = [rnd(4, 2, draft_s=0.04, verify_s=0.05), rnd(4, 4, draft_s=0.04, verify_s=0.05),
              rnd(2, 0, draft_s=0.02, verify_s=0.03)]
    got = stats.cost_metrics(rounds)
    assert got["c_draft_s"] == pytest.approx(0.01) and got["c_verify_s"] == pytest.approx(0.13 / 3)
    assert got["c_verify_s_by_k"] == {"2": pytest.approx(0.03), "4": pytest.approx(0.05)}
    assert stats.c_verify_by_k(rounds) == {2: pytest.approx(0.03), 4: pytest.approx(0.05)}
    assert got["draft_steps_per_round"] == pytest.approx(10 / 3)
    tau, steps, c_v = 9 / 3, 10 / 3, 0.13 / 3
    assert stats.prompt_bound(rounds, c_ar_s=0.02) == pytest.approx(tau * 0.02 / (steps * 0.01 + c_v))
    assert stats.prompt_bound([rnd(0, 0)], c_ar_s=0.02) is None           # nothing drafted by a model
    assert stats.prompt_bound(rounds, c_ar_s=None) is None
    assert stats.cost_bound(tau=5.0, steps=4, c_ar_s=1.0, c_d=0.25, c_v=1.0) == 2.5


def test_batch_bound_counts_each_batch_round_once_and_every_sequences_tokens():
    # a batch of two: sequence 0 runs 3 rounds, sequence 1 finishes after 2 (same shared times)
    shared = [dict(draft_s=0.04, verify_s=0.06), dict(draft_s=0.04, verify_s=0.06), dict(draft_s=0.02, verify_s=0.03)]
    seq0 = [rnd(4, a, **t) for a, t in zip((4, 2, 1), shared)]          # emits 5 + 3 + 2
    seq1 = [rnd(4, a, **t) for a, t in zip((3, 4), shared)]             # emits 4 + 5
    seconds = 0.10 + 0.10 + 0.05                                         # rounds, not rounds x sequences
    assert stats.batch_bound([seq0, seq1], ar_batch_tokens_per_s=20.0) == pytest.approx(19 / seconds / 20.0)
    assert stats.batch_bound([seq1, seq0], ar_batch_tokens_per_s=20.0) == pytest.approx(19 / seconds / 20.0)
    assert stats.batch_bound([seq0, seq1], ar_batch_tokens_per_s=None) is None
    assert stats.batch_bound([[], []], ar_batch_tokens_per_s=20.0) is None


# ---------------------------------------------------------------- its users

def gen_of(rounds: list[Round], decode_s: float, prefill_s: float = 1.0, tokens=None) -> Generation:
    n = 1 + sum(r.emitted for r in rounds)
    return Generation(tokens=tokens or [1] * n, prefill_s=prefill_s, decode_s=decode_s, rounds=rounds)


def test_generation_uses_the_definitions():
    gen = gen_of([rnd(10, 10), rnd(2, 0)], decode_s=3.0)
    assert gen.acceptance_rate == pytest.approx(10 / 12)
    assert gen.mean_accepted == pytest.approx(12 / 2) and gen.tokens_per_s == pytest.approx(12 / 3)


NAMES = {"model": "m", "task": "t", "source": "s", "method": "sparsespec"}


def sample(prompt_id: str, gen: Generation, ref: Generation) -> dict:
    return build_sample(prompt=SimpleNamespace(id=prompt_id, reference=None), gen=gen, ref=ref, names=NAMES, ctx=100,
                        text="", score=None, greedy=True)


def test_summary_speedup_is_the_geometric_mean_over_prompts_with_its_log_scale_interval():
    ar = [gen_of([rnd(0, 0)] * 6, decode_s=s) for s in (6.0, 3.0, 4.0)]
    method = [gen_of([rnd(4, 3), rnd(4, 1)], decode_s=s) for s in (2.0, 2.0, 1.0)]
    samples = [sample(f"p{i}", g, a) for i, (g, a) in enumerate(zip(method, ar))]
    per_prompt = [3.0, 1.5, 4.0]
    assert [s["speedup_vs_ar"] for s in samples] == pytest.approx(per_prompt)
    m = aggregate(samples)
    mean, low, high = log_scale_interval(per_prompt)
    assert m["speedup_vs_ar"] == pytest.approx(mean)                          # (3 * 1.5 * 4) ** (1/3), not 2.83
    assert m["speedup_vs_ar"] != pytest.approx(sum(per_prompt) / 3)
    assert m["speedup_vs_ar"] != pytest.approx(m["tokens_per_s"] / m["ar_tokens_per_s"])   # not pooled over pooled
    assert (m["speedup_vs_ar_ci95_low"], m["speedup_vs_ar_ci95_high"]) == (pytest.approx(low), pytest.approx(high))
    assert m["acceptance_rate"] == pytest.approx(12 / 24) and m["mean_accepted"] == pytest.approx(3.0)
    assert m["c_ar_s"] == pytest.approx(13 / 18)                               # AR seconds per AR token
    bounds = [stats.prompt_bound(g.rounds, a.decode_s / 6) for g, a in zip(method, ar)]
    assert m["bound"] == pytest.approx(math.prod(bounds) ** (1 / 3))           # per prompt, then the geometric mean
    assert m["bound_reached"] == pytest.approx(m["speedup_vs_ar"] / m["bound"])


def test_summary_of_skewed_speedups_keeps_its_interval_above_zero():
    """Prompts whose speed-ups are SKEWED: the summary's interval is the log-scale one, not mean +- t s/sqrt(n)."""
    ar = [gen_of([rnd(0, 0)] * 6, decode_s=6.0) for _ in SKEWED]
    method = [gen_of([rnd(5, 5)], decode_s=6.0 / r) for r in SKEWED]          # 6 tokens: speed-up r
    m = aggregate([sample(f"p{i}", g, a) for i, (g, a) in enumerate(zip(method, ar))])
    mean, low, high = log_scale_interval(SKEWED)
    assert (m["speedup_vs_ar"], m["speedup_vs_ar_ci95_low"], m["speedup_vs_ar_ci95_high"]) == pytest.approx(
        (mean, low, high))
    assert m["speedup_vs_ar_ci95_low"] > 0


def test_summary_of_one_prompt_has_its_speedup_and_no_interval():
    m = aggregate([sample("p0", gen_of([rnd(4, 3)], decode_s=1.0), gen_of([rnd(0, 0)] * 4, decode_s=2.0))])
    assert m["speedup_vs_ar"] == pytest.approx(2.0)
    assert m["speedup_vs_ar_ci95_low"] is None and m["speedup_vs_ar_ci95_high"] is None
    assert m["speedup_vs_ar_log_std"] is None


def test_batch_speedup_and_bound_are_geometric_means_over_batches():
    def row(batch: int, row: int, speedup: float, bound: float) -> dict:
        return {"batch_size": 2, "batch_row": row, "batch_speedup_vs_ar": speedup, "batch_bound": bound,
                "ar_batch_tokens_per_s": 10.0, "batch_tokens_per_s": 10.0 * speedup, "batch_decode_s": 1.0,
                "decode_s": 1.0, "prompt_id": f"{batch}/{row}"}
    batches = list(zip(SKEWED, (2.0, 3.0, 4.0, 24.0)))
    m = batch_metrics([row(b, r, speedup, bound) for b, (speedup, bound) in enumerate(batches) for r in (0, 1)])
    mean, low, high = log_scale_interval(SKEWED)                    # one ratio a batch: row 1 repeats row 0's
    assert (m["batch_speedup_vs_ar"], m["batch_speedup_vs_ar_ci95_low"], m["batch_speedup_vs_ar_ci95_high"]) == \
        pytest.approx((mean, low, high))
    assert m["batch_bound"] == pytest.approx((2 * 3 * 4 * 24) ** 0.25)
    assert m["batch_bound_reached"] == pytest.approx(mean / m["batch_bound"])


def test_lm_eval_aggregates_are_pooled_like_the_harness():
    request = SimpleNamespace(task_name="t", doc_id=0)
    gens = [gen_of([rnd(10, 10)], decode_s=1.0), gen_of([rnd(2, 0), rnd(2, 0)], decode_s=1.0)]
    records = [lm_eval_stats.request_record(request, g, "x") for g in gens]
    agg = lm_eval_stats.aggregate(records)
    assert agg["acceptance_rate"] == pytest.approx(10 / 14)                    # not (1.0 + 0.0) / 2
    assert agg["mean_accepted"] == pytest.approx(13 / 3) and agg["tokens_per_s"] == pytest.approx(13 / 2)
    table = lm_eval_stats.format_table(lm_eval_stats.report("sparsespec", {"k": 4}, records))
    assert table.splitlines()[0] == "sparsespec speculation statistics, method=sparsespec (k=4)"
    assert "| all " in table and f"{10 / 14:.3f}" in table


# ---------------------------------------------------------------- EOS and tables

class FakeModel:
    generation_config = SimpleNamespace(eos_token_id=[2, 7])


def test_eos_ids_come_from_the_argument_or_the_generation_config():
    assert eos.eos_token_ids(FakeModel()) == {2, 7}
    assert eos.eos_token_ids(FakeModel(), 5) == {5}
    assert eos.eos_token_ids(FakeModel(), extra=[9, None]) == {2, 7, 9}
    assert eos.eos_token_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))) == set()


def test_outputs_end_at_the_first_eos():
    tokens, stop = [5, 6, 2, 8, 2], {2}
    assert eos.through_eos(tokens, stop) == [5, 6, 2] and eos.before_eos(tokens, stop) == [5, 6]
    assert eos.through_eos(tokens, set()) == tokens and eos.before_eos([1], stop) == [1]


def test_markdown_table_formats_cells_one_way():
    text = markdown_table([{"a": 1.2345, "b": None, "c": "x|y", "d": 2000.0}], formats={"a": ".1f"})
    header, rule, row = text.splitlines()
    assert [c.strip() for c in header.strip("|").split("|")] == ["a", "b", "c", "d"]
    assert set(rule) <= {"|", "-"}
    assert [c.strip() for c in row.strip("|").split("\\|")[0].split("|")] == ["1.2", "–", "x"]
    assert row.rstrip().endswith("2000 |")
