"""Build `pydoc_excerpts.jsonl`, the data of the local lm-eval test tasks, from Python's own docs.

The text is the language reference as shipped in the standard library (`pydoc_data/topics.py`),
found through `sysconfig`, so nothing here is written by this project. Run it from the repository
root to regenerate the committed file:

    python tests/lm_eval_tasks/make_pydoc_excerpts.py

Each row holds one excerpt of a topic:
- `context`: the topic's opening paragraphs, about 4,000 characters (roughly 1K tokens);
- `lead` / `continuation`: the first words of the paragraph that follows, and the rest of it (the
  generation task continues `context` + `lead`);
- `mc_context`: the last two paragraphs of `context` (the log-likelihood task's prompt);
- `choices` / `label`: the first line of the next paragraph among three first lines taken from
  other topics.
"""
from __future__ import annotations

import importlib.util
import json
import platform
import random
import sysconfig
from pathlib import Path

OUT = Path(__file__).with_name("pydoc_excerpts.jsonl")
N_EXCERPTS = 8
CONTEXT_CHARS = 4000
MAX_CONTEXT_CHARS = 6000
LEAD_WORDS = 4
MIN_TOPIC_CHARS = 6000
SEED = 0


def load_topics() -> dict[str, str]:
    path = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    spec = importlib.util.spec_from_file_location("pydoc_topics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.topics


def paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def first_line(paragraph: str) -> str:
    return paragraph.strip().splitlines()[0].strip()


def split_topic(text: str) -> tuple[list[str], str] | None:
    """Opening paragraphs of about CONTEXT_CHARS, and the next prose paragraph."""
    paras = paragraphs(text)
    context: list[str] = []
    for para in paras:
        size = sum(len(p) + 2 for p in context)
        if size >= MAX_CONTEXT_CHARS:
            return None
        if size >= CONTEXT_CHARS and is_prose(para):
            return context, para.strip()
        context.append(para)
    return None


def split_lead(paragraph: str) -> tuple[str, str]:
    """The first LEAD_WORDS words of a paragraph, and the rest of it (leading space kept)."""
    words = paragraph.split(" ")
    return " ".join(words[:LEAD_WORDS]), " " + " ".join(words[LEAD_WORDS:])


def is_prose(paragraph: str) -> bool:
    """A paragraph of a few sentences (not code, a signature, a grammar rule or a heading rule)."""
    line = paragraph.splitlines()[0]
    return (line[:1].isalpha() and len(line.split()) >= LEAD_WORDS + 4
            and len(paragraph.split()) >= 20)


def build_rows() -> list[dict]:
    topics = load_topics()
    names = sorted(n for n, t in topics.items() if len(t) >= MIN_TOPIC_CHARS)
    rng = random.Random(SEED)
    splits = {n: s for n in names if (s := split_topic(topics[n])) is not None}
    chosen = sorted(rng.sample(sorted(splits), N_EXCERPTS))
    rows = []
    for i, name in enumerate(chosen):
        context, following = splits[name]
        answer = first_line(following)
        lead, continuation = split_lead(following)
        others = [first_line(splits[o][1]) for o in sorted(splits) if o != name]
        choices = rng.sample(others, 3) + [answer]
        rng.shuffle(choices)
        rows.append({
            "id": i, "topic": name,
            "source": f"pydoc_data/topics.py (Python {platform.python_version()})",
            "context": "\n\n".join(context), "lead": lead, "continuation": continuation,
            "mc_context": "\n\n".join(context[-2:]),
            "choices": choices, "label": choices.index(answer),
        })
    return rows


def main() -> None:
    rows = build_rows()
    with OUT.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} excerpts to {OUT}")


if __name__ == "__main__":
    main()
