"""Token choice and verification: greedy matching and exact speculative rejection sampling.

Both keep the output distribution of plain decoding:
- greedy: accept the longest prefix where draft == target argmax, then append the target's token;
- sampling (Leviathan et al. / Chen et al.): accept d_i with probability min(1, p(d_i) / q(d_i));
  on the first rejection draw from norm(max(0, p - q)); if all k are accepted draw a bonus from p.
p and q are the target's and the draft's distributions after the same temperature and top-p.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampler:
    temperature: float = 0.0          # 0 means greedy
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits -> (..., V) float32 probabilities after temperature and top-p."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = top_p_filter(probs, self.top_p)
        return probs

    def pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token from (V,) logits: (token (), its distribution or None when greedy)."""
        if self.greedy:
            return logits.argmax(dim=-1), None
        probs = self.probs(logits)
        return self.draw(probs), probs

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def uniform(self, device) -> float:
        return torch.rand((), generator=self.generator, device=device).item()


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of softmax(logits) over the last dim."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def accept_sampling(draft: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                    sampler: Sampler) -> tuple[int, int]:
    """Exact rejection sampling. draft (k,), draft_probs (k, V) (None: deterministic one-hot drafts,
    e.g. prompt lookup), target_logits (k+1, V) -> (accepted count, the next token)."""
    k = draft.shape[0]
    p = sampler.probs(target_logits)                                       # (k+1, V)
    if draft_probs is None:
        draft_probs = torch.zeros_like(p[:k]).scatter_(-1, draft.view(-1, 1), 1.0)
    for i in range(k):
        token = int(draft[i])
        if sampler.uniform(p.device) < acceptance_probability(p[i], draft_probs[i], token):
            continue
        return i, int(sampler.draw(residual_distribution(p[i], draft_probs[i])))
    return k, int(sampler.draw(p[k]))


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, token: int) -> float:
    """min(1, p(token) / q(token)) for (V,) distributions; q(token) > 0 as token was drawn from q."""
    q_tok = float(q[token])
    return 1.0 if q_tok <= 0 else min(1.0, float(p[token]) / q_tok)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to draw from after a rejection."""
    residual = (p - q).clamp_min(0.0)
    return residual / residual.sum()
