"""The RULER-style retrieval task: seeded, sized to the context, evidence at the stated depth, every
answer recoverable from the prompt alone, and exact-match scoring."""
from __future__ import annotations

import json
import re

import pytest
from tiny_tokenizer import tiny_tokenizer

from sparsespec.errors import ConfigError
from sparsespec.tasks import load_prompts, score
from sparsespec.tasks.retrieval import DEPTH_ORDER, VARIANTS, check_options

CTX = 2000


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def retrieval(tokenizer, ctx=CTX, n=5, seed=0, **options):
    return load_prompts("retrieval", source="embedded", tokenizer=tokenizer, context_tokens=ctx, num_prompts=n,
                        seed=seed, **options)


def one_line_error(call) -> str:
    with pytest.raises(ConfigError) as error:
        call()
    message = str(error.value)
    assert message and "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------
# A reader that answers from the prompt text alone, knowing only the templates' fixed phrases


def question_of(text: str) -> str:
    return text.rsplit("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>", 1)[0].rsplit("\n\n", 1)[1]


def read_answer(text: str, variant: str) -> list[str]:
    question = question_of(text)
    if variant == "variable_tracking":
        value = re.search(r"assigned the value (\d+) ", question).group(1)
        chain = dict(re.findall(r"^VAR ([A-Z]+) = (.+)$", text, re.MULTILINE))
        def holds(name: str) -> bool:                                       # follows the chain back to a number
            return chain[name] == value or (chain[name].startswith("VAR ") and holds(chain[name][4:]))
        return [name for name in chain if holds(name)]
    if variant == "qa":
        module, summary = re.search(r"module (\S+) is documented as \"(.+)\"\?$", question).groups()
        entries = re.findall(rf"^{re.escape(module)}\.(\w+)\(.*\): {re.escape(summary)}$", text, re.MULTILINE)
        return entries
    key = re.search(r"magic numbers? for (\w+) mentioned", question).group(1)
    return re.findall(rf"^One of the special magic numbers for {key} is: (\d+)\.$", text, re.MULTILINE)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_answer_is_recoverable_from_the_prompt_alone(tokenizer, variant):
    for ctx in (1000, 4000):
        for prompt in retrieval(tokenizer, ctx=ctx, n=3, variant=variant):
            text = tokenizer.decode(prompt.input_ids)
            answer = read_answer(text, variant)
            assert ", ".join(answer) == prompt.reference and answer, (prompt.id, answer)
            assert prompt.score(" ".join(answer)) == 1.0
            assert prompt.score("I do not know.") == 0.0
            for line in prompt.meta["evidence"]:
                assert text.count(f"\n{line}\n") == 1                       # each evidence line once, on its own line


def test_distractors_differ_from_the_asked_evidence(tokenizer):
    multikey, qa = (retrieval(tokenizer, n=2, variant=v)[1] for v in ("niah_multikey", "qa"))
    text = tokenizer.decode(multikey.input_ids)
    numbers = re.findall(r"^One of the special magic numbers for (\w+) is: (\d+)\.$", text, re.MULTILINE)
    assert len(numbers) == 4 and len({key for key, _ in numbers}) == 4
    assert [value for _, value in numbers].count(multikey.reference) == 1
    assert score("exact_match", next(v for _, v in numbers if v != multikey.reference), multikey.reference) == 0.0
    assert len(qa.meta["distractor_depths"]) == 3 and len(multikey.meta["distractor_depths"]) == 3


# ---------------------------------------------------------------------------------------------
# Depth


def haystack_tokens_before(tokenizer, prompt, line: str) -> tuple[int, int]:
    """Counted from the decoded prompt: tokens of the haystack (the document without its inserted
    lines) before `line`, and in all."""
    text = tokenizer.decode(prompt.input_ids)
    inserted = set(re.findall(r"^(?:One of the special magic numbers .*|VAR [A-Z]+ = .*|\S+\.\w+\(.*\): .*)$",
                              text, re.MULTILINE))
    body = text.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]                  # instructions above, question below
    body = body.split("\n\nAnswer the question based on the given document.")[0]   # qa repeats its instruction
    lines = body.split("\n")
    before = lines[:lines.index(line)]
    count = lambda ls: len(tokenizer("\n".join(ls), add_special_tokens=False).input_ids)  # noqa: E731
    return count([x for x in before if x not in inserted]), count([x for x in lines if x not in inserted])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("ctx, off", [(800, 0.08), (4000, 0.02)])   # lines are coarser in a short haystack
def test_evidence_sits_at_the_stated_depth(tokenizer, variant, depth, ctx, off):
    prompt = retrieval(tokenizer, ctx=ctx, n=1, variant=variant, depth=depth)[0]
    assert prompt.meta["requested_depth"] == depth
    assert abs(prompt.meta["depth"] - depth) <= off                        # the nearest line start
    before, total = haystack_tokens_before(tokenizer, prompt, prompt.meta["evidence"][0])
    assert abs(before / total - prompt.meta["depth"]) <= 0.01              # the recorded depth is the real one
    depths = prompt.meta["evidence_depths"]
    assert depths[0] == prompt.meta["depth"] and depths == sorted(depths)  # the rest follow towards the end
    for line, recorded in zip(prompt.meta["evidence"], depths):
        before, total = haystack_tokens_before(tokenizer, prompt, line)
        assert abs(before / total - recorded) <= 0.01


@pytest.mark.parametrize("depth", [0.0, 1.0])
def test_evidence_at_the_very_start_or_end_stays_a_line_of_its_own(tokenizer, depth):
    for variant in VARIANTS:
        prompt = retrieval(tokenizer, ctx=1000, n=1, variant=variant, depth=depth)[0]
        text = tokenizer.decode(prompt.input_ids)
        assert ", ".join(read_answer(text, variant)) == prompt.reference
        assert prompt.meta["depth"] == depth
        body = text.split("\n\n", 1)[1]
        evidence = prompt.meta["evidence"]
        if depth == 0.0:
            assert body.startswith(evidence[0] + "\n")
        else:                                         # every needed line last, in order, before the question
            assert "\n" + "\n".join(evidence) + "\n\n" in body


def test_default_depths_cycle_from_10_to_90_percent_and_variants_take_turns(tokenizer):
    prompts = retrieval(tokenizer, n=10)
    assert [p.meta["variant"] for p in prompts] == list(VARIANTS) * 2
    assert [p.meta["requested_depth"] for p in prompts] == [*DEPTH_ORDER, DEPTH_ORDER[0]]
    assert sorted(DEPTH_ORDER) == pytest.approx([0.1 * i for i in range(1, 10)])
    assert {p.meta["requested_depth"] for p in prompts[:3]} == {0.1, 0.5, 0.9}
    for prompt in prompts:
        assert abs(prompt.meta["depth"] - prompt.meta["requested_depth"]) <= 0.05
        assert prompt.id.startswith(f"{prompts.index(prompt):03d}:{prompt.meta['variant']}:")


# ---------------------------------------------------------------------------------------------
# Determinism and size


def test_prompts_are_deterministic_from_the_seed(tokenizer):
    first, again = retrieval(tokenizer), retrieval(tokenizer)
    assert [p.input_ids for p in first] == [p.input_ids for p in again]
    assert [(p.id, p.reference, p.meta) for p in first] == [(p.id, p.reference, p.meta) for p in again]
    other = retrieval(tokenizer, seed=1)
    assert all(a.reference != b.reference for a, b in zip(first, other))   # new keys, values and names
    assert retrieval(tokenizer, n=2)[1].input_ids == first[1].input_ids     # prompt i ignores num_prompts
    assert len({tuple(p.input_ids) for p in first}) == 5


@pytest.mark.parametrize("variant", VARIANTS)
def test_prompts_fill_the_context_budget(tokenizer, variant):
    for ctx in (700, CTX, 8000):
        for prompt in retrieval(tokenizer, ctx=ctx, n=2, variant=variant):
            assert 0.97 * ctx <= len(prompt.input_ids) <= ctx, (ctx, len(prompt.input_ids))
            assert prompt.meta["context_tokens"] == len(prompt.input_ids) and prompt.meta["truncated"]
            text = tokenizer.decode(prompt.input_ids)
            assert text.startswith("<|im_start|>user\n") and "<|im_end|>\n<|im_start|>assistant\n" in text


def test_the_reply_starts_with_the_answer_prefix(tokenizer):
    prompt = retrieval(tokenizer, n=1, variant="niah_single")[0]
    key = re.search(r"for (\w+) mentioned", question_of(tokenizer.decode(prompt.input_ids))).group(1)
    assert tokenizer.decode(prompt.input_ids).endswith(
        f"<|im_start|>assistant\nThe special magic number for {key} mentioned in the provided text is")


# ---------------------------------------------------------------------------------------------
# Scoring


def test_exact_match_scores_known_answers():
    assert score("retrieval", "The special magic number is 4821937.", "4821937") == 1.0
    assert score("exact_match", " 4821937", "4821937") == 1.0
    assert score("exact_match", "48219370", "4821937") == 0.0                # not inside a longer number
    assert score("exact_match", "4821936", "4821937") == 0.0
    assert score("exact_match", "they are: ABCDE, FGHIJ and KLMNO", "ABCDE, FGHIJ, KLMNO, PQRST") == 0.75
    assert score("exact_match", "abcde fghij", "ABCDE, FGHIJ") == 1.0         # case-insensitive
    assert score("exact_match", "Answer: token_urlsafe", "token_urlsafe") == 1.0
    assert score("exact_match", "Answer: token_urlsafe_x", "token_urlsafe") == 0.0


# ---------------------------------------------------------------------------------------------
# Errors: one line, naming the value and what is accepted


@pytest.mark.parametrize("options, words", [
    (dict(variant="needle"), ["task.variant='needle'", "mixed, niah_single", "qa"]),
    (dict(depth=1.5), ["task.depth=1.5", "from 0 to 1"]),
    (dict(depth="deep"), ["task.depth='deep'"]),
    (dict(context_tokens=150), ["context_tokens=150", "too small"]),
    (dict(context_tokens=2_000_000), ["2000000", "smaller ctx"]),
    (dict(source="longbench"), ["task.source='longbench'", "task.source=embedded"]),
])
def test_bad_options_are_one_line_errors(tokenizer, options, words):
    arguments = {"source": "embedded", "tokenizer": tokenizer, "context_tokens": CTX, "num_prompts": 1, **options}
    message = one_line_error(lambda: load_prompts("retrieval", **arguments))
    for word in words:
        assert word in message, message


def test_other_tasks_refuse_retrieval_options(tokenizer):
    message = one_line_error(lambda: load_prompts("qa", source="embedded", tokenizer=tokenizer, context_tokens=CTX,
                                                  num_prompts=1, variant="niah_single"))
    assert "task=retrieval" in message and "task=qa" in message
    check_options("mixed", None)                                            # the defaults pass
    check_options("qa", 0.0)


# ---------------------------------------------------------------------------------------------
# The real model, end to end


@pytest.mark.slow
@pytest.mark.real_model
def test_a_retrieval_run_records_depth_and_scores_beside_speed(tmp_path, cli_here):
    """`python run.py task=retrieval` at a small context (run in this process): every sample records its
    depth and an exact-match score, and greedy SparseSpec-L's output, hence its score, equals AR's."""
    out = tmp_path / "run"
    result = cli_here(tmp_path, "task=retrieval", "ctx=1k", "num_prompts=3", "max_new_tokens=12", "logger=none",
                      "warmup=false", "cost_profile=false", f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["prompt_id"].split(":")[1] for s in samples] == list(VARIANTS[:3])
    for sample, depth in zip(samples, DEPTH_ORDER):
        assert sample["task"] == "retrieval" and abs(sample["depth"] - depth) <= 0.05
        assert sample["outputs_match_ar"] is True
        assert sample["score"] == score("exact_match", sample["text"], sample["reference"])
        assert 900 <= sample["context_tokens"] <= 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["score_mean"] == pytest.approx(sum(s["score"] for s in samples) / 3)
