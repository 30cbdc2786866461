"""Sampling keeps the target distribution: the rejection rule exactly, and the whole loop statistically."""
from __future__ import annotations

import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec.sampling import (Sampler, accept_sampling, acceptance_probability, residual_distribution,
                                 top_p_filter)


def output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the token emitted at a draft position: the draft d ~ q is kept with
    probability alpha(d), else a token comes from the residual. Uses the implementation's pieces."""
    out = torch.zeros_like(p, dtype=torch.float64)
    residual = residual_distribution(p, q).double()
    for d in range(p.numel()):
        alpha = acceptance_probability(p, q, d)
        out[d] += q[d].double() * alpha
        out += q[d].double() * (1 - alpha) * residual
    return out


def test_rejection_rule_reproduces_the_target_distribution_exactly():
    g = torch.Generator().manual_seed(0)
    for vocab in (2, 5, 17):
        for _ in range(20):
            p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, -1)
            q = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, -1)
            assert torch.allclose(output_distribution(p, q), p, atol=1e-12)


def test_rejection_rule_detects_a_wrong_residual():
    # the check above must be able to fail: resampling from p instead of the residual biases the output
    p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64)
    wrong = sum(q[d] * acceptance_probability(p, q, d) * torch.eye(3, dtype=torch.float64)[d]
                + q[d] * (1 - acceptance_probability(p, q, d)) * p for d in range(3))
    assert not torch.allclose(wrong, p, atol=1e-3)


def test_accept_sampling_empirically_matches_target():
    """The implementation (random draws included) at one draft position, by Monte Carlo."""
    g = torch.Generator().manual_seed(1)
    sampler = Sampler(temperature=1.0, generator=g)
    p_logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    q = torch.softmax(torch.tensor([-1.0, 0.0, 1.0, 2.0]), -1)
    counts = torch.zeros(4)
    n = 20_000
    for _ in range(n):
        d = torch.multinomial(q, 1, generator=g)
        accepted, nxt = accept_sampling(d, q.view(1, -1), torch.stack([p_logits, p_logits]), sampler)
        counts[int(d) if accepted == 1 else nxt] += 1
    target = torch.softmax(p_logits, -1)
    assert (counts / n - target).abs().max() < 0.015      # ~4 standard errors at n = 20000


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert torch.allclose(top_p_filter(probs, 0.75), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.allclose(top_p_filter(probs, 1.0), probs)


def exact_second_token_marginal(model, prompt, temperature):
    """P(token 2) = sum_t1 P(t1) P(t2 | t1), from the model's own logits."""
    with torch.no_grad():
        p1 = torch.softmax(model(prompt).logits[0, -1].double() / temperature, -1)
        extended = torch.cat([prompt.repeat(p1.numel(), 1), torch.arange(p1.numel()).view(-1, 1)], dim=1)
        p2 = torch.softmax(model(extended).logits[:, -1].double() / temperature, -1)
    return p1 @ p2


def test_speculative_sampling_matches_plain_sampling_distribution():
    """Seeded: the second token's empirical distribution under sparsespec (tiny budget, so drafts
    are often rejected) matches the model's exact marginal, as plain sampling does."""
    model = build_tiny("llama", vocab_size=12)
    prompt = random_prompt(80, seed=2, vocab=12)
    exact = exact_second_token_marginal(model, prompt, temperature=1.0)
    n = 600
    for method, opts in (("ar", {}), ("sparsespec", dict(controller="fixed", k=3, sink=2, recent=4, topk=4))):
        counts = torch.zeros(12, dtype=torch.float64)
        rejected = 0
        for seed in range(n):
            gen = sparsespec.generate(model, prompt, method=method, max_new_tokens=3, temperature=1.0,
                                      seed=seed, stop_at_eos=False, **opts)
            counts[gen.tokens[1]] += 1
            rejected += sum(r.drafted - r.accepted for r in gen.rounds)
        tv = 0.5 * (counts / n - exact).abs().sum().item()
        assert tv < 0.09, (method, tv)        # TV of 600 samples over 12 outcomes is ~0.04 by chance
        if method == "sparsespec":
            assert rejected > n // 4          # the rejection path was exercised


def test_sampling_is_reproducible_with_a_seed():
    model = build_tiny("qwen2")
    prompt = random_prompt(100, seed=4)
    a = sparsespec.generate(model, prompt, method="sparsespec", temperature=0.8, top_p=0.9, seed=5,
                            max_new_tokens=20, stop_at_eos=False, recent=8, budget=30)
    b = sparsespec.generate(model, prompt, method="sparsespec", temperature=0.8, top_p=0.9, seed=5,
                            max_new_tokens=20, stop_at_eos=False, recent=8, budget=30)
    assert a.tokens == b.tokens
