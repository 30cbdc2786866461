"""`sparsespec` (SparseSpec-L): top-K by the attention the previous verification pass paid to each
position, recorded in that same pass (no extra forward): summed over the verified queries and the
query heads of each KV group, per layer and KV head. Round one uses the prefill observation window
(`snapkv_static`'s). `score_decay` > 0 keeps an EMA over rounds instead of the last pass only."""
from __future__ import annotations

from dataclasses import dataclass

from sparsespec.engine.attention import attention_received
from sparsespec.options import in_range, option
from sparsespec.methods.policies.snapkv_static import SnapKVStaticPolicy


class RecycledVerificationPolicy(SnapKVStaticPolicy):
    name = "sparsespec"
    default_controller = "entropy"

    @dataclass(frozen=True)
    class Options(SnapKVStaticPolicy.Options):
        score_decay: float = option(0.0, "0: scores of the last verification only; > 0: EMA over rounds",
                                    check=in_range(0, 1))

    def __init__(self, model, *, score_decay: float, **common):
        super().__init__(model, **common)
        self.score_decay = score_decay

    def verification_observer(self):
        return self.observe_verification if self.budget.topk > 0 else None

    def observe_verification(self, layer, probs) -> None:
        self.observed[layer] = attention_received(probs)                  # (Hkv, N)

    def after_verify(self, state, accepted) -> None:
        self.absorb(self.observed)

    def absorb(self, observed) -> None:
        """importance[:, :N] <- decay * importance[:, :N] + this pass's attention received."""
        if not self.score_decay:
            return super().absorb(observed)
        for layer, new in observed.items():
            self.importance[layer][:, :new.shape[-1]].mul_(self.score_decay).add_(new)
        observed.clear()
