"""Offline tasks from real text that ships with Python, found through `sysconfig` (never a fixed path).

- summarization: consecutive topics of the language reference (`pydoc_data/topics.py`).
- qa: the same kind of document, and a question whose answer is in it: which section holds a quoted
  sentence. The reference is that section's title.
- code: a standard-library module cut at a line, after other modules as repository context; the
  reference is the true next lines of the file.

Prompt i takes the i-th document of an order seeded by (task, seed), and its question or cut line
from a generator seeded by (task, seed, i): it does not depend on how many prompts are asked for,
and a different seed draws different documents.
"""
from __future__ import annotations

import ast
import functools
import os
import random
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sparsespec.errors import ConfigError, UnavailableError
from sparsespec.tasks.prompts import MIN_DOCUMENT_TOKENS, Prompt, fit_to_context

FILL_MARGIN = 64                 # gather this many tokens beyond the context, so the cut always happens
REPEAT_MIN_CHARS = 200           # paragraphs this long that recur mark a topic as a duplicate section
NEEDLE_TRIES = 8                 # QA: needles tried per document, and documents tried (the first nearly always fits)
QUESTION_ALLOWANCE = 96          # tokens reserved for the question before it is chosen (a sentence is <= 40 words)
MIN_TARGET_LINES = 300           # code: long enough that the cut lands in real code, past the imports
REFERENCE_LINES = 5              # code: the continuation kept as the reference
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
                "pydoc_data", "encodings"}  # tests, third-party code, prose, and codec tables are not the code we want
HEADING_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")
SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z\"'])")

SUMMARIZATION_BEFORE = ("You are given part of the Python language reference. Write a one-page summary of it."
                        "\n\nDocumentation:\n")
SUMMARIZATION_AFTER = "\n\nNow, write a one-page summary of the documentation.\n\nSummary:"
QA_BEFORE = ("You are given part of the Python language reference and a question about it. Answer with the "
             "section title only. Do not provide any explanation.\n\nDocumentation:\n")
QA_AFTER = ("\n\nNow, answer the question based on the documentation. Answer with the section title only."
            "\n\nQuestion: Which section of the documentation contains this sentence: \"{sentence}\"\n\nAnswer:")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


# ---------------------------------------------------------------------------------------------
# Corpora


@functools.lru_cache(maxsize=1)
def language_reference() -> tuple[tuple[str, str], ...]:
    """(key, text) of the distinct topics in pydoc_data/topics.py, read as data, in file order."""
    path = stdlib_dir() / "pydoc_data" / "topics.py"
    if not path.is_file():
        raise UnavailableError(f"the embedded prose corpus {path} is missing from this Python; "
                               f"use a Python that ships pydoc_data, or task.source=longbench")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            return distinct_topics([(key, text.strip()) for key, text in ast.literal_eval(node.value).items()])
    raise UnavailableError(f"{path} holds no `topics` dict; use task.source=longbench")


def distinct_topics(topics: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Drop topics that repeat a long paragraph of a longer topic ('try' is a section of 'compound'):
    a document must not contain the same passage twice, which would flatter copy-based drafting."""
    seen, kept = set(), set()
    for key, text in sorted(topics, key=lambda topic: -len(topic[1])):
        paragraphs = {p for p in text.split("\n\n") if len(p) > REPEAT_MIN_CHARS}
        if not paragraphs & seen:
            kept.add(key)
            seen |= paragraphs
    return tuple(topic for topic in topics if topic[0] in kept)


@functools.lru_cache(maxsize=1)
def stdlib_sources() -> tuple[str, ...]:
    """Paths (relative to the stdlib folder) of the standard library's own, non-test modules."""
    root = stdlib_dir()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        found += [os.path.relpath(os.path.join(folder, f), root) for f in sorted(files)
                  if f.endswith(".py") and not f.startswith("test_")]
    return tuple(found)


def read_source(relpath: str) -> str:
    return (stdlib_dir() / relpath).read_text(encoding="utf-8", errors="replace")


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


# ---------------------------------------------------------------------------------------------
# Summarization and QA over the language reference


@dataclass
class Section:
    title: str
    start: int          # character offset of the title line in the document
    end: int            # character offset where the next section (or the document) begins


def topics_document(start: int, tokenizer, tokens_wanted: int) -> tuple[str, list[str]]:
    """Topics start, start+1, ... (wrapping around once) joined until they hold `tokens_wanted` tokens."""
    topics = language_reference()
    texts, keys, count = [], [], 0
    for k in range(len(topics)):
        key, text = topics[(start + k) % len(topics)]  # wraps around, never repeats a topic
        texts.append(text)
        keys.append(key)
        count += count_tokens(tokenizer, text)
        if count >= tokens_wanted:
            break
    return "\n\n".join(texts), keys


def sections_of(document: str) -> list[Section]:
    """reST-style sections: a title line underlined by a run of * = - ~ or ^ of the same length."""
    lines = document.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    sections = []
    for i in range(len(lines) - 1):
        title, underline = lines[i].strip(), lines[i + 1]
        if title and HEADING_UNDERLINE.match(underline) and len(underline) == len(lines[i]):
            if sections:
                sections[-1].end = offsets[i]
            sections.append(Section(title, offsets[i], len(document)))
    return sections


def quotable_sentences(document: str, section: Section) -> list[tuple[str, int]]:
    """(sentence, character offset where its paragraph ends) for prose sentences of 8-40 words.

    A prose paragraph has all its lines at one indentation (definitions are indented prose; code
    and grammar blocks are indented further or hold `::=` / `>>>`). Whitespace is collapsed.
    """
    underline_end = document.find("\n", document.index("\n", section.start) + 1)
    if underline_end < 0 or underline_end >= section.end:
        return []
    body_start = underline_end + 1  # past the title and its underline
    found = []
    position = body_start
    for paragraph in document[body_start:section.end].split("\n\n"):
        paragraph_end = position + len(paragraph)
        position = paragraph_end + 2
        lines = [line for line in paragraph.split("\n") if line.strip()]
        if not lines or len({len(line) - len(line.lstrip()) for line in lines}) > 1 \
                or any(marker in paragraph for marker in ("::=", ">>>")):
            continue
        for sentence in SENTENCE_END.split(" ".join(" ".join(lines).split())):
            words = sentence.split()
            if 8 <= len(words) <= 40 and sentence.endswith(".") and \
                    sum(w.strip(".,;:()'\"").isalpha() for w in words) >= 0.7 * len(words):
                found.append((sentence, paragraph_end))
    return found


def kept_regions(tokenizer, document: str, budget: int) -> tuple[int, int]:
    """Character offsets (head_end, tail_start): text before head_end and after tail_start is what
    middle truncation to `budget` tokens keeps."""
    spans = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(spans) <= budget:
        return len(document), 0
    head = budget // 2
    return spans[head - 1][1], spans[len(spans) - (budget - head)][0]


def needle_candidates(tokenizer, document: str, budget: int, rng: random.Random) -> list[tuple[Section, str, int]]:
    """(section, sentence, end of its paragraph) in random order, such that the text from the title
    to the sentence lies inside one kept region, the title is unique among the document's headings,
    and the sentence is unique in the document."""
    head_end, tail_start = kept_regions(tokenizer, document, budget)
    sections = sections_of(document)
    title_counts = Counter(section.title for section in sections)
    flat = " ".join(document.split())
    candidates = [(section, sentence, end) for section in sections if title_counts[section.title] == 1
                  for sentence, end in quotable_sentences(document, section)
                  if (end <= head_end or section.start >= tail_start) and flat.count(sentence) == 1]
    rng.shuffle(candidates)
    return candidates


def summarization_prompt(index: int, start: int, tokenizer, context_tokens: int) -> Prompt:
    document, keys = topics_document(start, tokenizer, context_tokens + FILL_MARGIN)
    wrap = lambda doc: SUMMARIZATION_BEFORE + doc + SUMMARIZATION_AFTER  # noqa: E731
    ids, kept = fit_to_context(tokenizer, document, wrap, context_tokens, chat=True)
    return Prompt(id=f"{index:03d}:{keys[0]}", input_ids=ids, reference=None,
                  meta={"metric": "rouge_l", "topics": keys, "truncated": kept != document})


def qa_prompt(index: int, start: int, tokenizer, context_tokens: int, rng: random.Random) -> Prompt:
    """A question about the document that begins at topic `start`, or at the next topics when no
    section title and sentence of it fit together in what truncation keeps (small contexts)."""
    placeholder = QA_BEFORE + QA_AFTER.format(sentence=" ".join(["word"] * QUESTION_ALLOWANCE))
    budget_estimate = context_tokens - count_tokens(tokenizer, placeholder) - 16  # 16: chat-template tokens
    if budget_estimate < MIN_DOCUMENT_TOKENS:
        raise ConfigError(f"context_tokens={context_tokens} is too small for a QA prompt: the instructions and "
                          f"question take up to {context_tokens - budget_estimate} tokens")
    for shift in range(NEEDLE_TRIES):
        document, keys = topics_document(start + shift, tokenizer, context_tokens + FILL_MARGIN)
        # The real budget differs from the estimate by a few tokens, so each needle is checked after fitting.
        for section, sentence, end in needle_candidates(tokenizer, document, budget_estimate, rng)[:NEEDLE_TRIES]:
            wrap = lambda doc: QA_BEFORE + doc + QA_AFTER.format(sentence=sentence)  # noqa: E731
            ids, kept = fit_to_context(tokenizer, document, wrap, context_tokens, chat=True)
            if document[section.start:end] in kept:
                return Prompt(id=f"{index:03d}:{keys[0]}:{section.title}", input_ids=ids, reference=section.title,
                              meta={"metric": "qa_f1", "topics": keys, "sentence": sentence,
                                    "depth": round(kept.index(document[section.start:end]) / len(kept), 3),
                                    "truncated": kept != document})
    raise ConfigError(f"context_tokens={context_tokens} is too small to keep a QA section title together with "
                      f"a sentence of it; use a larger ctx")


# ---------------------------------------------------------------------------------------------
# Code completion over the standard library


def code_prompt(index: int, order: list[str], target: str, tokenizer, context_tokens: int,
                rng: random.Random) -> Prompt:
    """Other modules as repository context, then `target` up to a line; the reference is the next lines.

    Plain text, not a chat turn: the reference is the literal continuation, a chat turn would invite
    prose and markdown fences, and LongBench also skips the template for lcc and repobench-p. The
    prompt stops at the end of a line, without its newline, so the model writes the newline and the
    indentation as the tokenizer would merge them.
    """
    source = read_source(target)
    lines = source.split("\n")
    cut = rng.choice([i for i in statement_lines(source) if len(lines) // 2 <= i < len(lines) - REFERENCE_LINES])
    prefix = f"# Path: {target}\n" + "\n".join(lines[:cut])
    context, used = [], count_tokens(tokenizer, prefix)
    for relpath in order[order.index(target) + 1:] + order[:order.index(target)]:
        if used >= context_tokens + FILL_MARGIN:
            break
        text = f"# Path: {relpath}\n{read_source(relpath).rstrip()}\n\n\n"
        context.append(text)
        used += count_tokens(tokenizer, text)
    document = "".join(context) + prefix
    ids, kept = fit_to_context(tokenizer, document, lambda doc: doc, context_tokens, chat=False)
    return Prompt(id=f"{index:03d}:{target}:{cut + 1}", input_ids=ids,
                  reference="\n".join(lines[cut:cut + REFERENCE_LINES]),
                  meta={"metric": "code_sim", "file": target, "line": cut + 1, "context_files": len(context),
                        "truncated": kept != document})


def statement_lines(source: str) -> list[int]:
    """0-based lines where a statement starts (docstrings excluded): the cut points whose continuation is code."""
    return sorted({node.lineno - 1 for node in ast.walk(ast.parse(source)) if isinstance(node, ast.stmt)
                   and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))})


def is_code_target(relpath: str) -> bool:
    """Long enough to cut in its second half, and parseable by this Python."""
    source = read_source(relpath)
    if source.count("\n") < MIN_TARGET_LINES:
        return False
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def code_targets(seed: int) -> list[str]:
    order = sorted(stdlib_sources())
    random.Random(f"embedded/code/{seed}").shuffle(order)
    return order


# ---------------------------------------------------------------------------------------------


def load_embedded(task: str, *, tokenizer, context_tokens: int, num_prompts: int, seed: int,
                  min_fill: float) -> list[Prompt]:
    prompts = []
    if task == "code":
        order = code_targets(seed)
        targets = (p for p in order if is_code_target(p))
        for index in range(num_prompts):
            target = next(targets, None)
            if target is None:
                raise ConfigError(f"num_prompts={num_prompts} exceeds the {index} long stdlib modules available")
            rng = random.Random(f"embedded/code/{seed}/{index}")
            prompts.append(code_prompt(index, order, target, tokenizer, context_tokens, rng))
    else:
        topics = language_reference()
        if num_prompts > len(topics):
            raise ConfigError(f"num_prompts={num_prompts} exceeds the {len(topics)} distinct documents of the "
                              f"embedded {task} task (one per starting topic)")
        starts = list(range(len(topics)))
        random.Random(f"embedded/{task}/{seed}").shuffle(starts)
        for index in range(num_prompts):
            if task == "summarization":
                prompts.append(summarization_prompt(index, starts[index], tokenizer, context_tokens))
            else:
                rng = random.Random(f"embedded/{task}/{seed}/{index}")
                prompts.append(qa_prompt(index, starts[index], tokenizer, context_tokens, rng))
    for prompt in prompts:
        if len(prompt.input_ids) < min_fill * context_tokens:
            raise ConfigError(f"the embedded {task} corpus holds only {len(prompt.input_ids)} tokens for "
                              f"context_tokens={context_tokens} in this tokenizer; use a smaller ctx, or "
                              f"task.source=longbench_v2")
    return prompts
