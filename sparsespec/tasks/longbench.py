"""LongBench subsets and LongBench v2, from the hub or from a local file or folder.

Prompts follow LongBench's templates (config/dataset2prompt.json), with the chat template for
every subset but the code ones, and LongBench's middle truncation applied to the context only.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from sparsespec.errors import ConfigError, UnavailableError
from sparsespec.tasks.prompts import Prompt, fit_to_context, head_and_tail_chars

LONGBENCH_HUB = "Xnhyacinth/LongBench"    # the parquet mirror lm-eval uses; THUDM/LongBench needs a loading script
LONGBENCH_V2_HUB = "THUDM/LongBench-v2"

SUBSETS = {  # the first one is the default
    "summarization": ("gov_report", "multi_news"),
    "qa": ("narrativeqa", "qasper", "hotpotqa"),
    "code": ("lcc", "repobench-p"),
}
METRICS = {"gov_report": "rouge_l", "multi_news": "rouge_l", "narrativeqa": "qa_f1", "qasper": "qa_f1",
           "hotpotqa": "qa_f1", "lcc": "code_sim", "repobench-p": "code_sim"}
PLAIN_TEXT_SUBSETS = ("lcc", "repobench-p")  # LongBench gives code completion no chat template

TEMPLATES = {
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
                  "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}"
                  "\n\nNow, write a one-page summary of all the news.\n\nSummary:",
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
                   "question asconcisely as you can, using a single phrase if possible. Do not provide any "
                   "explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as "
                   "you can, using a single phrase if possible. Do not provide any explanation.\n\n"
                   "Question: {input}\n\nAnswer:",
    "qasper": "You are given a scientific article and a question. Answer the question as concisely as you can, using "
              "a single phrase or sentence if possible. If the question cannot be answered based on the information "
              "in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", "
              "or \"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question "
              "based on the above article as concisely as you can, using a single phrase or sentence if possible. If "
              "the question cannot be answered based on the information in the article, write \"unanswerable\". If "
              "the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any "
              "explanation.\n\nQuestion: {input}\n\nAnswer:",
    "hotpotqa": "Answer the question based on the given passages. Only give me the answer and do not output any other "
                "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
                "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

V2_DOMAINS = {  # LongBench v2 has no summarization domain
    "qa": ("Single-Document QA", "Multi-Document QA"),
    "code": ("Code Repository Understanding",),
}
V2_ALL_DOMAINS = ("Single-Document QA", "Multi-Document QA", "Long In-context Learning",
                  "Long-dialogue History Understanding", "Code Repository Understanding",
                  "Long Structured Data Understanding")
V2_TEMPLATE = ("Please read the following text and answer the question below.\n\n<text>\n{context}\n</text>\n\n"
               "What is the correct answer to this question: {question}\nChoices:\n(A) {A}\n(B) {B}\n(C) {C}\n(D) {D}"
               "\n\nFormat your response as follows: \"The correct answer is (insert answer here)\".")
CHAT_TEMPLATE_SLACK = 64  # upper bound on tokens a chat template adds around the user turn


# ---------------------------------------------------------------------------------------------
# Reading rows


def read_rows(path: str | None, hub_id: str, subset: str | None, patterns: list[str]) -> list[dict]:
    """Rows of a local file, of the first files in a local folder matching `patterns`, or of the hub dataset."""
    if path is None:
        return _hub_rows(hub_id, subset)
    location = Path(path).expanduser()
    if location.is_file():
        return _file_rows(location)
    if not location.is_dir():
        raise UnavailableError(f"task.path={path} does not exist; point it at a LongBench file or folder")
    for pattern in patterns:
        files = sorted(location.glob(pattern))
        if files:
            return [row for file in files for row in _file_rows(file)]
    raise UnavailableError(f"task.path={path} holds no file matching {' or '.join(patterns)}")


def _file_rows(file: Path) -> list[dict]:
    if file.suffix == ".parquet":
        import pyarrow.parquet

        return pyarrow.parquet.read_table(file).to_pylist()
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".jsonl" or not text.lstrip().startswith("["):
        return [_json_line(file, number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise _malformed(file, err.lineno, err) from None


def _json_line(file: Path, number: int, line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise _malformed(file, number, err) from None


def _malformed(file: Path, line: int, err: json.JSONDecodeError) -> ConfigError:
    return ConfigError(f"task.path: {file} line {line} is not valid JSON ({err.msg}, column {err.colno}); "
                       f"fix that line or point task.path at a valid JSON/JSONL file")


def _hub_rows(hub_id: str, subset: str | None) -> list[dict]:
    import datasets

    split = "train" if hub_id == LONGBENCH_V2_HUB else "test"
    try:
        return list(datasets.load_dataset(hub_id, subset, split=split))
    except (OSError, ValueError) as err:  # offline: ConnectionError / DatasetNotFoundError / missing-cache ValueError
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnavailableError(
            f"dataset {hub_id}{'/' + subset if subset else ''} is not available here ({cause}); download it on a "
            f"machine with access (`hf download {hub_id} --repo-type dataset`) and set task.path to the folder "
            f"or file") from None


# ---------------------------------------------------------------------------------------------
# Rows to prompts


def longbench_prompt(row: dict, subset: str, tokenizer, context_tokens: int) -> Prompt:
    question = row.get("input", row.get("question")) or ""  # the parquet mirror renames `input` to `question`
    answers = [str(a) for a in row["answers"]]
    wrap = lambda doc: TEMPLATES[subset].format(context=doc, input=question)  # noqa: E731
    ids, kept = fit_to_context(tokenizer, head_and_tail_chars(row["context"], context_tokens), wrap,
                               context_tokens, chat=subset not in PLAIN_TEXT_SUBSETS)
    return Prompt(id=f"{subset}/{row['_id']}", input_ids=ids, reference=answers[0] if answers else None,
                  meta={"metric": METRICS[subset], "answers": answers, "subset": subset,
                        "truncated": kept != row["context"]})


def longbench_v2_prompt(row: dict, tokenizer, context_tokens: int) -> Prompt:
    choices = {letter: row[f"choice_{letter}"] for letter in "ABCD"}
    wrap = lambda doc: V2_TEMPLATE.format(context=doc, question=row["question"], **choices)  # noqa: E731
    ids, kept = fit_to_context(tokenizer, head_and_tail_chars(row["context"], context_tokens), wrap,
                               context_tokens, chat=True)
    return Prompt(id=f"v2/{row['_id']}", input_ids=ids, reference=row["answer"],
                  meta={"metric": "choice", "domain": row.get("domain"), "difficulty": row.get("difficulty"),
                        "truncated": kept != row["context"]})


def select_prompts(rows: list[dict], build: Callable[[dict], Prompt], *, label: str, context_tokens: int,
                   num_prompts: int, seed: int, min_fill: float, prompt_text: Callable[[dict], str]) -> list[Prompt]:
    """Rows in a seeded order, keeping those whose prompt fills `min_fill` of the context."""
    order = list(range(len(rows)))
    random.Random(f"{label}/{seed}").shuffle(order)
    prompts = []
    for i in order:
        # A token covers at least one UTF-8 byte, so a prompt this short in bytes cannot fill the context.
        if len(prompt_text(rows[i]).encode("utf-8")) + CHAT_TEMPLATE_SLACK < min_fill * context_tokens:
            continue
        prompt = build(rows[i])
        if len(prompt.input_ids) >= min_fill * context_tokens:
            prompts.append(prompt)
            if len(prompts) == num_prompts:
                return prompts
    raise ConfigError(f"{label}: only {len(prompts)} of {len(rows)} documents fill {min_fill:.0%} of "
                      f"context_tokens={context_tokens} (num_prompts={num_prompts}); use a smaller ctx, "
                      f"source=longbench_v2, or task.min_fill=0 to accept shorter prompts")


def load_longbench(task: str, *, tokenizer, context_tokens: int, num_prompts: int, seed: int,
                   path: str | None, subset: str | None, min_fill: float) -> list[Prompt]:
    subset = subset or SUBSETS[task][0]
    if subset not in SUBSETS[task]:
        raise ConfigError(f"task.subset={subset!r} is not a LongBench {task} subset; accepted: "
                          f"{', '.join(SUBSETS[task])}")
    patterns = [f"{subset}.jsonl", f"{subset}.json", f"{subset}.parquet", f"data/{subset}.jsonl",
                f"{subset}/*.parquet", f"**/{subset}/*.parquet", f"**/{subset}-*.parquet", f"**/{subset}.jsonl"]
    rows = [row for row in read_rows(path, LONGBENCH_HUB, subset, patterns)
            if row.get("dataset", subset) == subset]  # a combined file holds every subset, tagged by `dataset`
    return select_prompts(
        rows, lambda row: longbench_prompt(row, subset, tokenizer, context_tokens), label=f"longbench/{subset}",
        context_tokens=context_tokens, num_prompts=num_prompts, seed=seed, min_fill=min_fill,
        prompt_text=lambda row: TEMPLATES[subset] + row["context"] + str(row.get("input", row.get("question"))))


def load_longbench_v2(task: str, *, tokenizer, context_tokens: int, num_prompts: int, seed: int,
                      path: str | None, subset: str | None, min_fill: float) -> list[Prompt]:
    if task not in V2_DOMAINS:
        raise ConfigError(f"LongBench v2 has no {task} task; accepted with source=longbench_v2: "
                          f"{', '.join(V2_DOMAINS)}")
    if subset is not None and subset not in V2_ALL_DOMAINS:
        raise ConfigError(f"task.subset={subset!r} is not a LongBench v2 domain; accepted: "
                          f"{', '.join(V2_ALL_DOMAINS)}")
    domains = (subset,) if subset else V2_DOMAINS[task]
    rows = [row for row in read_rows(path, LONGBENCH_V2_HUB, None, ["data.json", "*.json", "*.jsonl", "*.parquet",
                                                                    "data/*.parquet"])
            if row["domain"] in domains]
    return select_prompts(
        rows, lambda row: longbench_v2_prompt(row, tokenizer, context_tokens), label=f"longbench_v2/{task}",
        context_tokens=context_tokens, num_prompts=num_prompts, seed=seed, min_fill=min_fill,
        prompt_text=lambda row: V2_TEMPLATE + row["context"] + row["question"])
