"""End-of-sequence handling, in one place: which tokens end generation, and where an output ends.

Decoding (`sparsespec.api`) stops after an EOS when asked to; the harness may time a fixed
number of tokens past it (`stop_at_eos=false`) but its text and score still end at the first EOS;
the lm-eval model adds lm-eval's end-of-text token to the model's own.
"""
from __future__ import annotations

from typing import Iterable


def eos_token_ids(model, eos_token_id=None, *, extra: Iterable[int | None] = ()) -> set[int]:
    """`eos_token_id` (an id or a list of ids) when given, else the model's generation config's,
    plus `extra`; the empty set when there is none."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = eos_token_id if isinstance(eos_token_id, (list, tuple, set)) else [eos_token_id]
    return {int(i) for i in (*ids, *extra) if i is not None}


def first_eos(tokens: list[int], eos: set[int]) -> int | None:
    """Index of the first EOS in `tokens`, None when there is none."""
    return next((i for i, token in enumerate(tokens) if token in eos), None)


def through_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """`tokens` up to and including the first EOS (what decoding emits when it stops there)."""
    i = first_eos(tokens, eos)
    return list(tokens) if i is None else list(tokens[:i + 1])


def before_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """`tokens` up to, without, the first EOS (the output's text)."""
    i = first_eos(tokens, eos)
    return list(tokens) if i is None else list(tokens[:i])
