"""The decode engine: one batch-shaped loop (loop.py) over a preallocated batch cache (cache.py,
batch_cache.py), its attention hooks (attention.py), draft selection and gathering (selection.py),
acceptance and sampling (sampling.py), the target's logits (logits.py), EOS (eos.py), timing
(timing.py), the shared prefill (prefill.py, prefill_disk.py), draft weights (draft_weights.py), the
proposer contract and decode state (proposers.py) and the result types (generation.py). Methods,
controllers and the harness build on it; it imports none of them."""
