"""RULER-style synthetic retrieval over real text: facts hidden at a chosen depth of a long document.

The haystack is Python's language reference (`pydoc_data/topics.py`, as in the embedded tasks); the
evidence is inserted as lines of its own, each at a line start near a chosen depth (the fraction of
the haystack's tokens before it). Variants, after RULER (Hsieh et al., 2024):

- niah_single: one needle "One of the special magic numbers for <key> is: <7 digits>."; asked for it.
- niah_multikey: the asked needle among distractor needles with other keys, at other depths.
- niah_multivalue: one key with several numbers; all are asked for.
- variable_tracking: a chain "VAR A = 12345", "VAR B = VAR A", ...; asked which variables hold 12345.
- qa: a documentation entry of a standard-library function (its name and the first line of its
  docstring, read from the source with `ast`) among entries of other functions; asked which
  function the quoted line documents.

The prompt is one user turn in the chat template followed by RULER's answer prefix, so the model's
first words are the answer. The reference holds the expected items joined by ", "; the `exact_match`
metric scores the share of them that the output contains verbatim.

Prompt i draws its variant (`variant="mixed"`: the five in turn), its depth (`depth=None`: the
order of DEPTH_ORDER in turn), the starting topic of its haystack and its keys and values from
generators seeded by (seed, i): it does not depend on how many prompts are asked for.
"""
from __future__ import annotations

import ast
import bisect
import functools
import random
import re
import string
from collections import Counter
from dataclasses import dataclass

from sparsespec.errors import ConfigError
from sparsespec.tasks.embedded import (FILL_MARGIN, count_tokens, language_reference, read_source,
                                       stdlib_sources, topics_document)
from sparsespec.tasks.prompts import MAX_FIT_ROUNDS, MIN_DOCUMENT_TOKENS, Prompt, encode_prompt

VARIANTS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "qa")
MIXED = "mixed"                  # prompt i takes VARIANTS[i % 5]: one run covers every family
DEPTH_ORDER = (0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6)  # 10%-90%; any first 3 prompts span the range
MULTIKEY_NEEDLES = 4             # RULER's niah_multikey_1: the asked needle and 3 distractors
MULTIVALUE_VALUES = 4            # RULER's niah_multivalue: 4 numbers for one key
CHAIN_VARIABLES = 5              # RULER's variable_tracking: 1 chain of 4 hops, 5 variables
QA_ENTRIES = 4                   # the asked documentation entry and 3 distractors, as many as multikey
KEY_LENGTHS = (6, 12)            # needle keys: words of the language reference this long (short ones are too common)
SUMMARY_WORDS = (6, 30)          # qa: a docstring's first line this many words long is a sentence worth quoting
QA_MODULE_TRIES = 200            # qa: modules read (in seeded order) to find one with enough documented functions

NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_BEFORE = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the numbers afterwards.\n\n")
NIAH_QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
NIAH_PREFIX = "The special magic number for {key} mentioned in the provided text is"
MULTIVALUE_QUESTION = "What are all the special magic numbers for {key} mentioned in the provided text?"
MULTIVALUE_PREFIX = "The special magic numbers for {key} mentioned in the provided text are"
VT_BEFORE = "Memorize and track the chain of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {value} in the text above."
VT_PREFIX = ("Answer: According to the chain of variable assignment in the text above, {count} variables are "
             "assigned the value {value}, they are:")
QA_BEFORE = ("Answer the question based on the given document. Only give me the answer and do not output any "
             "other words.\n\n")
QA_QUESTION = ("Answer the question based on the given document. Only give me the answer and do not output any "
               "other words.\n\nQuestion: Which function of the module {module} is documented as \"{summary}\"?")
QA_PREFIX = "Answer:"


@dataclass
class PromptContent:
    """One prompt's content before sizing: the evidence to insert and what is asked."""
    inserts: list[tuple[float, str, bool]]   # (depth, line, whether the answer needs it), in insertion order
    before: str                              # instructions above the document
    question: str                            # below the document
    answer_prefix: str                       # the start of the answer, after the chat turn
    answers: list[str]                       # the expected items, all of them


# ---------------------------------------------------------------------------------------------
# Options


def check_options(variant: str, depth: float | None) -> None:
    """One-line ConfigError for a variant or depth the generator does not take."""
    if variant not in (MIXED, *VARIANTS):
        raise ConfigError(f"task.variant={variant!r} is unknown; accepted: {', '.join((MIXED, *VARIANTS))}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, (int, float))
                              or not 0.0 <= depth <= 1.0):
        raise ConfigError(f"task.depth={depth!r} must be a number from 0 to 1 (the fraction of the document "
                          f"before the evidence), or null for the 10%-90% grid")


def variant_of(index: int, variant: str) -> str:
    return VARIANTS[index % len(VARIANTS)] if variant == MIXED else variant


def depth_of(index: int, depth: float | None) -> float:
    return DEPTH_ORDER[index % len(DEPTH_ORDER)] if depth is None else float(depth)


def spread(depth: float, count: int) -> list[float]:
    """The first item at `depth`, the rest evenly spaced between it and the end of the document."""
    return [depth + j * (1.0 - depth) / count for j in range(count)]


# ---------------------------------------------------------------------------------------------
# Vocabulary from the real texts


@functools.lru_cache(maxsize=1)
def key_words() -> tuple[str, ...]:
    """Distinct lowercase words of the language reference, sorted: the needles' keys."""
    words = {w for _, text in language_reference() for w in re.findall(r"\b[a-z]+\b", text)}
    return tuple(sorted(w for w in words if KEY_LENGTHS[0] <= len(w) <= KEY_LENGTHS[1]))


def magic_numbers(rng: random.Random, count: int) -> list[str]:
    """`count` distinct 7-digit numbers (RULER's values)."""
    return [str(n) for n in rng.sample(range(1_000_000, 10_000_000), count)]


def variable_names(rng: random.Random, count: int) -> list[str]:
    """`count` distinct names of 5 capital letters (RULER's variables)."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    return names


@functools.lru_cache(maxsize=None)
def documented_functions(relpath: str) -> tuple[tuple[str, str, str], ...]:
    """(name, signature, first docstring line) of a module's public top-level functions whose
    first docstring line is a sentence, each line unique within the module."""
    try:
        tree = ast.parse(read_source(relpath))
    except SyntaxError:
        return ()
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            summary = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
            if SUMMARY_WORDS[0] <= len(summary.split()) <= SUMMARY_WORDS[1] and summary.endswith(".") \
                    and '"' not in summary:
                found.append((node.name, ast.unparse(node.args), summary))
    counts = Counter(summary for _, _, summary in found)
    return tuple(f for f in found if counts[f[2]] == 1)


def module_name(relpath: str) -> str:
    name = relpath.removesuffix(".py").replace("/", ".").replace("\\", ".")
    return name.removesuffix(".__init__")


# ---------------------------------------------------------------------------------------------
# The five families


def niah_single(rng: random.Random, depth: float) -> PromptContent:
    key, = rng.sample(key_words(), 1)
    value, = magic_numbers(rng, 1)
    return PromptContent([(depth, NEEDLE.format(key=key, value=value), True)], NIAH_BEFORE,
                NIAH_QUESTION.format(key=key), NIAH_PREFIX.format(key=key), [value])


def niah_multikey(rng: random.Random, depth: float) -> PromptContent:
    keys = rng.sample(key_words(), MULTIKEY_NEEDLES)
    values = magic_numbers(rng, MULTIKEY_NEEDLES)
    asked = [(depth, NEEDLE.format(key=keys[0], value=values[0]), True)]
    distractors = [(rng.uniform(0.0, 1.0), NEEDLE.format(key=k, value=v), False) for k, v in zip(keys[1:], values[1:])]
    return PromptContent(asked + distractors, NIAH_BEFORE, NIAH_QUESTION.format(key=keys[0]),
                NIAH_PREFIX.format(key=keys[0]), [values[0]])


def niah_multivalue(rng: random.Random, depth: float) -> PromptContent:
    key, = rng.sample(key_words(), 1)
    values = magic_numbers(rng, MULTIVALUE_VALUES)
    inserts = [(d, NEEDLE.format(key=key, value=v), True) for d, v in zip(spread(depth, MULTIVALUE_VALUES), values)]
    return PromptContent(inserts, NIAH_BEFORE, MULTIVALUE_QUESTION.format(key=key), MULTIVALUE_PREFIX.format(key=key),
                         values)


def variable_tracking(rng: random.Random, depth: float) -> PromptContent:
    names = variable_names(rng, CHAIN_VARIABLES)
    value = str(rng.randrange(10_000, 100_000))
    lines = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]
    inserts = [(d, line, True) for d, line in zip(spread(depth, CHAIN_VARIABLES), lines)]
    return PromptContent(inserts, VT_BEFORE, VT_QUESTION.format(value=value),
                VT_PREFIX.format(count=CHAIN_VARIABLES, value=value), names)


def qa(rng: random.Random, depth: float) -> PromptContent:
    modules = sorted(stdlib_sources())
    rng.shuffle(modules)
    for relpath in modules[:QA_MODULE_TRIES]:
        functions = documented_functions(relpath)
        if len(functions) >= QA_ENTRIES:
            break
    else:
        raise ConfigError(f"no standard-library module among {QA_MODULE_TRIES} tried has {QA_ENTRIES} documented "
                          f"functions; use task.variant=niah_single")
    module = module_name(relpath)
    chosen = rng.sample(functions, QA_ENTRIES)
    entries = [f"{module}.{name}({signature}): {summary}" for name, signature, summary in chosen]
    inserts = [(depth, entries[0], True)] + [(rng.uniform(0.0, 1.0), entry, False) for entry in entries[1:]]
    return PromptContent(inserts, QA_BEFORE, QA_QUESTION.format(module=module, summary=chosen[0][2]), QA_PREFIX,
                [chosen[0][0]])


FAMILIES = {"niah_single": niah_single, "niah_multikey": niah_multikey, "niah_multivalue": niah_multivalue,
            "variable_tracking": variable_tracking, "qa": qa}


# ---------------------------------------------------------------------------------------------
# Placing the evidence and sizing the prompt


def line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in re.finditer("\n", text)]


def anchors_at_depths(tokenizer, haystack: str, depths: list[float]) -> tuple[list[int], list[float]]:
    """For each depth, the line start of the haystack nearest to it in tokens (the end for depth 1),
    and the depth that line start really has: the fraction of the haystack's tokens before it."""
    spans = tokenizer(haystack, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    token_starts = [start for start, _ in spans]
    starts = line_starts(haystack)
    anchors, placed = [], []
    for depth in depths:
        if depth >= 1.0:
            anchor = len(haystack)
        else:
            char = token_starts[min(int(depth * len(spans)), len(spans) - 1)]
            i = bisect.bisect_left(starts, char)
            anchor = min(starts[max(i - 1, 0):i + 1], key=lambda s: abs(s - char))
        anchors.append(anchor)
        placed.append(round(bisect.bisect_left(token_starts, anchor) / len(spans), 3))
    return anchors, placed


def insert_lines(haystack: str, anchors: list[int], lines: list[str]) -> str:
    """The haystack with lines[j] inserted as a line of its own at character offset anchors[j]
    (a line start, or the end); lines at one anchor keep their given order."""
    pieces, position = [], 0
    for j in sorted(range(len(lines)), key=lambda j: (anchors[j], j)):
        text = haystack[position:anchors[j]]
        if text and not text.endswith("\n"):
            text += "\n"                                   # only at the very end: give the insert its own line
        pieces += [text, lines[j] + "\n"]
        position = anchors[j]
    pieces.append(haystack[position:])
    return "".join(pieces)


def encode_with_prefix(tokenizer, content: str, answer_prefix: str) -> list[int]:
    """The user turn in the chat template, then the answer prefix as the start of the reply."""
    ids = encode_prompt(tokenizer, content, chat=True)
    separator = "" if tokenizer.chat_template else "\n\n"
    return ids + tokenizer(separator + answer_prefix, add_special_tokens=False).input_ids


def retrieval_prompt(index: int, variant: str, depth: float, start: int, tokenizer, context_tokens: int,
                     rng: random.Random) -> Prompt:
    """The haystack starting at topic `start`, cut to the budget (its head kept: depths are measured
    in what the prompt holds), with `variant`'s evidence inserted; at most `context_tokens` tokens.
    meta["depth"] is the depth of the first line the answer needs, as RULER measures it: the fraction
    of the haystack's tokens (the real text, inserted lines not counted) before it."""
    content = FAMILIES[variant](rng, depth)
    wrap = lambda doc: content.before + doc + "\n\n" + content.question  # noqa: E731
    evidence = "".join(line + "\n" for _, line, _ in content.inserts)
    overhead = len(encode_with_prefix(tokenizer, wrap(evidence), content.answer_prefix))
    budget = context_tokens - overhead
    if budget < MIN_DOCUMENT_TOKENS:
        raise ConfigError(f"context_tokens={context_tokens} is too small for a {variant} prompt: the instructions "
                          f"and evidence take {overhead} tokens; use at least {overhead + MIN_DOCUMENT_TOKENS}")
    source, topics = topics_document(start, tokenizer, budget + FILL_MARGIN)
    spans = tokenizer(source, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for _ in range(MAX_FIT_ROUNDS):
        haystack = source[:spans[min(budget, len(spans)) - 1][1]]
        anchors, depths = anchors_at_depths(tokenizer, haystack, [d for d, _, _ in content.inserts])
        document = insert_lines(haystack, anchors, [line for _, line, _ in content.inserts])
        ids = encode_with_prefix(tokenizer, wrap(document), content.answer_prefix)
        if len(ids) <= context_tokens:
            needed = [is_needed for _, _, is_needed in content.inserts]
            asked = [d for d, is_needed in zip(depths, needed) if is_needed]
            return Prompt(id=f"{index:03d}:{variant}:{depth:.2f}", input_ids=ids, reference=", ".join(content.answers),
                          meta={"metric": "exact_match", "variant": variant, "depth": asked[0],
                                "requested_depth": depth, "evidence_depths": asked,
                                "distractor_depths": [d for d, is_needed in zip(depths, needed) if not is_needed],
                                "evidence": [line for _, line, needed in content.inserts if needed],
                                "topics": topics, "truncated": len(haystack) < len(source)})
        budget -= len(ids) - context_tokens
    raise RuntimeError(f"could not fit the {variant} prompt into {context_tokens} tokens in {MAX_FIT_ROUNDS} rounds")


def load_retrieval(*, tokenizer, context_tokens: int, num_prompts: int, seed: int, min_fill: float,
                   variant: str, depth: float | None) -> list[Prompt]:
    check_options(variant, depth)
    starts = list(range(len(language_reference())))
    random.Random(f"retrieval/{seed}").shuffle(starts)
    prompts = []
    for index in range(num_prompts):
        rng = random.Random(f"retrieval/{seed}/{index}")
        prompt = retrieval_prompt(index, variant_of(index, variant), depth_of(index, depth),
                                  starts[index % len(starts)], tokenizer, context_tokens, rng)
        if len(prompt.input_ids) < min_fill * context_tokens:
            raise ConfigError(f"the retrieval haystack holds only {len(prompt.input_ids)} tokens for "
                              f"context_tokens={context_tokens} in this tokenizer; use a smaller ctx")
        prompts.append(prompt)
    return prompts
