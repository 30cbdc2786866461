"""The harness: result files, resume, W&B, sweeps and one-line errors.

The end-to-end tests run `python run.py` in a subprocess on the embedded SmolLM2 at 1K context
(converted once and cached; the first conversion adds ~25 s). About 3-4 minutes on 2 CPU cores.
Most bad-input cases run run.py in this process (conftest's `cli_here`): the same code from the command line
to the one-line error, without an interpreter and torch start-up each.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import cli_env, make

from sparsespec.errors import ConfigError
from sparsespec.harness.callbacks import sweep_lines
from sparsespec.harness.checks import make_output_folder
from sparsespec.harness.folder_lock import HOLDER_FILE, LOCK_FILE, hold_folder, lock_holder
from sparsespec.harness.results import RESUME, SamplesFile, aggregate, build_sample, check_resume
from sparsespec.harness.tracking import Tracker, WandbTracker, make_tracker

REPO = Path(__file__).resolve().parents[1]
SAMPLE_KEYS = {"prompt_id", "model", "task", "source", "method", "ctx", "context_tokens", "new_tokens",
               "prefill_s", "decode_s", "tokens_per_s", "mean_accepted", "acceptance_rate", "time_split",
               "rounds", "ar_tokens_per_s", "ar_decode_s", "ar_prefill_s", "speedup_vs_ar", "outputs_match_ar",
               "text", "reference", "score", "depth"}
METRIC_KEYS = {"n_prompts", "tokens_per_s", "ar_tokens_per_s", "ratio_mean", "speedup_vs_ar", "speedup_vs_ar_log_std",
               "speedup_vs_ar_ci95_low", "speedup_vs_ar_ci95_high", "mean_accepted", "acceptance_rate",
               "prefill_s_mean", "decode_s_mean", "outputs_match_ar", "score_mean", "c_ar_s", "c_draft_s",
               "c_verify_s", "c_verify_s_by_k", "select_s_per_round", "draft_steps_per_round", "bound",
               "bound_reached"}
SMOKE = ["experiment=smoke"]                       # ctx 1000, 2 prompts, 16 new tokens
QUICK = ["experiment=smoke", "logger=none", "compare_ar=false", "max_new_tokens=8", "warmup=false", "cost_profile=false"]


def cli(cwd: Path, *overrides: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *overrides], cwd=cwd, capture_output=True,
                          text=True, env=cli_env(**env), timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> str:
    """Exit 2, no traceback, and exactly one `error: ...` line on stderr, holding `expected`."""
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-2000:]
    return errors[0]


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
    from sparsespec.engine.generation import Generation, Round

    return Generation(tokens=tokens, prefill_s=prefill_s, decode_s=decode_s, method="x", prompt_tokens=100,
                      rounds=[Round(drafted=d, accepted=a, emitted=a + 1, entropies=[0.5] * d, draft_s=0.1,
                                    verify_s=0.1) for d, a in rounds])


def test_samples_and_pooled_metrics():
    prompt = SimpleNamespace(id="p0", reference=None)
    names = {"model": "m", "task": "t", "source": "s", "method": "sparsespec"}
    gen = fake_gen([1] * 7, [(4, 3), (4, 1)], decode_s=2.0)     # 6 decode tokens in 2 s
    ref = fake_gen([1] * 7, [(0, 0)] * 6, decode_s=6.0)          # AR: 6 tokens in 6 s
    a = build_sample(prompt=prompt, gen=gen, ref=ref, names=names, ctx=100, text="t", score=None, greedy=True)
    prompt = SimpleNamespace(id="p1", reference="r", meta={"depth": 0.3})
    gen2 = fake_gen([1] * 5, [(4, 3)], decode_s=1.0)             # 4 decode tokens in 1 s
    ref2 = fake_gen([2] * 5, [(0, 0)] * 4, decode_s=2.0)
    b = build_sample(prompt=prompt, gen=gen2, ref=ref2, names=names, ctx=100, text="t", score=0.5, greedy=True)
    assert set(a) == SAMPLE_KEYS
    assert a["speedup_vs_ar"] == pytest.approx(3.0) and a["outputs_match_ar"] is True
    assert b["speedup_vs_ar"] == pytest.approx(2.0) and b["outputs_match_ar"] is False
    assert a["depth"] is None and b["depth"] == 0.3                  # the prompt's evidence depth, when it has one
    m = aggregate([a, b])
    assert set(m) == METRIC_KEYS
    assert m["tokens_per_s"] == pytest.approx(10 / 3)            # pooled: 10 tokens / 3 s
    assert m["ar_tokens_per_s"] == pytest.approx(10 / 8)
    assert m["ratio_mean"] == "geometric"
    assert m["speedup_vs_ar"] == pytest.approx(6 ** 0.5)               # geometric mean of 3 and 2, not 2.5
    assert m["speedup_vs_ar_log_std"] == pytest.approx(abs(math.log(3) - math.log(2)) / 2 ** 0.5)
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


def test_resume_refuses_other_settings_once_a_sample_is_finished(tmp_path):
    assert check_resume(tmp_path, {"ctx": 1000, "seed": 0}) is False
    SamplesFile(tmp_path).append({"prompt_id": "a", "method": "m"})
    assert check_resume(tmp_path, {"ctx": 1000, "seed": 0}) is True
    with pytest.raises(ConfigError, match="ctx: 1000 -> 2000"):
        check_resume(tmp_path, {"ctx": 2000, "seed": 0})
    assert json.loads((tmp_path / RESUME).read_text()) == {"ctx": 1000, "seed": 0}


def test_a_folder_without_a_finished_sample_takes_new_settings(tmp_path):
    check_resume(tmp_path, {"budget": -0.1})                      # a run that then stopped on its bad input
    (tmp_path / "samples.jsonl").write_text('{"prompt_id": "a", "met')  # killed before one line was whole
    assert check_resume(tmp_path, {"budget": 0.1}) is False
    assert json.loads((tmp_path / RESUME).read_text()) == {"budget": 0.1}


@pytest.mark.parametrize("damage", ["{oops", "[1, 2]", None], ids=["not-json", "not-an-object", "missing"])
def test_unreadable_resume_json_beside_finished_samples_is_one_line_error(tmp_path, damage):
    check_resume(tmp_path, {"ctx": 1000})
    SamplesFile(tmp_path).append({"prompt_id": "a", "method": "m"})
    if damage is None:
        (tmp_path / RESUME).unlink()
    else:
        (tmp_path / RESUME).write_text(damage)
    with pytest.raises(ConfigError) as err:
        check_resume(tmp_path, {"ctx": 1000})
    message = str(err.value)
    assert "resume.json" in message and "1 finished sample(s)" in message and "\n" not in message
    assert len(SamplesFile(tmp_path).load()) == 1


def test_output_folder_that_cannot_be_made_is_one_line_error(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"hydra.run.dir=.*afile is an existing file, not a folder"):
        make_output_folder("hydra.run.dir", tmp_path / "afile")
    with pytest.raises(ConfigError, match=r"hydra.sweep.dir=.*afile/sub cannot be created \(Not a directory\)"):
        make_output_folder("hydra.sweep.dir", tmp_path / "afile" / "sub")
    assert make_output_folder("hydra.run.dir", tmp_path / "a" / "b").is_dir()


# --------------------------------------------------------------------------------------------
# the run in this process, without a model: resume, the folder lock, a crash


def fake_inputs(monkeypatch, crash_on: str | None = None) -> None:
    """`runner.run` with no model: two prompts, each given a made-up sample (or a crash on `crash_on`)."""
    from sparsespec.harness import decoding, runner
    from sparsespec.harness.plan import result_names

    prompts = [SimpleNamespace(id=f"p{i}", reference=None, input_ids=None) for i in range(2)]
    monkeypatch.setattr(runner, "load_inputs", lambda config: (torch.nn.Linear(1, 1), None, prompts))
    monkeypatch.setattr(decoding, "decode_batch",
                        lambda model, inputs, decoders, *args, **kw: {d: [None] * len(inputs) for d in decoders})

    def sample_of(config, run, prompt, gen, ref, model, tokenizer):
        if prompt.id == crash_on:
            raise RuntimeError(f"boom on {prompt.id}")
        return build_sample(prompt=prompt, gen=fake_gen([1] * 3, [(2, 1)], decode_s=1.0), ref=None,
                            names=result_names(config, run.spec), ctx=config.ctx, text="t", score=None, greedy=True)

    monkeypatch.setattr(decoding, "sample_of", sample_of)


@pytest.mark.slow   # a whole harness run, ~3 s: `make test`
def test_a_run_stopped_after_loading_leaves_its_folder_free_for_new_settings(tmp_path, hydra_conf, monkeypatch):
    from sparsespec.harness import runner

    def bad_input(config):
        raise ConfigError("a bad input found only once the model is loaded")

    monkeypatch.setattr(runner, "load_inputs", bad_input)
    with pytest.raises(ConfigError, match="found only once"):
        runner.run(make(*QUICK, "max_new_tokens=9"), tmp_path)
    fake_inputs(monkeypatch)
    assert runner.run(make(*QUICK), tmp_path)["run"]["resumed"] is False
    assert json.loads((tmp_path / RESUME).read_text())["max_new_tokens"] == 8
    assert [s["prompt_id"] for s in read_samples(tmp_path)] == ["p0", "p1"]


@pytest.mark.slow   # a whole harness run, ~3 s: `make test`
def test_a_crash_mid_run_keeps_every_finished_sample_and_frees_the_folder(tmp_path, hydra_conf, monkeypatch):
    from sparsespec.harness.runner import run

    fake_inputs(monkeypatch, crash_on="p1")
    with pytest.raises(RuntimeError, match="boom on p1"):     # a bug propagates as itself
        run(make(*QUICK), tmp_path)
    first = (tmp_path / "samples.jsonl").read_text()
    assert [s["prompt_id"] for s in read_samples(tmp_path)] == ["p0"]
    fake_inputs(monkeypatch)
    assert run(make(*QUICK), tmp_path)["run"]["resumed"] is True
    after = (tmp_path / "samples.jsonl").read_text()
    assert after.startswith(first) and after.count("\n") == 2    # p0 kept as it was, p1 added once


@pytest.mark.slow   # two harness runs, ~3 s: `make test`
def test_a_resume_with_nothing_left_keeps_summary_json_and_samples_name_their_code(tmp_path, hydra_conf, monkeypatch):
    """The summary of a finished folder describes the sitting that decoded its samples: a resume that
    decodes nothing must not rewrite it with its own commit, threads and times; each sample names the
    code that decoded it."""
    from sparsespec.harness import environment
    from sparsespec.harness.runner import run

    def machine(capability):
        return lambda: {"cpu": "Synthetic CPU", "cpu_capability": capability, "gpu": None}

    fake_inputs(monkeypatch, crash_on="p1")
    monkeypatch.setattr(environment, "sitting_machine", machine("AVX2"))
    with pytest.raises(RuntimeError, match="boom on p1"):
        run(make(*QUICK), tmp_path)
    fake_inputs(monkeypatch)
    monkeypatch.setattr(environment, "sitting_machine", machine("AVX512"))   # resumed on another machine
    assert run(make(*QUICK), tmp_path)["run"]["resumed"] is True          # p1 decoded: a new summary
    written = (tmp_path / "summary.json").read_bytes()
    again = run(make(*QUICK), tmp_path)                                      # nothing left to decode
    assert (tmp_path / "summary.json").read_bytes() == written and again == json.loads(written)
    code = environment.git_state()["code"]
    assert [(s["prompt_id"], s["code"], s["cpu_capability"]) for s in read_samples(tmp_path)] == [
        ("p0", code, "AVX2"), ("p1", code, "AVX512")]


@pytest.mark.slow   # a harness run, ~3 s: `make test`
def test_a_commit_made_mid_run_leaves_summary_and_samples_naming_the_same_code(tmp_path, hydra_conf, monkeypatch):
    """The git state is read once, as the run starts: a commit made while it decodes (results committed
    beside a long run) must not relabel its summary.json with code that decoded none of its samples."""
    from sparsespec.harness import environment
    from sparsespec.harness.runner import run

    states = iter([{"commit": "a" * 40, "dirty": False, "code": "code-at-start", "code_dirty": False}])
    later = {"commit": "b" * 40, "dirty": False, "code": "code-after-a-commit", "code_dirty": False}
    monkeypatch.setattr(environment, "git_state", lambda repo=None: next(states, later))
    fake_inputs(monkeypatch)
    summary = run(make(*QUICK), tmp_path)
    assert summary["env"]["git"]["commit"] == "a" * 40 and summary["env"]["git"]["code"] == "code-at-start"
    assert json.loads((tmp_path / "summary.json").read_text())["env"]["git"]["code"] == "code-at-start"
    assert {s["code"] for s in read_samples(tmp_path)} == {"code-at-start"}


@pytest.mark.slow   # two harness runs, ~2.5 s: `make test`
def test_a_held_folder_refuses_a_second_run_at_once_and_names_the_holder(tmp_path, hydra_conf, monkeypatch):
    from sparsespec.harness.runner import run

    fake_inputs(monkeypatch)
    with hold_folder(tmp_path), pytest.raises(ConfigError) as err:
        run(make(*QUICK), tmp_path)
    message = str(err.value)
    assert f"is in use by another run (pid {os.getpid()} on {socket.gethostname()}, started " in message
    assert "choose another hydra.run.dir" in message and "\n" not in message
    assert not (tmp_path / "samples.jsonl").exists() and not (tmp_path / RESUME).exists()
    run(make(*QUICK), tmp_path)                                    # released: the folder runs
    assert len(read_samples(tmp_path)) == 2


def test_a_refused_run_waits_for_the_holders_note_and_skips_an_ended_runs_note(tmp_path):
    """The holder writes its note just after it takes the lock: a run refused in between waits for
    the note instead of naming nobody, and a note left by a run that has ended names nobody."""
    import threading

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    stale = {"pid": int(ended.stdout), "host": socket.gethostname(), "started": "earlier"}
    (tmp_path / HOLDER_FILE).write_text(json.dumps(stale))
    assert lock_holder(tmp_path, wait_s=0.2).startswith("holder not known")
    live = {"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}
    late = threading.Timer(0.3, lambda: (tmp_path / HOLDER_FILE).write_text(json.dumps(live)))
    late.start()
    try:
        assert lock_holder(tmp_path, wait_s=10) == f"pid {os.getpid()} on {socket.gethostname()}, started now"
    finally:
        late.join()


def folder_contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_output_folder_is_claimed_before_hydra_writes_into_it(tmp_path):
    """run.py's OutputFolderCheck takes the folder's lock in on_run_start, before Hydra writes
    `.hydra/`: a run refused there changes nothing in the holder's folder; the claiming run's own
    hold finds the lock its own, and on_run_end frees it."""
    from filelock import FileLock, Timeout
    from omegaconf import OmegaConf

    from sparsespec.harness.callbacks import OutputFolderCheck

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- method=ar\n")
    cfg = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path)}}})
    with hold_folder(tmp_path):
        before = folder_contents(tmp_path)
        with pytest.raises(SystemExit) as exit_:
            OutputFolderCheck().on_run_start(cfg)
        assert exit_.value.code == 2 and folder_contents(tmp_path) == before
    check = OutputFolderCheck()
    check.on_run_start(cfg)
    try:
        with pytest.raises(Timeout):                               # claimed: nobody else gets it
            FileLock(tmp_path / LOCK_FILE).acquire(timeout=0)
        with hold_folder(tmp_path):                                # but the claiming run's own hold does
            pass
    finally:
        check.on_run_end(cfg)
    with hold_folder(tmp_path):                                    # released
        pass


@pytest.mark.slow   # starts a subprocess (the holder)
def test_a_run_refused_by_a_held_folder_leaves_the_holders_hydra_files_alone(tmp_path, cli_here):
    code = ("import sys, time\n"
            "from sparsespec.harness.folder_lock import hold_folder\n"
            "with hold_folder(sys.argv[1]):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(600)\n")
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- method=ar\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=cli_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = folder_contents(tmp_path)
        result = cli_here(tmp_path.parent, *QUICK, "method=sparsespec", f"hydra.run.dir={tmp_path}")
        assert_one_line_error(result, f"is in use by another run (pid {holder.pid} on")
        assert folder_contents(tmp_path) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.slow
def test_the_lock_of_a_killed_run_does_not_block_its_resume(tmp_path):
    """filelock's FileLock is an flock: the kernel drops it with its process, even on SIGKILL."""
    code = ("import sys, time\n"
            "from sparsespec.harness.folder_lock import hold_folder\n"
            "with hold_folder(sys.argv[1]):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=cli_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {holder.pid} on"), hold_folder(tmp_path):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()                        # the file stays; its lock died with the holder
    with hold_folder(tmp_path):
        pass


@pytest.mark.slow   # a whole harness run, ~2 s: `make test`
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


def test_wandb_disabled_is_no_tracker_and_not_one_line(tmp_path, monkeypatch, caplog):
    """WANDB_MODE=disabled: no W&B run is started, so nothing is said about one and no save can fail."""
    import sparsespec.harness.tracking as tracking

    monkeypatch.setattr(tracking, "_start_wandb", lambda *a, **k: pytest.fail("W&B started while disabled"))
    caplog.set_level("DEBUG")
    tracker = make_tracker({"name": "wandb", "mode": "disabled", "project": "p"}, config={}, folder=tmp_path,
                           name="n", group=None)
    assert type(tracker) is Tracker and tracker.folder is None
    tracker.save_files([tmp_path / "samples.jsonl"])
    assert not [r for r in caplog.records if "W&B" in r.getMessage() or "wandb" in r.getMessage().lower()]


@pytest.mark.parametrize("alias, mode", [("dryrun", "offline"), ("run", "online")])
def test_wandbs_older_mode_names_are_its_current_ones(hydra_conf, monkeypatch, tmp_path, alias, mode):
    import sparsespec.harness.tracking as tracking
    from sparsespec.harness.checks import check_config

    monkeypatch.setenv("WANDB_MODE", alias)
    check_config(make())                                          # accepted, not "is unknown"
    started = []
    monkeypatch.setattr(tracking, "_has_login", lambda: True)
    monkeypatch.setattr(tracking, "_start_wandb", lambda options, mode, **k: started.append(mode) or SimpleNamespace(
        dir=str(tmp_path / "run" / "files"), url=None, define_metric=lambda *a, **kw: None))
    make_tracker({"name": "wandb", "mode": alias}, config={}, folder=tmp_path, name="n", group=None)
    assert started == [mode]
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match="logger.mode='sometimes' is unknown; accepted: offline, online, disabled"):
        check_config(make())


def test_sweep_lines_report_results_and_errors(tmp_path):
    (tmp_path / "0_a").mkdir()
    (tmp_path / "0_a" / "summary.json").write_text(json.dumps(
        {"run": {"method": "ar", "ctx": 1000}, "metrics": dict.fromkeys(METRIC_KEYS)}))
    (tmp_path / "1_b").mkdir()
    (tmp_path / "1_b" / "error.txt").write_text("ctx=60000 exceeds it\n")
    (tmp_path / "2_c").mkdir()
    (tmp_path / "2_c" / "error.txt").write_text("unexpected KeyError: 'x'\nTraceback (most recent call last):\n...")
    rows, errors = sweep_lines(tmp_path)
    assert len(rows) == 1 and "0_a" in rows[0]
    assert errors == ["  1_b: ctx=60000 exceeds it", "  2_c: unexpected KeyError: 'x'"]


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
        assert set(s) == SAMPLE_KEYS | {"run_position", "code", "code_dirty", "cpu", "cpu_capability", "gpu"}   # the runner adds its place, code, machine
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
def test_fixed_k_run_records_its_k_and_warns_once_past_the_trained_length(tmp_path, cli_here):
    """summary.json names the controller and k of a fixed-k run (k left at its default), and a
    context past the model's trained length (but within max_context) runs with one warning line,
    recorded in summary.json."""
    out = tmp_path / "run"
    result = cli_here(tmp_path, *QUICK, "num_prompts=1", "method=sparsespec_fixed", "model.trained_context=512",
                      f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: ctx=1000 + max_new_tokens=8 is past smollm2_135m's trained length 512; "
                        "RoPE extrapolates, so task quality is not meaningful, speed is"], result.stderr[-3000:]
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["method"] == "sparsespec_fixed" and run["method_name"] == "sparsespec"
    assert run["method_options"]["controller"] == "fixed" and run["method_options"]["k"] == 4
    assert run["warnings"] == [warnings[0].removeprefix("warning: ")]

@pytest.mark.slow
@pytest.mark.real_model
def test_killed_run_resumes_without_redoing_or_losing(tmp_path, cli_here):
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
    assert (out / LOCK_FILE).exists()                               # the killed run's lock must not block the resume

    result = cli_here(tmp_path, *args)                             # the resumes: run.py in this process
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 of 2 prompts already done" in result.stdout
    after = samples_path.read_text()
    assert after.startswith(first) and after.count("\n") == 2     # prompt 1 kept as it was, not redone
    assert len({s["prompt_id"] for s in read_samples(out)}) == 2
    assert json.loads((out / "summary.json").read_text())["metrics"]["n_prompts"] == 2

    again = cli_here(tmp_path, *args)                              # nothing left to do
    assert again.returncode == 0 and "2 of 2 prompts already done" in again.stdout
    assert samples_path.read_text() == after

    changed = cli_here(tmp_path, *args, "max_new_tokens=9")
    assert changed.returncode == 2 and "max_new_tokens: 8 -> 9" in changed.stderr


def test_an_interrupted_run_counts_what_it_kept_and_says_how_to_resume(tmp_path):
    from sparsespec.harness.interrupted import interrupted_line

    (tmp_path / "ar").mkdir()
    (tmp_path / "ar" / "samples.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "cut sh')   # the last line never finished
    (tmp_path / "pld").mkdir()
    (tmp_path / "pld" / "samples.jsonl").write_text('{"a": 1}\n')
    line = interrupted_line("run.py", ["ctx=300", "hydra.run.dir=old", "bench.methods=[pld]"], tmp_path, False)
    assert line == (f"interrupted: 3 finished samples kept in {tmp_path}; resume with: python run.py ctx=300 "
                    f"'bench.methods=[pld]' hydra.run.dir={tmp_path}")
    line = interrupted_line("run.py", ["-m", "method=ar,pld", "hydra.sweep.dir=x"], tmp_path / "none", True)
    assert line.endswith(f"0 finished samples kept in {tmp_path / 'none'}; resume with: python run.py -m "
                         f"method=ar,pld hydra.sweep.dir={tmp_path / 'none'}")


def test_sigterm_stops_a_run_as_ctrl_c_does_with_its_own_exit_code():
    """run.py's `except KeyboardInterrupt` prints the resume line; SIGTERM must reach it the same way,
    and exit with the shell's status for SIGTERM (143) where Ctrl-C exits 130."""
    from sparsespec.harness.interrupted import Terminated, exit_code, stop_like_ctrl_c_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    try:
        stop_like_ctrl_c_on_sigterm()
        with pytest.raises(KeyboardInterrupt) as stop:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(5)                                   # the handler runs before this returns
    finally:
        signal.signal(signal.SIGTERM, before)
    assert isinstance(stop.value, Terminated) and not isinstance(stop.value, Exception)
    assert exit_code(stop.value) == 143 and exit_code(KeyboardInterrupt()) == 130


@pytest.mark.slow
@pytest.mark.real_model
def test_ctrl_c_is_one_line_exit_130_and_its_command_resumes(tmp_path):
    """SIGINT after the first sample: no traceback, exit 130, one line with the samples kept and the
    command that resumes; that command finishes the run without redoing or losing a sample."""
    args = [*QUICK, "num_prompts=3"]
    proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not any(p.read_text().endswith("\n") for p in tmp_path.rglob("samples.jsonl")):
        assert proc.poll() is None, "the run ended before its first prompt was written"
        assert time.monotonic() < deadline, "no prompt finished within 240 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    [samples_path] = tmp_path.rglob("samples.jsonl")
    kept = samples_path.read_text()
    assert f"interrupted: {kept.count(chr(10))} finished sample" in line and kept.count("\n") < 3
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["python", str(REPO / "run.py")] and command[-1] == f"hydra.run.dir={samples_path.parent}"
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, env=cli_env(), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = samples_path.read_text()
    assert after.startswith(kept) and len({s["prompt_id"] for s in read_samples(samples_path.parent)}) == 3 == \
        after.count("\n")


@pytest.mark.real_model
def test_multirun_two_methods_through_submitit(tmp_path):
    # two jobs, not a grid: the ctx axis of a sweep is composed in test_config.py (a 2 x 2 grid here cost ~40 s)
    sweep = tmp_path / "sweep"
    result = cli(tmp_path, "-m", "method=ar,sparsespec", "ctx=1200", "hydra/launcher=submitit_local",
                 f"hydra.sweep.dir={sweep}", *QUICK[1:], "num_prompts=1", timeout=400,
                 OMP_NUM_THREADS="1")                               # 2 jobs share 2 cores
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(jobs) == 2, sorted(p.name for p in sweep.iterdir())
    runs = {(s["run"]["method"], s["run"]["ctx"]) for s in (json.loads((j / "summary.json").read_text()) for j in jobs)}
    assert runs == {("ar", 1200), ("sparsespec", 1200)}
    assert all(len(read_samples(j)) == 1 for j in jobs)
    assert (sweep / ".submitit").is_dir()                         # the jobs went through submitit
    assert all(j.name in result.stdout for j in jobs)              # the sweep report


@pytest.mark.slow   # runs all of run.py (Hydra's sweep, the runner), as the full suite's bad-input cases do
def test_sweep_job_errors_are_listed_and_exit_2(tmp_path, cli_here):
    sweep = tmp_path / "sweep"
    result = cli_here(tmp_path, "-m", "ctx=60k,64k", "logger=none", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "2 job(s) stopped on an error" in result.stderr and "Traceback" not in result.stderr
    assert len(list(sweep.glob("*/error.txt"))) == 2


@pytest.mark.slow   # runs run.py's command line, as the full suite's bad-input cases do
def test_help_lists_the_usable_groups_and_where_method_options_are(tmp_path, cli_here):
    result = cli_here(tmp_path, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.startswith("method_options")]
    assert any(line.startswith("method: ar, ") and "sparsespec_fixed" in line for line in lines)
    assert "python -m sparsespec.methods [method] lists every option" in result.stdout


@pytest.mark.slow   # starts a subprocess
@pytest.mark.parametrize("overrides, expected", [
    (["model=llama3_8b", "ctx=1k"], "hf download meta-llama/Meta-Llama-3-8B-Instruct"),
    (["task.source=longbench"], "hf download Xnhyacinth/LongBench"),
], ids=["model-offline", "dataset-offline"])
def test_unavailable_input_gives_one_line_error_on_the_command_line(tmp_path, overrides, expected):
    """A fresh `python run.py` (exit status, stderr, no traceback as the shell sees them); a fresh
    process also because huggingface_hub reads HF_HUB_OFFLINE when it is imported."""
    result = cli(tmp_path, *SMOKE, "logger=none", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(result, expected)


@pytest.mark.slow   # runs all of run.py (Hydra, the runner), as the full suite's bad-input cases do
@pytest.mark.parametrize("overrides, expected", [
    (["ctx=60k"], "exceeds model smollm2_135m's max_context=8192"),
    (["method.options.sink=0", "method.options.recent=0", "method.options.topk=0"], "leaves the draft no position"),
    (["task.source=arxiv"], "task.source='arxiv' is unknown"),
    (["+method.options.bogus=1"], "unknown option(s) ['bogus']"),
    (["method=ar", "+method.options.k=4"], "method 'ar' drafts nothing, so it takes no option(s) ['k']"),
    (["task=retrieval", "task.variant=needle"], "task.variant='needle' is unknown; accepted: mixed, niah_single"),
    (["-m", "method=ar,sparsespec", "method.options.budget=0.05"],
     "method=ar has no option 'budget' (it takes no options); to set it only where it exists, compare the "
     "methods in one run: 'bench.methods=[\"sparsespec:budget=0.05\"]'"),
], ids=["ctx-too-long", "budget-no-position",
        "unknown-source", "unknown-option", "ar-controller-option", "unknown-retrieval-variant",
        "sweep-option-one-method-lacks"])
def test_bad_input_gives_one_line_error(tmp_path, cli_here, overrides, expected):
    result = cli_here(tmp_path, *SMOKE, "logger=none", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(result, expected)


def make_bad_inputs(tmp: Path) -> None:
    """What the cases below point at: a file, an empty model folder, a model of an unknown
    architecture, a JSONL file broken on line 2, and a folder of one sample with a corrupt resume.json."""
    (tmp / "afile").write_text("")
    (tmp / "empty").mkdir()
    (tmp / "alien").mkdir()
    (tmp / "alien" / "config.json").write_text('{"model_type": "alien_arch"}')
    (tmp / "qa.jsonl").write_text('{"context": "a", "input": "b"}\n{"context": \n')
    (tmp / "corrupt").mkdir()
    SamplesFile(tmp / "corrupt").append({"prompt_id": "a", "method": "sparsespec"})
    (tmp / "corrupt" / RESUME).write_text("{oops")


@pytest.mark.slow
@pytest.mark.parametrize("overrides, expected", [
    (["temperature=nan"], "temperature=nan must be a finite number >= 0"),
    (["temperature=inf"], "temperature=inf must be a finite number >= 0"),
    (["temperature=abc"], "temperature='abc' must be a finite number >= 0"),
    (["top_p=nan"], "top_p=nan must be a number in (0, 1]"),
    (["seed=abc"], "seed='abc' must be an integer"),
    pytest.param(["device=cuda"], "device='cuda' but CUDA is not available here",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    pytest.param(["hydra.run.dir=/proc/x"], "hydra.run.dir=/proc/x cannot be created",
                 marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")),
    (["hydra.run.dir={tmp}/afile"], "afile is an existing file, not a folder"),
    (["hydra.run.dir={tmp}/afile/run"], "afile/run cannot be created (Not a directory)"),
    (["model.path={tmp}/empty"], "empty holds no config.json"),
    (["model.path={tmp}/alien"], "has model_type='alien_arch', which transformers"),
    (["task.source=longbench", "task.path={tmp}/nowhere"], "task.path={tmp}/nowhere does not exist"),
    pytest.param(["task=qa", "task.source=longbench", "task.path={tmp}/qa.jsonl"],
                 "qa.jsonl line 2 is not valid JSON", marks=pytest.mark.real_model),
    (["hydra.run.dir={tmp}/corrupt"], "resume.json is unreadable"),
], ids=["temperature-nan", "temperature-inf", "temperature-abc", "top_p-nan", "seed-abc", "cuda-absent",
        "run-dir-in-proc", "run-dir-is-file", "run-dir-under-file", "model-folder-empty", "model-type-unknown",
        "task-path-missing", "task-jsonl-malformed", "resume-json-corrupt"])
def test_unreliable_input_gives_one_line_error(tmp_path, cli_here, overrides, expected):
    make_bad_inputs(tmp_path)
    overrides = [o.format(tmp=tmp_path) for o in overrides]
    if not any(o.startswith("hydra.run.dir=") for o in overrides):
        overrides.append(f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(cli_here(tmp_path, *QUICK, "num_prompts=1", *overrides), expected.format(tmp=tmp_path))


@pytest.mark.slow
@pytest.mark.real_model
def test_a_run_stopped_by_bad_input_does_not_tie_its_folder(tmp_path, cli_here):
    """The issue's repro: a budget refused only once the run has started, then a good one."""
    out = tmp_path / "run"
    assert_one_line_error(cli_here(tmp_path, *QUICK, "num_prompts=1", "method.options.budget=-0.1",
                                   f"hydra.run.dir={out}"), "budget=-0.1")
    good = cli_here(tmp_path, *QUICK, "num_prompts=1", "method.options.budget=0.1", f"hydra.run.dir={out}")
    assert good.returncode == 0, good.stderr[-3000:]
    assert len(read_samples(out)) == 1
    assert json.loads((out / RESUME).read_text())["options"]["budget"] == 0.1


@pytest.mark.slow
@pytest.mark.real_model
def test_two_runs_into_one_folder_one_stops_at_once(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, str(REPO / "run.py"), *QUICK, f"hydra.run.dir={out}"]
    runs = [subprocess.Popen(command, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    done = {run.pid: subprocess.CompletedProcess(run.args, run.wait(timeout=300), *run.communicate())
            for run in runs}
    assert sorted(d.returncode for d in done.values()) == [0, 2], [d.stderr[-2000:] for d in done.values()]
    [winner] = [pid for pid, d in done.items() if d.returncode == 0]
    [loser] = [d for d in done.values() if d.returncode == 2]
    assert_one_line_error(loser, f"is in use by another run (pid {winner} on {socket.gethostname()}, started ")
    samples = read_samples(out)
    assert len(samples) == 2 and len({s["prompt_id"] for s in samples}) == 2


@pytest.mark.slow   # runs all of run.py (Hydra's sweep, the runner), as the full suite's bad-input cases do
def test_a_sweep_job_that_crashes_is_recorded_and_listed(tmp_path, cli_here, monkeypatch):
    """A bug in a job (here: loading raises RuntimeError) leaves error.txt, one line then the traceback;
    the other jobs run, the sweep report lists it by its first line and exits 2."""
    import sparsespec.harness.runner as runner

    def crash(config):
        raise RuntimeError(f"boom at seed {config.seed}")
    monkeypatch.setattr(runner, "load_inputs", crash)
    sweep = tmp_path / "sweep"
    result = cli_here(tmp_path, "-m", "seed=0,1", *QUICK, f"hydra.sweep.dir={sweep}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "2 job(s) stopped on an error" in result.stderr
    for seed in (0, 1):
        assert f": unexpected RuntimeError: boom at seed {seed}\n" in result.stderr
        [error] = sweep.glob(f"{seed}_*/error.txt")
        summary, *traceback = error.read_text().splitlines()
        assert summary == f"unexpected RuntimeError: boom at seed {seed}"
        assert traceback[0] == "Traceback (most recent call last):" and "in crash" in "\n".join(traceback)
