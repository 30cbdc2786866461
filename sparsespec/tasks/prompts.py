"""A `Prompt`, and fitting a document into an exact token budget with LongBench's middle truncation."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparsespec.errors import ConfigError
from sparsespec.tasks.scoring import score

MIN_DOCUMENT_TOKENS = 32   # below this the "long-context" prompt is all instructions: refuse it
MAX_FIT_ROUNDS = 8         # re-tokenizing the cut text shifts the count by a few tokens; this converges in 1-2


@dataclass
class Prompt:
    id: str                    # stable within (task, source, seed): resuming a run keys on it
    input_ids: list[int]       # the full prompt in the model's tokens, at most `context_tokens` long
    reference: str | None      # reference answer / continuation / summary, None when there is none
    meta: dict = field(default_factory=dict)  # task, source, metric, document provenance, ...

    def score(self, text: str) -> float | None:
        """The task metric of a generated `text` against this prompt's reference(s)."""
        return score(self.meta["metric"], text, self.meta.get("answers", self.reference))


def encode_prompt(tokenizer, content: str, chat: bool) -> list[int]:
    """Token ids of `content` as one user turn of the model's chat template, or as plain text.

    Plain text gets the tokenizer's own special tokens (a BOS where the model expects one); a
    rendered chat template already holds them, so it is tokenized without adding more.
    """
    if chat and tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(content).input_ids


def cut_middle(tokenizer, document_ids: list[int], budget: int) -> str:
    """LongBench's truncation: keep the first and the last `budget / 2` tokens of the document."""
    head = budget // 2
    tail = budget - head
    decode = lambda ids: tokenizer.decode(ids, clean_up_tokenization_spaces=False)  # noqa: E731
    return decode(document_ids[:head]) + decode(document_ids[len(document_ids) - tail:])


def fit_to_context(tokenizer, document: str, wrap: Callable[[str], str], context_tokens: int,
                   chat: bool) -> tuple[list[int], str]:
    """Encode `wrap(document)`, cutting the document (never the instructions) in the middle so
    that the whole prompt is at most `context_tokens` tokens. Returns (ids, the kept document)."""
    overhead = len(encode_prompt(tokenizer, wrap(""), chat))
    budget = context_tokens - overhead
    if budget < MIN_DOCUMENT_TOKENS:
        raise ConfigError(f"context_tokens={context_tokens} is too small: the instructions alone take "
                          f"{overhead} tokens; use at least {overhead + MIN_DOCUMENT_TOKENS}")
    document_ids = tokenizer(document, add_special_tokens=False).input_ids
    for _ in range(MAX_FIT_ROUNDS):
        kept = document if len(document_ids) <= budget else cut_middle(tokenizer, document_ids, budget)
        ids = encode_prompt(tokenizer, wrap(kept), chat)
        if len(ids) <= context_tokens:
            return ids, kept
        budget -= len(ids) - context_tokens
    raise RuntimeError(f"could not fit the prompt into {context_tokens} tokens in {MAX_FIT_ROUNDS} rounds")


def head_and_tail_chars(text: str, context_tokens: int, chars_per_token: int = 32) -> str:
    """Drop the middle of a huge text before tokenizing it: no real text averages more than
    `chars_per_token` characters a token, so the token-level cut later sees the same head and tail."""
    keep = context_tokens * chars_per_token
    return text if len(text) <= 2 * keep else text[:keep] + text[-keep:]
