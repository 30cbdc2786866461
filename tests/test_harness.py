"""The harness: result files, resume, W&B, sweeps and one-line errors.

The end-to-end tests run `python run.py` in a subprocess on the embedded SmolLM2 at 1K context
(converted once and cached; the first conversion adds ~25 s). About 3-4 minutes on 2 CPU cores.
"""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparsespec.errors import ConfigError
from sparsespec.harness.callbacks import sweep_lines
from sparsespec.harness.results import SamplesFile, aggregate, build_sample, check_resume
from sparsespec.harness.tracking import Tracker, WandbTracker, make_tracker

REPO = Path(__file__).resolve().parents[1]
SAMPLE_KEYS = {"prompt_id", "model", "task", "source", "method", "ctx", "context_tokens", "new_tokens",
               "prefill_s", "decode_s", "tokens_per_s", "mean_accepted", "acceptance_rate", "time_split",
               "rounds", "ar_tokens_per_s", "ar_decode_s", "ar_prefill_s", "speedup_vs_ar", "outputs_match_ar",
               "text", "reference", "score"}
METRIC_KEYS = {"n_prompts", "tokens_per_s", "ar_tokens_per_s", "speedup_vs_ar", "speedup_vs_ar_std",
               "speedup_vs_ar_ci95_low", "speedup_vs_ar_ci95_high", "mean_accepted", "acceptance_rate",
               "prefill_s_mean", "decode_s_mean", "outputs_match_ar", "score_mean", "c_ar_s", "c_draft_s",
               "c_verify_s", "c_verify_s_by_k", "select_s_per_round", "draft_steps_per_round", "bound",
               "bound_reached"}
SMOKE = ["experiment=smoke"]                       # ctx 1000, 2 prompts, 16 new tokens
QUICK = ["experiment=smoke", "logger=none", "compare_ar=false", "max_new_tokens=8", "warmup=false"]


def cli_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_MODE")}
    return {**env, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra}


def cli(cwd: Path, *overrides: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *overrides], cwd=cwd, capture_output=True,
                          text=True, env=cli_env(**env), timeout=timeout)


def read_samples(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def read_wandb_records(path: Path) -> list:
    """Records of a `.wandb` file (LevelDB-log framing: 32 KiB blocks of 7-byte-headed chunks,
    after a 7-byte ':W&B' file header). wandb 0.31 ships no Python reader of its own."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:               # block trailer padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):         # FULL or LAST chunk: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def item_key(item) -> str:
    """A history/summary item's key: W&B stores "a/b" keys either flat or as nested_key parts."""
    return item.key or "/".join(item.nested_key)


# --------------------------------------------------------------------------------------------
# units: no model


def fake_gen(tokens, rounds, decode_s, prefill_s=1.0):
    from sparsespec.generation import Generation, Round

    return Generation(tokens=tokens, prefill_s=prefill_s, decode_s=decode_s, method="x", prompt_tokens=100,
                      rounds=[Round(drafted=d, accepted=a, emitted=a + 1, entropies=[0.5] * d, draft_s=0.1,
                                    verify_s=0.1) for d, a in rounds])


def test_samples_and_pooled_metrics():
    prompt = SimpleNamespace(id="p0", reference=None)
    names = {"model": "m", "task": "t", "source": "s", "method": "sparsespec"}
    gen = fake_gen([1] * 7, [(4, 3), (4, 1)], decode_s=2.0)     # 6 decode tokens in 2 s
    ref = fake_gen([1] * 7, [(0, 0)] * 6, decode_s=6.0)          # AR: 6 tokens in 6 s
    a = build_sample(prompt=prompt, gen=gen, ref=ref, names=names, ctx=100, text="t", score=None, greedy=True)
    prompt = SimpleNamespace(id="p1", reference="r")
    gen2 = fake_gen([1] * 5, [(4, 3)], decode_s=1.0)             # 4 decode tokens in 1 s
    ref2 = fake_gen([2] * 5, [(0, 0)] * 4, decode_s=2.0)
    b = build_sample(prompt=prompt, gen=gen2, ref=ref2, names=names, ctx=100, text="t", score=0.5, greedy=True)
    assert set(a) == SAMPLE_KEYS
    assert a["speedup_vs_ar"] == pytest.approx(3.0) and a["outputs_match_ar"] is True
    assert b["speedup_vs_ar"] == pytest.approx(2.0) and b["outputs_match_ar"] is False
    m = aggregate([a, b])
    assert set(m) == METRIC_KEYS
    assert m["tokens_per_s"] == pytest.approx(10 / 3)            # pooled: 10 tokens / 3 s
    assert m["ar_tokens_per_s"] == pytest.approx(10 / 8)
    assert m["speedup_vs_ar"] == pytest.approx(2.5) and m["speedup_vs_ar_std"] == pytest.approx(0.5 ** 0.5)
    assert m["mean_accepted"] == pytest.approx(10 / 3) and m["acceptance_rate"] == pytest.approx(7 / 12)
    assert m["outputs_match_ar"] == 0.5 and m["score_mean"] == 0.5
    ar_self = build_sample(prompt=prompt, gen=ref, ref=ref, names=names, ctx=100, text="", score=None, greedy=True)
    assert ar_self["speedup_vs_ar"] == 1.0 and ar_self["outputs_match_ar"] is None


def test_samples_file_drops_a_line_cut_short(tmp_path):
    samples = SamplesFile(tmp_path)
    samples.append({"prompt_id": "a", "method": "m"})
    with open(samples.path, "a") as f:
        f.write('{"prompt_id": "b", "met')                        # killed mid-write
    assert samples.load() == [{"prompt_id": "a", "method": "m"}]
    samples.append({"prompt_id": "b", "method": "m"})
    assert [s["prompt_id"] for s in samples.load()] == ["a", "b"]


def test_resume_refuses_other_settings(tmp_path):
    assert check_resume(tmp_path, {"ctx": 1000, "seed": 0}) is False
    assert check_resume(tmp_path, {"ctx": 1000, "seed": 0}) is True
    with pytest.raises(ConfigError, match="ctx: 1000 -> 2000"):
        check_resume(tmp_path, {"ctx": 2000, "seed": 0})


def test_wandb_online_without_login_falls_back_to_offline(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))                    # no ~/.netrc, no wandb settings
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    tracker = make_tracker({"name": "wandb", "mode": "online", "project": "p"}, config={"a": 1},
                           folder=tmp_path, name="n", group=None)
    try:
        assert isinstance(tracker, WandbTracker) and tracker.folder.name.startswith("offline-run-")
        assert sum("logging offline instead" in r.message for r in caplog.records) == 1
    finally:
        tracker.finish()
    assert isinstance(make_tracker({"name": "none"}, config={}, folder=tmp_path, name="n", group=None), Tracker)


def test_sweep_lines_report_results_and_errors(tmp_path):
    (tmp_path / "0_a").mkdir()
    (tmp_path / "0_a" / "summary.json").write_text(json.dumps(
        {"run": {"method": "ar", "ctx": 1000}, "metrics": dict.fromkeys(METRIC_KEYS)}))
    (tmp_path / "1_b").mkdir()
    (tmp_path / "1_b" / "error.txt").write_text("ctx=60000 exceeds it\n")
    rows, errors = sweep_lines(tmp_path)
    assert len(rows) == 1 and "0_a" in rows[0]
    assert errors == ["  1_b: ctx=60000 exceeds it"]


# --------------------------------------------------------------------------------------------
# end to end: python run.py


@pytest.mark.real_model
def test_run_writes_results_and_wandb_offline(tmp_path):
    out = tmp_path / "run"
    result = cli(tmp_path, *SMOKE, f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    samples = read_samples(out)
    assert len(samples) == 2 and len({s["prompt_id"] for s in samples}) == 2
    for s in samples:
        assert set(s) == SAMPLE_KEYS
        assert (s["model"], s["task"], s["source"], s["method"], s["ctx"]) == \
            ("smollm2_135m", "summarization", "embedded", "sparsespec", 1000)
        assert 900 <= s["context_tokens"] <= 1000 and s["new_tokens"] == 16
        assert 1 + sum(r["emitted"] for r in s["rounds"]) == 16
        assert s["outputs_match_ar"] is True                      # greedy fp32: lossless
        assert s["speedup_vs_ar"] == pytest.approx(s["tokens_per_s"] / s["ar_tokens_per_s"])
        assert s["mean_accepted"] >= 1.0 and s["text"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"run", "metrics", "config", "env"}
    assert set(summary["metrics"]) == METRIC_KEYS and summary["metrics"]["n_prompts"] == 2
    assert summary["metrics"]["outputs_match_ar"] == 1.0
    assert summary["config"]["ctx"] == 1000 and summary["config"]["model"]["name"] == "smollm2_135m"
    assert summary["env"]["packages"]["torch"] and "commit" in summary["env"]["git"] and summary["env"]["cpu"]
    assert summary["run"]["method_options"]["controller"] == "entropy"
    assert "speedup vs ar" in result.stdout

    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir())
    records = read_wandb_records(next(runs[0].glob("run-*.wandb")))
    history = [{item_key(i): json.loads(i.value_json) for i in r.history.item} for r in records
               if r.WhichOneof("record_type") == "history"]
    rounds = [h for h in history if "round/index" in h]
    prompts = [h for h in history if "prompt/index" in h]
    assert len(rounds) == sum(len(s["rounds"]) for s in samples)
    assert [h["round/drafted"] for h in rounds] == [r["drafted"] for s in samples for r in s["rounds"]]
    assert [h["prompt/tokens_per_s"] for h in prompts] == pytest.approx([s["tokens_per_s"] for s in samples])
    tables = [h for h in history if h.get("samples/_type") == "table-file"]
    assert len(tables) == 1 and tables[0]["samples/nrows"] == 2     # the table of samples
    assert (runs[0] / "files" / tables[0]["samples/path"]).exists()
    step_axes = {r.metric.glob_name: r.metric.step_metric for r in records if r.WhichOneof("record_type") == "metric"}
    assert step_axes.get("round/*") == "round/index" and step_axes.get("prompt/*") == "prompt/index"
    summary_items = {item_key(i): json.loads(i.value_json) for r in records
                     if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
    assert summary_items["tokens_per_s"] == pytest.approx(summary["metrics"]["tokens_per_s"])
    assert (runs[0] / "files" / "samples.jsonl").read_text() == (out / "samples.jsonl").read_text()



@pytest.mark.real_model
def test_fixed_k_run_records_its_k_and_warns_once_past_the_trained_length(tmp_path):
    """summary.json names the controller and k of a fixed-k run (k left at its default), and a
    context past the model's trained length (but within max_context) runs with one warning line,
    recorded in summary.json."""
    out = tmp_path / "run"
    result = cli(tmp_path, *QUICK, "num_prompts=1", "method=sparsespec_fixed", "model.trained_context=512",
                 f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: ctx=1000 + max_new_tokens=8 is past smollm2_135m's trained length 512; "
                        "RoPE extrapolates, so task quality is not meaningful, speed is"], result.stderr[-3000:]
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["method"] == "sparsespec_fixed" and run["method_name"] == "sparsespec"
    assert run["method_options"]["controller"] == "fixed" and run["method_options"]["k"] == 4
    assert run["warnings"] == [warnings[0].removeprefix("warning: ")]

@pytest.mark.real_model
def test_killed_run_resumes_without_redoing_or_losing(tmp_path):
    out = tmp_path / "run"
    args = [*QUICK, f"hydra.run.dir={out}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples_path = out / "samples.jsonl"
    deadline = time.monotonic() + 240
    while not (samples_path.exists() and samples_path.read_text().endswith("\n")):
        assert proc.poll() is None, "the run ended before its first prompt was written"
        assert time.monotonic() < deadline, "no prompt finished within 240 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = samples_path.read_text()
    assert first.count("\n") == 1, "killed too late: both prompts had finished"

    result = cli(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 of 2 prompts already done" in result.stdout
    after = samples_path.read_text()
    assert after.startswith(first) and after.count("\n") == 2     # prompt 1 kept as it was, not redone
    assert len({s["prompt_id"] for s in read_samples(out)}) == 2
    assert json.loads((out / "summary.json").read_text())["metrics"]["n_prompts"] == 2

    again = cli(tmp_path, *args)                                   # nothing left to do
    assert again.returncode == 0 and "2 of 2 prompts already done" in again.stdout
    assert samples_path.read_text() == after

    changed = cli(tmp_path, *args, "max_new_tokens=9")
    assert changed.returncode == 2 and "max_new_tokens: 8 -> 9" in changed.stderr


@pytest.mark.real_model
def test_multirun_two_methods_by_two_contexts_through_submitit(tmp_path):
    sweep = tmp_path / "sweep"
    result = cli(tmp_path, "-m", "method=ar,sparsespec", "ctx=1k,1200", "hydra/launcher=submitit_local",
                 f"hydra.sweep.dir={sweep}", *QUICK[1:], "num_prompts=1", timeout=400,
                 OMP_NUM_THREADS="1")                               # 4 jobs share 2 cores
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(jobs) == 4, sorted(p.name for p in sweep.iterdir())
    runs = {(s["run"]["method"], s["run"]["ctx"]) for s in (json.loads((j / "summary.json").read_text()) for j in jobs)}
    assert runs == {("ar", 1000), ("ar", 1200), ("sparsespec", 1000), ("sparsespec", 1200)}
    assert all(len(read_samples(j)) == 1 for j in jobs)
    assert (sweep / ".submitit").is_dir()                         # the jobs went through submitit
    assert all(j.name in result.stdout for j in jobs)              # the sweep report


def test_sweep_job_errors_are_listed_and_exit_2(tmp_path):
    sweep = tmp_path / "sweep"
    result = cli(tmp_path, "-m", "ctx=60k,64k", "logger=none", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "2 job(s) stopped on an error" in result.stderr and "Traceback" not in result.stderr
    assert len(list(sweep.glob("*/error.txt"))) == 2


@pytest.mark.parametrize("overrides, expected", [
    (["ctx=60k"], "exceeds model smollm2_135m's max_context=8192"),
    (["model=llama3_8b", "ctx=1k"], "hf download meta-llama/Meta-Llama-3-8B-Instruct"),
    (["task.source=longbench"], "hf download Xnhyacinth/LongBench"),
    (["method.options.budget=5000"], "budget=5000 tokens does not fit ctx=1000"),
    (["method.options.budget=0.01"], "fewer than sink+recent"),
    (["task.source=arxiv"], "task.source='arxiv' is unknown"),
    (["+method.options.bogus=1"], "unknown option(s) ['bogus']"),
    (["method=ar", "+method.options.k=4"], "method 'ar' drafts nothing, so it takes no controller option(s) ['k']"),
], ids=["ctx-too-long", "model-offline", "dataset-offline", "budget-too-big", "budget-too-small",
        "unknown-source", "unknown-option", "ar-controller-option"])
def test_bad_input_gives_one_line_error(tmp_path, overrides, expected):
    result = cli(tmp_path, *SMOKE, "logger=none", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-2000:]
