"""What several test modules share (imported as `from helpers import ...`: tests/ is on sys.path, as for
conftest): reference computations the analysis is checked against, done independently with scipy; the
exact enumeration of a sampled decode loop's output distribution and the model's own; a stand-in tokenizer."""
from __future__ import annotations

import itertools
import math
from contextlib import contextmanager

import numpy as np
import torch
from scipy import stats as scipy_stats

from sparsespec.engine.sampling import Sampler


def log_scale_interval(ratios, level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean and its Student-t interval on the log scale, exp(mean(log r) -+ t s / sqrt(n)), from
    scipy's one-sample t test of the logs."""
    logs = np.log(np.asarray(ratios, dtype=float))
    interval = scipy_stats.ttest_1samp(logs, 0.0).confidence_interval(level)
    return math.exp(logs.mean()), math.exp(interval.low), math.exp(interval.high)


# --- exact sampled distributions (tests/test_sampling.py, test_batch.py, test_fallback_lossless.py) ---

VOCAB, NEW, PROMPT = 3, 4, 16        # 4 tokens: a round of k=2, then rounds after a rejection
TOLERANCE = 1e-4                     # float32 logits through cache vs. one full forward: ~1e-7


class UniformOutcome:
    """What `Sampler.uniform()` returns while enumerating: `u < alpha` branches, true with weight alpha."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __lt__(self, alpha):
        alpha = min(max(float(alpha), 0.0), 1.0)
        return self.sampler.branch([alpha, 1.0 - alpha]) == 0


class EnumeratingSampler(Sampler):
    """Follows `path` (an option index per random choice), extending it with first options; records
    the number of options at each choice and the product of the chosen options' probabilities."""

    def __init__(self, path: list[int], **kwargs):
        super().__init__(**kwargs)
        self.path, self.options, self.weight = path, [], 1.0

    def branch(self, weights: list[float]) -> int:
        options = [i for i, w in enumerate(weights) if w > 1e-9]
        depth = len(self.options)
        if depth == len(self.path):
            self.path.append(0)
        self.options.append(len(options))
        chosen = options[self.path[depth]]
        self.weight *= weights[chosen]
        return chosen

    def draw(self, probs):
        weights = probs.double() / probs.double().sum()          # torch.multinomial normalises too
        return torch.tensor(self.branch(weights.tolist()), device=probs.device)

    def uniform(self, device):
        return UniformOutcome(self)


@contextmanager
def one_thread():
    """Thread-count-dependent float sums could flip an alpha of exactly 1; one thread is also faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def enumerate_outputs(decode_once, temperature=1.0, top_p=1.0) -> dict:
    """Exact output distribution of a decode loop: `decode_once(sampler)` runs the loop once with an
    EnumeratingSampler and returns the output's key; every branch of its random choices is visited,
    depth first, and each output weighted by its branch's probability."""
    dist, path = {}, []
    with one_thread():
        while True:
            sampler = EnumeratingSampler(path, temperature=temperature, top_p=top_p)
            key = decode_once(sampler)
            dist[key] = dist.get(key, 0.0) + sampler.weight
            while path and path[-1] + 1 >= sampler.options[len(path) - 1]:   # next branch, depth first
                path.pop()
            if not path:
                return dist
            path[-1] += 1


@torch.inference_mode()
def model_distribution(model, prompt, temperature=1.0, top_p=1.0, new=NEW) -> dict[tuple, float]:
    """P(x_1..x_new) = prod_t p(x_t | prompt, x_<t), every sequence in one batched forward."""
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=new)))          # (V^new, new)
    ids = torch.cat([prompt.view(1, -1).expand(len(seqs), -1), seqs], dim=1)
    n = prompt.numel()
    p = Sampler(temperature=temperature, top_p=top_p).probs(model(ids).logits[:, n - 1:n + new - 1]).double()
    probs = p.gather(-1, seqs.unsqueeze(-1)).squeeze(-1).prod(dim=-1)              # (V^new,)
    return {tuple(s): float(v) for s, v in zip(seqs.tolist(), probs)}


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(map(str, ids))
