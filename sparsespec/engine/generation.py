"""What one call of `sparsespec.generate` returns: the tokens, the timings and a per-round trace.

Counting convention (shared by every method, so ratios compare like with like):
- Prefill runs the prompt through the full model and yields the first new token.
- Every decode *round* drafts `drafted` tokens (0 for autoregressive decoding), verifies them in
  one full pass, accepts `accepted` of them and adds one token from the target (the correction or
  the bonus). It therefore emits `accepted + 1` tokens, fewer only when `max_new_tokens` or EOS
  cuts the last round short (`emitted`).
- So `len(tokens) == 1 + sum(r.emitted for r in rounds)`, and autoregressive decoding has
  `mean_accepted == 1.0`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sparsespec import stats


@dataclass
class Round:
    drafted: int                      # draft tokens sent to verification (the chosen k)
    accepted: int                     # draft tokens the target accepted
    emitted: int                      # tokens appended to the output this round (accepted + 1, capped)
    entropies: list[float]            # draft-distribution entropy (nats) of each drafted token
    draft_s: float                    # wall time of the k draft forwards (synchronised on GPU)
    verify_s: float                   # wall time of the verification forward
    select_s: float = 0.0             # wall time of selecting + gathering the draft KV for this round
    draft_steps: int = 0              # draft forwards run (can exceed `drafted` when the controller discards one)
    accept_probs: list[float] = field(default_factory=list)  # controller's p_i per drafted token
    survival: list[float] = field(default_factory=list)      # controller's pi_m = prod_{i<=m} p_i
    cost_draft: float | None = None   # controller's C_d estimate when it chose k (seconds)
    cost_verify: float | None = None  # controller's C_v(k) estimate when it chose k (seconds)
    cost_select: float | None = None  # controller's C_s estimate (a round's KV selection, seconds)
    choice: str = ""                  # the controller's reason for this round's k: "speculate", "probe",
                                      # "fallback" or "ar_probe" (k = 0: one AR step); "" when none
    cost_ar: float | None = None      # controller's C_AR estimate when it chose (seconds; None: unmeasured)
    threads: int = 0                  # intra-op threads the round ran with (sparsespec/engine/thread_rule.py)

    @property
    def seconds(self) -> float:
        """The whole round: KV selection, every draft step run, verification."""
        return self.select_s + self.draft_s + self.verify_s


@dataclass
class Generation:
    tokens: list[int]                 # new tokens only
    prefill_s: float
    decode_s: float
    rounds: list[Round]
    method: str = ""
    prompt_tokens: int = 0
    options: dict = field(default_factory=dict)   # the resolved method options

    @property
    def totals(self) -> stats.RoundTotals:
        return stats.round_totals(self.rounds)

    @property
    def decode_tokens(self) -> int:
        """Tokens produced by decode rounds (all but the prefill token)."""
        return self.totals.emitted

    @property
    def mean_accepted(self) -> float:
        """Mean tokens per round, bonus included: 1.0 for autoregressive decoding (`sparsespec.stats`)."""
        totals = self.totals
        return stats.mean_accepted(totals.emitted, totals.rounds)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over drafted ones, pooled over rounds; 0.0 when nothing was drafted."""
        totals = self.totals
        return stats.acceptance_rate(totals.accepted, totals.drafted)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: decode tokens over decode wall time (prefill excluded)."""
        return stats.tokens_per_s(self.decode_tokens, self.decode_s)

    @property
    def draft_s(self) -> float:
        return sum(r.draft_s for r in self.rounds)

    @property
    def verify_s(self) -> float:
        return sum(r.verify_s for r in self.rounds)

    @property
    def select_s(self) -> float:
        return sum(r.select_s for r in self.rounds)

    def time_split(self) -> dict[str, float]:
        """Seconds spent in each phase; `other` is decode time outside draft/verify/select."""
        other = self.decode_s - self.draft_s - self.verify_s - self.select_s
        return {"prefill": self.prefill_s, "draft": self.draft_s, "verify": self.verify_s,
                "select": self.select_s, "other": max(other, 0.0)}

    def summary(self) -> dict:
        """Scalar metrics, as logged by the harness."""
        return {"method": self.method, "prompt_tokens": self.prompt_tokens,
                "new_tokens": len(self.tokens), "num_rounds": len(self.rounds),
                "prefill_s": self.prefill_s, "decode_s": self.decode_s,
                "tokens_per_s": self.tokens_per_s, "mean_accepted": self.mean_accepted,
                "acceptance_rate": self.acceptance_rate,
                **{f"{k}_s_total": v for k, v in self.time_split().items() if k != "prefill"}}

    def to_dict(self) -> dict:
        """Everything, JSON-serialisable (the per-round trace included)."""
        d = asdict(self)
        d.update(self.summary())
        return d
