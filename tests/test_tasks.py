"""Prompt building: exact context lengths, middle truncation, honest references, benchmark loaders, errors."""
from __future__ import annotations

import copy
import json
import re

import pytest
from conftest import lines_printed_offline
from tiny_tokenizer import tiny_tokenizer

from sparsespec.errors import ConfigError, UnavailableError
from sparsespec.tasks import TASKS, Prompt, load_prompts, score
from sparsespec.tasks.embedded import read_source
from sparsespec.tasks.prompts import fit_to_context

CTX = 1024


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from sparsespec.models import load_tokenizer

    return load_tokenizer({"name": "smollm2_135m", "embedded": "smollm2_135m"})


def embedded(task, tokenizer, ctx=CTX, n=2, seed=0):
    return load_prompts(task, source="embedded", tokenizer=tokenizer, context_tokens=ctx, num_prompts=n, seed=seed)


def assert_one_line(error):
    message = str(error.value)
    assert message and "\n" not in message, message


# ---------------------------------------------------------------------------------------------
# Embedded tasks


@pytest.mark.parametrize("task", TASKS)
def test_embedded_prompts_fill_the_context_exactly(task, tokenizer):
    for ctx in (512 if task != "qa" else 768, CTX, 3000):   # a QA needle needs a few hundred tokens
        for prompt in embedded(task, tokenizer, ctx=ctx):
            assert 0.97 * ctx <= len(prompt.input_ids) <= ctx, (task, ctx, len(prompt.input_ids))
            assert prompt.meta["context_tokens"] == len(prompt.input_ids)
            assert prompt.meta["truncated"]


@pytest.mark.parametrize("task", TASKS)
def test_embedded_prompts_are_deterministic_and_vary_with_seed_and_index(task, tokenizer):
    first, second = embedded(task, tokenizer, n=3), embedded(task, tokenizer, n=3)
    assert [p.input_ids for p in first] == [p.input_ids for p in second]
    assert [p.id for p in first] == [p.id for p in second]
    assert len({tuple(p.input_ids) for p in first}) == 3            # prompt index -> different document
    assert len({p.id for p in first}) == 3
    other_seed = embedded(task, tokenizer, n=3, seed=1)
    assert sum(a.input_ids != b.input_ids for a, b in zip(first, other_seed)) >= 2  # seeds draw independently
    assert embedded(task, tokenizer, n=1)[0].input_ids == first[0].input_ids  # independent of num_prompts


@pytest.mark.parametrize("task", ["summarization", "qa"])
def test_prose_tasks_use_the_chat_template(task, tokenizer):
    text = tokenizer.decode(embedded(task, tokenizer, n=1)[0].input_ids)
    assert text.startswith("<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_without_a_chat_template_prompts_are_plain_text(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    text = plain.decode(embedded("summarization", plain, n=1)[0].input_ids)
    assert text.startswith("You are given part of the Python language reference")
    assert "<|im_start|>" not in text


def test_qa_answer_and_quoted_sentence_are_in_the_document(tokenizer):
    for ctx in (768, CTX, 4000):
        for prompt in embedded("qa", tokenizer, ctx=ctx, n=3):
            text = tokenizer.decode(prompt.input_ids)
            document, question = text.split("\n\nNow, answer the question based on the documentation.")
            title = prompt.reference
            assert f"\n{title}\n" in document                           # the answer, as a section heading
            sentence = prompt.meta["sentence"]
            assert sentence in question
            flat = " ".join(document.split())
            assert flat.count(sentence) == 1
            assert flat.index(" ".join(title.split())) < flat.index(sentence)  # heading above the sentence
            assert prompt.score(title) == 1.0 and prompt.score("no idea") == 0.0


def test_qa_needles_come_from_different_depths(tokenizer):
    prompts = embedded("qa", tokenizer, ctx=4000, n=8)
    depths = {p.meta["depth"] for p in prompts}
    assert len(depths) >= 3 and max(depths) > 0.5
    for prompt in prompts:     # the depth of the section in the document the prompt holds (after the cut)
        text = tokenizer.decode(prompt.input_ids)
        document = text.split("Documentation:\n", 1)[1].split("\n\nNow, answer the question")[0]
        position = f"\n{document}".index(f"\n{prompt.reference}\n")      # the title's line
        assert abs(position / len(document) - prompt.meta["depth"]) <= 0.01


def test_code_reference_is_the_true_continuation(tokenizer):
    for prompt in embedded("code", tokenizer, ctx=CTX, n=3):
        text = tokenizer.decode(prompt.input_ids)
        source = read_source(prompt.meta["file"])
        lines = source.split("\n")
        line = prompt.meta["line"]                                  # 1-based line where the reference starts
        assert prompt.reference == "\n".join(lines[line - 1:line + 4])
        assert prompt.reference.strip() and not lines[line - 1].lstrip().startswith("#")
        tail = text[-300:]
        assert "\n".join(lines[:line - 1]).endswith(tail)             # the prompt ends right before it
        assert "<|im_start|>" not in text                           # code is a plain continuation
        assert prompt.score(prompt.reference) == 1.0 and prompt.score("pass") < 0.5


def test_code_fills_long_contexts_with_other_modules_as_repository_context(tokenizer):
    prompt = embedded("code", tokenizer, ctx=20_000, n=1)[0]
    text = tokenizer.decode(prompt.input_ids)
    assert prompt.meta["context_files"] >= 1
    assert text.startswith("# Path: ") and f"# Path: {prompt.meta['file']}\n" in text


def test_summarization_has_no_reference(tokenizer):
    prompt = embedded("summarization", tokenizer, n=1)[0]
    assert prompt.reference is None and prompt.score("anything") is None


# ---------------------------------------------------------------------------------------------
# Middle truncation


def test_middle_truncation_keeps_head_and_tail(tokenizer):
    document = "\n".join(f"line {i:05d} of the document" for i in range(3000))
    wrap = lambda doc: f"Read this.\n{doc}\nThe end."  # noqa: E731
    ids, kept = fit_to_context(tokenizer, document, wrap, 500, chat=True)
    assert 490 <= len(ids) <= 500
    assert kept.startswith("line 00000 of the document\nline 00001")
    assert kept.endswith("line 02998 of the document\nline 02999 of the document")
    assert "line 01500 " not in kept
    kept_lines = [int(n) for n in re.findall(r"line (\d{5}) ", kept)]
    head = sum(n < 1500 for n in kept_lines)
    assert 0.4 < head / len(kept_lines) < 0.6                        # about half the budget on each side
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nRead this.\n") and "The end.<|im_end|>" in text


def test_a_short_document_is_not_truncated(tokenizer):
    ids, kept = fit_to_context(tokenizer, "a short document", lambda d: f"Q: {d}", 200, chat=False)
    assert kept == "a short document" and len(ids) < 200


# ---------------------------------------------------------------------------------------------
# Errors: one line, naming the value and what is accepted


@pytest.mark.parametrize("kwargs, words", [
    (dict(task="translation", source="embedded"), ["translation", "summarization, qa, code"]),
    (dict(task="qa", source="arxiv"), ["arxiv", "embedded, longbench, longbench_v2"]),
    (dict(task="qa", source="embedded", context_tokens=60), ["context_tokens=60", "too small"]),
    (dict(task="qa", source="embedded", path="/tmp"), ["embedded", "task.path"]),
    (dict(task="summarization", source="embedded", num_prompts=500), ["num_prompts=500"]),
    (dict(task="summarization", source="embedded", context_tokens=400_000), ["400000", "smaller ctx"]),
    (dict(task="summarization", source="longbench_v2"), ["no summarization", "qa, code"]),
    (dict(task="qa", source="longbench", subset="gov_report"), ["gov_report", "narrativeqa, qasper, hotpotqa"]),
    (dict(task="qa", source="embedded", min_fill=2), ["min_fill"]),
])
def test_bad_task_inputs_raise_one_line_config_errors(kwargs, words, tokenizer):
    options = {"tokenizer": tokenizer, "context_tokens": CTX, "num_prompts": 1, **kwargs}
    with pytest.raises(ConfigError) as error:
        load_prompts(options.pop("task"), **options)
    assert_one_line(error)
    for word in words:
        assert word in str(error.value)


def test_missing_local_dataset_path_is_unavailable(tokenizer, tmp_path):
    with pytest.raises(UnavailableError) as error:
        load_prompts("qa", source="longbench", tokenizer=tokenizer, context_tokens=CTX, num_prompts=1,
                     path=str(tmp_path / "nowhere"))
    assert_one_line(error)
    with pytest.raises(UnavailableError) as error:
        load_prompts("qa", source="longbench", tokenizer=tokenizer, context_tokens=CTX, num_prompts=1,
                     path=str(tmp_path))                               # a folder without the subset's file
    assert "narrativeqa" in str(error.value)


@pytest.mark.parametrize("name, text, line", [
    ("qa.jsonl", '{"context": "a"}\n\n{"context": \n', 3),
    ("data.json", '[{"context": "a"},\n {"context" "b"}]', 2),
], ids=["jsonl", "json"])
def test_a_malformed_local_file_names_the_file_and_line(tokenizer, tmp_path, name, text, line):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as error:
        load_prompts("qa", source="longbench", tokenizer=tokenizer, context_tokens=CTX, num_prompts=1,
                     path=str(tmp_path / name))
    assert_one_line(error)
    assert f"{tmp_path / name} line {line} is not valid JSON" in str(error.value)


@pytest.mark.slow   # starts a subprocess
def test_hub_datasets_offline_say_how_to_get_them():
    """A fresh process: huggingface_hub reads HF_HUB_OFFLINE when it is imported."""
    code = ("from sparsespec.tasks import load_prompts\n"
            "for source in ('longbench', 'longbench_v2'):\n"
            "    try: load_prompts('qa', source=source, tokenizer=None, context_tokens=1000, num_prompts=1)\n"
            "    except Exception as e: print(type(e).__name__, '|', e)\n")
    lines = lines_printed_offline(code)
    assert len(lines) == 2, lines
    for line, repo in zip(lines, ("Xnhyacinth/LongBench", "THUDM/LongBench-v2")):
        assert line.startswith("UnavailableError |") and repo in line and "task.path" in line


# ---------------------------------------------------------------------------------------------
# LongBench and LongBench v2 from local files with the real column names

PROSE = read_source("pydoc_data/topics.py")  # real text to stand in for benchmark documents


def longbench_rows(subset: str, n: int, chars: int) -> list[dict]:
    return [{"input": f"What does section {i} say?", "context": PROSE[i * 5000:i * 5000 + chars],
             "answers": [f"answer {i}", f"other {i}"], "length": chars // 6, "dataset": subset,
             "language": "en", "all_classes": None, "_id": f"{subset}-{i:04d}"} for i in range(n)]


def write_parquet(rows: list[dict], file) -> None:
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), file)


def test_longbench_from_a_local_parquet_folder(tokenizer, tmp_path):
    (tmp_path / "narrativeqa").mkdir()
    write_parquet(longbench_rows("narrativeqa", 6, 40_000), tmp_path / "narrativeqa" / "test-00000-of-00001.parquet")
    prompts = load_prompts("qa", source="longbench", tokenizer=tokenizer, context_tokens=CTX, num_prompts=3,
                           path=str(tmp_path))
    assert len({p.id for p in prompts}) == 3
    for prompt in prompts:
        i = int(prompt.id.rsplit("-", 1)[1])
        assert prompt.id == f"narrativeqa/narrativeqa-{i:04d}"
        assert 0.97 * CTX <= len(prompt.input_ids) <= CTX
        assert prompt.reference == f"answer {i}" and prompt.meta["answers"] == [f"answer {i}", f"other {i}"]
        text = tokenizer.decode(prompt.input_ids)
        assert text.startswith("<|im_start|>user\nYou are given a story")
        assert f"Question: What does section {i} say?\n\nAnswer:<|im_end|>" in text
        assert PROSE[i * 5000:i * 5000 + 100] in text                 # the head of the document is kept
        assert prompt.score(f"other {i}") == 1.0                     # the best over all answers
    again = load_prompts("qa", source="longbench", tokenizer=tokenizer, context_tokens=CTX, num_prompts=3,
                         path=str(tmp_path))
    assert [p.input_ids for p in again] == [p.input_ids for p in prompts]


def test_longbench_code_from_a_jsonl_file_is_plain_text(tokenizer, tmp_path):
    rows = [{**row, "context": read_source("typing.py")[i * 9000:(i + 1) * 9000], "answers": ["return x"]}
            for i, row in enumerate(longbench_rows("lcc", 3, 0))]
    file = tmp_path / "lcc.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompt = load_prompts("code", source="longbench", tokenizer=tokenizer, context_tokens=CTX, num_prompts=1,
                          path=str(file))[0]
    text = tokenizer.decode(prompt.input_ids)
    assert text.startswith("Please complete the code given below. \n") and text.endswith("Next line of code:\n")
    assert prompt.meta["metric"] == "code_sim" and prompt.score("return x\n") == 1.0


def test_longbench_combined_file_is_filtered_by_dataset(tokenizer, tmp_path):
    file = tmp_path / "all.parquet"
    write_parquet(longbench_rows("gov_report", 3, 30_000) + longbench_rows("multi_news", 3, 30_000), file)
    prompts = load_prompts("summarization", source="longbench", subset="multi_news", tokenizer=tokenizer,
                           context_tokens=CTX, num_prompts=3, path=str(file))
    assert all(p.id.startswith("multi_news/multi_news-") for p in prompts)
    assert "You are given several news passages." in tokenizer.decode(prompts[0].input_ids)


def test_longbench_documents_shorter_than_the_context_are_refused_unless_asked(tokenizer, tmp_path):
    file = tmp_path / "hotpotqa.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in longbench_rows("hotpotqa", 4, 1500)))
    options = dict(source="longbench", subset="hotpotqa", tokenizer=tokenizer, context_tokens=CTX,
                   num_prompts=2, path=str(tmp_path))
    with pytest.raises(ConfigError) as error:
        load_prompts("qa", **options)
    assert_one_line(error)
    assert "only 0 of 4" in str(error.value) and "min_fill" in str(error.value)
    prompts = load_prompts("qa", min_fill=0.0, **options)
    assert all(len(p.input_ids) < 0.9 * CTX and not p.meta["truncated"] for p in prompts)


def test_longbench_v2_from_a_local_json_file(tokenizer, tmp_path):
    domains = ["Single-Document QA", "Code Repository Understanding", "Long In-context Learning"]
    rows = [{"_id": f"v2-{i}", "domain": domains[i % 3], "sub_domain": "x", "difficulty": "easy",
             "length": "short", "question": f"Which one, {i}?", "choice_A": "alpha", "choice_B": "beta",
             "choice_C": "gamma", "choice_D": "delta", "answer": "ABCD"[i % 4],
             "context": PROSE[i * 7000:i * 7000 + 30_000]} for i in range(9)]
    (tmp_path / "data.json").write_text(json.dumps(rows))
    prompts = load_prompts("code", source="longbench_v2", tokenizer=tokenizer, context_tokens=CTX, num_prompts=3,
                           path=str(tmp_path))
    assert sorted(p.id for p in prompts) == ["v2/v2-1", "v2/v2-4", "v2/v2-7"]   # the code domain only
    for prompt in prompts:
        assert 0.97 * CTX <= len(prompt.input_ids) <= CTX
        text = tokenizer.decode(prompt.input_ids)
        assert "(A) alpha\n(B) beta\n(C) gamma\n(D) delta" in text and text.startswith("<|im_start|>user\n")
        assert prompt.score(f"The correct answer is ({prompt.reference})") == 1.0
        assert prompt.score("I think it is (X)") == 0.0


# ---------------------------------------------------------------------------------------------
# Scoring


def test_scores():
    assert score("qa", "The Eiffel Tower.", "eiffel tower") == 1.0
    assert 0.0 < score("qa", "it is the tower in Paris", "eiffel tower") < 1.0
    assert score("qa", "no", ["eiffel tower", "no"]) == 1.0
    assert score("code", "    return a + b\n", "    return a + b") == 1.0
    assert 0.5 < score("code", "return a+b", "return a + b") < 1.0
    assert score("code", "x = 1\n", "x = 1\ny = 2") == 0.5                       # a missing line scores 0
    assert score("summarization", "the cat sat on the mat", "the cat sat on the mat") == 1.0
    assert 0.0 < score("summarization", "the cat lay on a mat", "the cat sat on the mat") < 1.0
    assert score("choice", "**The correct answer is (C)**", "C") == 1.0
    assert score("qa", "anything", None) is None
    with pytest.raises(ConfigError) as error:
        score("bleu", "a", "b")
    assert_one_line(error)


# ---------------------------------------------------------------------------------------------
# The real SmolLM2 tokenizer


@pytest.mark.real_model
@pytest.mark.parametrize("task", TASKS)
def test_real_tokenizer_prompts(task, smollm2_tokenizer):
    for ctx in (2048, 8000):
        prompts = embedded(task, smollm2_tokenizer, ctx=ctx, n=2)
        for prompt in prompts:
            assert isinstance(prompt, Prompt)
            assert 0.97 * ctx <= len(prompt.input_ids) <= ctx
            text = smollm2_tokenizer.decode(prompt.input_ids)
            if task == "code":
                assert not text.startswith("<|im_start|>")
                lines = read_source(prompt.meta["file"]).split("\n")
                assert "\n".join(lines[:prompt.meta["line"] - 1]).endswith(text[-300:])
            else:  # SmolLM2's template adds its system prompt
                assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
                reply = text.rsplit("<|im_start|>assistant\n", 1)[1]   # retrieval's starts with its answer prefix
                assert reply == "" or (task == "retrieval" and reply.endswith(("is", "are", "they are:", "Answer:")))
            if task == "qa":
                assert f"\n{prompt.reference}\n" in text and prompt.meta["sentence"] in " ".join(text.split())
