"""lm-eval integration: the `sparsespec` model scores and generates exactly like lm-eval's `hf` model.

The tasks are local (tests/lm_eval_tasks): a greedy generation task and a multiple-choice
(log-likelihood) task over excerpts of Python's language reference. Both run through
`lm_eval.simple_evaluate` on the embedded SmolLM2-135M, once with `hf` and once with `sparsespec`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lm_eval
import pytest
from lm_eval.tasks import TaskManager

from sparsespec.lm_eval import model as lm_eval_model, stats as lm_eval_stats
from sparsespec.errors import ConfigError, UnavailableError

REPO = Path(__file__).resolve().parents[1]
TASKS_DIR = Path(__file__).with_name("lm_eval_tasks")
GEN_TASK, LL_TASK = "sparsespec_pydoc_continuation", "sparsespec_pydoc_next_line"
LIMIT = 3
EMBEDDED = "embedded:smollm2_135m"
SPARSESPEC_ARGS = f"pretrained={EMBEDDED},method=sparsespec,controller=entropy,dtype=float32"


def evaluate(model, model_args, task_manager: TaskManager, tasks: tuple[str, ...] = (GEN_TASK, LL_TASK)) -> dict:
    return lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=list(tasks),
        task_manager=task_manager, limit=LIMIT, device="cpu",
        log_samples=True, bootstrap_iters=0, random_seed=0)


def embedded_folder() -> str:
    """The embedded SmolLM2 as the safetensors folder `sparsespec.models` converts it to (cached)."""
    from sparsespec.models import EMBEDDED_MODELS, converted_embedded_model

    return str(converted_embedded_model("smollm2_135m", EMBEDDED_MODELS["smollm2_135m"]))


@pytest.fixture(scope="module")
def task_manager() -> TaskManager:
    """lm-eval's task index with the local tasks: indexing takes seconds, so once per module."""
    return TaskManager(include_path=str(TASKS_DIR))


@pytest.fixture(scope="module")
def runs(task_manager) -> dict:
    """Both evaluations, once per test session: lm-eval's `hf` loads the folder itself."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_args = f"pretrained={embedded_folder()},dtype=float32"
    return {"hf": evaluate("hf", hf_args, task_manager),
            "sparsespec": evaluate("sparsespec", SPARSESPEC_ARGS, task_manager)}


def responses(results: dict, task: str) -> list:
    return [sample["resps"] for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def metrics(results: dict, task: str) -> dict:
    return {k: v for k, v in results["results"][task].items() if k not in ("alias", "name")}


# --- hf vs sparsespec on the embedded model ---------------------------------------------------
@pytest.mark.real_model
def test_generations_identical(runs):
    hf, spec = responses(runs["hf"], GEN_TASK), responses(runs["sparsespec"], GEN_TASK)
    assert len(hf) == LIMIT
    assert spec == hf
    assert all(r[0][0].strip() for r in hf), "an empty generation compares nothing"


@pytest.mark.real_model
def test_loglikelihoods_identical(runs):
    hf, spec = responses(runs["hf"], LL_TASK), responses(runs["sparsespec"], LL_TASK)
    assert len(hf) == LIMIT and all(len(r) == 4 for r in hf)
    assert spec == hf  # exact floats: log-likelihoods are HFLM's own code path


@pytest.mark.real_model
@pytest.mark.parametrize("task", [GEN_TASK, LL_TASK])
def test_scores_identical(runs, task):
    assert metrics(runs["sparsespec"], task) == metrics(runs["hf"], task)


@pytest.mark.real_model
def test_speculation_statistics_reported(runs):
    assert "sparsespec" not in runs["hf"]["config"]
    report = runs["sparsespec"]["config"]["sparsespec"]
    assert report["method"] == "sparsespec" and report["options"]["controller"] == "entropy"
    requests = report["requests"]
    assert [r["task"] for r in requests] == [GEN_TASK] * LIMIT
    assert sorted(r["doc_id"] for r in requests) == list(range(LIMIT))
    for r in requests:
        assert r["prompt_tokens"] > 800 and 1 <= r["new_tokens"] <= 24
        assert r["tokens_per_s"] > 0 and r["prefill_s"] > 0 and r["decode_s"] > 0
        assert r["mean_accepted"] >= 1.0 and 0.0 <= r["acceptance_rate"] <= 1.0
    agg = report["aggregate"]
    assert agg["n_requests"] == LIMIT and agg["tokens_per_s"] > 0 and agg["mean_accepted"] >= 1.0
    assert set(report["by_task"]) == {GEN_TASK}
    table = lm_eval_stats.format_table(report)
    assert GEN_TASK in table and "mean accepted" in table


# --- the command line: bad model_args -----------------------------------------------------------
def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "sparsespec.lm_eval.cli", "--device", "cpu", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(returncode: int, stderr: str, message: str) -> None:
    assert returncode == 2, stderr[-2000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("python -m sparsespec.lm_eval.cli: error: ") and message in last, last


@pytest.mark.slow   # starts a subprocess
def test_cli_unknown_method_exits_2_with_one_line():
    done = run_cli("--model", "sparsespec", "--model_args", f"pretrained={EMBEDDED},method=nope",
                   "--include_path", str(TASKS_DIR), "--tasks", GEN_TASK, "--limit", "1")
    assert_one_line_error(done.returncode, done.stderr, "unknown method 'nope'; accepted: ['ar',")


@pytest.mark.slow   # starts a subprocess
@pytest.mark.parametrize("model_args, message", [
    ("method=sparsespec,budget=-3", "budget=-3"),
    ("method=sparsespec,colour=blue", "unknown model_arg 'colour'"),
    ("method=sparsespec,candidates=[2,0]", "candidates=(2, 0)"),
])
def test_cli_bad_model_args_one_line(model_args, message, capsys):
    """The same entry point in-process (the subprocess test above covers `python -m`)."""
    from sparsespec.lm_eval import cli as entry

    returncode = entry.main(["--model", "sparsespec", "--model_args", f"pretrained={EMBEDDED},{model_args}",
                             "--tasks", GEN_TASK])
    assert_one_line_error(returncode, capsys.readouterr().err, message)


def test_cli_unknown_embedded_model_fails_before_loading(capsys):
    from sparsespec.lm_eval import cli as entry

    returncode = entry.main(["--model", "sparsespec", "--model_args", "pretrained=embedded:nope",
                             "--tasks", GEN_TASK])
    assert_one_line_error(returncode, capsys.readouterr().err,
                          "pretrained='embedded:nope' names no embedded model; accepted: embedded:smollm2_135m")


@pytest.mark.slow   # lm-eval indexes every task it ships (~7 s)
def test_cli_unknown_task_says_how_to_list_them(capsys):
    """lm-eval finds an unknown task before it loads the model; the one line says how to see the names."""
    from sparsespec.lm_eval import cli as entry

    returncode = entry.main(["--model", "sparsespec", "--model_args", f"pretrained={EMBEDDED}",
                             "--include_path", str(TASKS_DIR), "--tasks", f"{GEN_TASK},no_such_task"])
    assert_one_line_error(returncode, capsys.readouterr().err,
                          "--tasks no_such_task: no such task; list the accepted names with "
                          "`python -m sparsespec.lm_eval.cli ls tasks`")


@pytest.mark.real_model
def test_cli_writes_speculation_file_next_to_results(tmp_path, capfd):
    """The entry point in-process (test_cli_unknown_method_exits_2_with_one_line covers `python -m`)."""
    from sparsespec.lm_eval import cli as entry

    returncode = entry.main(["--model", "sparsespec", "--model_args", f"{SPARSESPEC_ARGS},budget=0.2",
                             "--device", "cpu", "--include_path", str(TASKS_DIR), "--tasks", GEN_TASK,
                             "--limit", "1", "--output_path", str(tmp_path)])
    out, err = capfd.readouterr()
    assert returncode == 0, err[-3000:]
    assert "sparsespec speculation statistics" in out and GEN_TASK in out
    [results] = tmp_path.glob("*/results_*.json")
    [speculation] = results.parent.glob("speculation_*.json")
    assert speculation.name == results.name.replace("results_", "speculation_")
    report = json.loads(speculation.read_text())
    assert report == json.loads(results.read_text())["config"]["sparsespec"]
    assert report["options"] == {"controller": "entropy", "budget": 0.2}
    assert report["aggregate"]["n_requests"] == 1 and report["requests"][0]["new_tokens"] >= 1


# --- the pieces, without a model --------------------------------------------------------------
def test_only_generation_is_overridden():
    from lm_eval.models.huggingface import HFLM

    for name in ("loglikelihood", "loglikelihood_rolling", "_loglikelihood_tokens", "_model_call",
                 "tok_encode", "tok_batch_encode", "tok_decode"):
        assert getattr(lm_eval_model.SparseSpecLM, name) is getattr(HFLM, name), name
    assert lm_eval_model.SparseSpecLM._model_generate is not HFLM._model_generate


def test_model_args_split_between_hflm_and_method():
    method, hf_args, options = lm_eval_model.parse_model_args(
        "sparsespec", {"dtype": "float32", "max_length": 4096, "recent": 64, "controller": "entropy"})
    assert method == "sparsespec"
    assert hf_args == {"dtype": "float32", "max_length": 4096}
    assert options == {"recent": 64, "controller": "entropy"}


@pytest.mark.parametrize("method, model_args, message", [
    ("sparsespec", {"budget": "lots"}, "budget='lots'"),
    ("sparsespec", {"budget": 0}, "budget=0"),
    ("sparsespec", {"controller": "psychic"}, "controller 'psychic'"),
    ("sparsespec", {"k": 0, "controller": "fixed"}, "k=0"),
    ("ar", {"recent": 64}, "unknown model_arg 'recent'"),
    ("sparsespec", {"batch_size": "auto"}, "batch_size=auto"),
])
def test_bad_model_args_rejected(method, model_args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        lm_eval_model.parse_model_args(method, model_args)


def test_bad_method_option_rejected_before_loading():
    with pytest.raises(ConfigError, match="unknown method"):
        lm_eval_model.SparseSpecLM(pretrained="no/such-model", method="nope")
    with pytest.raises(ConfigError, match="budget"):
        lm_eval_model.SparseSpecLM(pretrained="no/such-model", budget=-1)
    with pytest.raises(ConfigError, match="'embedded:nope' names no embedded model"):
        lm_eval_model.SparseSpecLM(pretrained="embedded:nope")


@pytest.mark.parametrize("key, value, expected", [
    ("candidates", "2:4:8", (2, 4, 8)), ("candidates", [2, 4], (2, 4)), ("candidates", "2|4", (2, 4)),
    ("candidates", 4, 4), ("recent", "64", 64), ("budget", "0.25", 0.25), ("controller", "entropy", "entropy")])
def test_option_coercion(key, value, expected):
    _, _, options = lm_eval_model.parse_model_args("sparsespec", {key: value})
    assert options[key] == expected and type(options[key]) is type(expected)


def test_string_options_keep_their_colons():
    _, _, options = lm_eval_model.parse_model_args("assisted", {"draft_model": "truncated:8", "k": 4})
    assert options == {"draft_model": "truncated:8", "k": 4}


def test_sampling_args_follow_lm_eval_semantics():
    assert lm_eval_model.sampling_args({"do_sample": False, "temperature": 0.0}) == {"temperature": 0.0, "top_p": 1.0}
    assert lm_eval_model.sampling_args({"do_sample": False, "temperature": 1.0})["temperature"] == 0.0
    assert lm_eval_model.sampling_args({"do_sample": True, "temperature": 0.7, "top_p": 0.9}) == {
        "temperature": 0.7, "top_p": 0.9}
    assert lm_eval_model.sampling_args({"do_sample": False, "num_beams": 1})["temperature"] == 0.0
    with pytest.raises(ConfigError, match="num_beams"):
        lm_eval_model.sampling_args({"do_sample": False, "num_beams": 4})


def test_missing_model_is_one_line_unavailable_error(tmp_path):
    """HFLM's own loading fails with transformers' OSError; the model says it in one line."""
    with pytest.raises(UnavailableError, match=r"^cannot load pretrained='.*no-such-model': [^\n]+$"):
        lm_eval_model.SparseSpecLM(pretrained=str(tmp_path / "no-such-model"), device="cpu")


def test_cli_default_device_falls_back_to_cpu_without_cuda():
    import torch

    expected = "cuda:0" if torch.cuda.is_available() else None
    assert lm_eval_model.available_device("cuda:0") == expected
    assert lm_eval_model.available_device("cpu") == "cpu"


def test_speculation_file_written_next_to_results(tmp_path):
    from sparsespec.lm_eval import cli as entry

    model_dir = tmp_path / "embedded__smollm2_135m"
    model_dir.mkdir()
    report = {"method": "ar", "options": {}, "aggregate": {"n_requests": 0}, "by_task": {}, "requests": []}
    (model_dir / "results_2026-01-01T00-00-00.json").write_text(json.dumps({"config": {"sparsespec": report}}))
    (model_dir / "results_2025-01-01T00-00-00.json").write_text(json.dumps({"config": {}}))
    written = entry.write_speculation_files(str(tmp_path), since=0.0)
    assert [p.name for p in written] == ["speculation_2026-01-01T00-00-00.json"]
    assert json.loads(written[0].read_text()) == report


@pytest.mark.slow
@pytest.mark.real_model
def test_batch_size_generations_identical(runs, task_manager):
    """--batch_size 2: HFLM's left-padded batches decoded together, each request as hf decodes it alone.
    The generation task alone: batching is speculative decoding's, log-likelihoods are HFLM's own."""
    batched = evaluate("sparsespec", f"{SPARSESPEC_ARGS},batch_size=2", task_manager, tasks=(GEN_TASK,))
    assert responses(batched, GEN_TASK) == responses(runs["hf"], GEN_TASK)
    assert batched["config"]["sparsespec"]["aggregate"]["n_requests"] == LIMIT
