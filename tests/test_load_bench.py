"""experiments/load_bench.py's mechanics, not its speeds: the loads start and stop (by themselves,
or when their case ends), each case writes its record and the table, and a re-run skips written cases.
The harness runs in-process on a tiny model (model and prompt loading replaced); a load is a small
process of its own, as the benchmark runs it."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import sparsespec.harness.runner as runner
from conftest import build_tiny, random_prompt
from sparsespec.threads import thread_counts, using

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("load_bench", REPO / "experiments" / "load_bench.py")
load_bench = sys.modules["load_bench"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(load_bench)

ENTRY = "sparsespec:budget=0.5"     # 150 of the tiny prompts' 300 tokens: room for sink + recent
RUN = ["ctx=1k", "num_prompts=2", "max_new_tokens=8", "warmup=false"]


def wait_for_exit(process, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_load_stops_by_itself_at_its_limit():
    with load_bench.Background(load_bench.LOADS["spin"], seconds=0.3) as background:
        wait_for_exit(background.process)
    assert background.process.returncode == 0                 # ended on its own, not terminated
    assert background.outlived is False and background.ran_s >= 0.3


def test_a_load_is_stopped_when_its_case_ends():
    with load_bench.Background(load_bench.LOADS["spin"], seconds=120) as background:
        assert background.process.poll() is None               # running beside the block
    assert background.process.poll() is not None and background.outlived is True
    assert background.ran_s < 60


def test_a_load_stops_when_the_benchmark_process_is_gone():
    parent = subprocess.Popen([sys.executable, "-c", (
        f"import sys, time; sys.path.insert(0, {str(REPO / 'experiments')!r}); import load_bench\n"
        "b = load_bench.Background(load_bench.LOADS['spin'], 120).__enter__()\n"
        "print(b.process.pid, flush=True); time.sleep(120)")], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.kill()                                              # no clean-up runs in the parent
    parent.wait()
    deadline = time.monotonic() + 30
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(worker)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may wait for a reaper)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "\tZ" not in next(line for line in status.read_text().splitlines() if line.startswith("State:"))
    except FileNotFoundError:
        return False


def test_a_load_that_cannot_start_stops_its_case_with_the_reason():
    broken = load_bench.Load("broken", "a worker that does not exist", "storm")
    with pytest.raises(RuntimeError, match="the broken load did not start \\(exit status 2\\)"):
        with load_bench.Background(broken, seconds=5):
            pytest.fail("the case ran without its load")


def test_no_load_starts_no_process():
    with load_bench.Background(load_bench.LOADS["quiet"], seconds=120) as background:
        pass
    assert background.process is None and background.outlived is None


def test_the_matmul_load_multiplies_two_rows_until_its_limit():
    with using(torch.get_num_threads()):                       # the worker sets its own count
        start = time.monotonic()
        count = load_bench.matmul(0.2, threads=1)
    assert count > 0 and 0.2 <= time.monotonic() - start < 10


@pytest.mark.slow   # a process that imports torch
def test_the_matmul_load_runs_as_a_process_and_stops_by_itself():
    with load_bench.Background(load_bench.LOADS["matmul"], seconds=1.0) as background:
        wait_for_exit(background.process, limit_s=120)
    assert background.process.returncode == 0 and background.outlived is False


def test_k0_share_counts_rounds_that_drafted_nothing():
    samples = [{"rounds": [{"drafted": 0}, {"drafted": 3}]}, {"rounds": [{"drafted": 0}, {"drafted": 0}]}]
    assert load_bench.k0_share(samples) == 0.75
    assert load_bench.k0_share([{"rounds": []}]) is None


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--cases", "quiet,storm"], "unknown case storm; accepted: quiet, spin, matmul"),
    (["--out", "x", "--load-s", "0"], "'0' must be a number of seconds > 0"),
    (["--cases", "quiet"], "--out FOLDER is required"),
    (["--out", "x", "num_prompts"], "'num_prompts' is neither an option of this script nor a run.py override"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        load_bench.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.fixture
def tiny_harness(monkeypatch):
    model = build_tiny("llama")

    def prompts(n):
        return [SimpleNamespace(id=f"p{i}", input_ids=random_prompt(300, seed=i)[0], reference=None) for i in range(n)]
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids)))
    monkeypatch.setattr(runner, "load_inputs", lambda cfg: (model, tokenizer, prompts(cfg.num_prompts)))


@pytest.mark.slow   # three harness runs beside worker processes
def test_each_case_writes_its_record_and_the_table_and_a_rerun_skips_it(tiny_harness, tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench"
    assert load_bench.main(["--out", str(out), "--cases", "quiet,spin", "--load-s", "120", "--method", ENTRY, *RUN]) == 0
    records = {case: json.loads((out / case / "case.json").read_text()) for case in ("quiet", "spin")}
    for case, record in records.items():
        samples = [json.loads(line) for line in (out / case / "sparsespec-budget=0.5" / "samples.jsonl").read_text().splitlines()]
        assert record["outputs_match_ar"] == 1.0 and record["n_prompts"] == 2
        assert record["k0_share"] == load_bench.k0_share(samples)
        assert record["threads"] in thread_counts() and record["ar_threads"] in thread_counts()
        assert (out / case / "ar" / "summary.json").exists()
    assert records["quiet"]["load_outlived_run"] is None
    assert records["spin"]["load_outlived_run"] is True and records["spin"]["load_ran_s"] < 60   # stopped at the end
    table = (out / "load_bench.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["quiet", "spin"]

    ran = []
    monkeypatch.setattr(load_bench, "run_case", lambda *args, **kwargs: ran.append(args))
    written = {case: (out / case / "case.json").read_text() for case in records}
    capsys.readouterr()
    assert load_bench.main(["--out", str(out), "--cases", "quiet,spin", "--method", ENTRY, *RUN]) == 0
    assert ran == [] and "quiet: done already" in capsys.readouterr().out
    assert {case: (out / case / "case.json").read_text() for case in records} == written
    assert (out / "load_bench.md").read_text().splitlines() == table


def test_a_library_case_gives_the_first_call_and_the_later_calls_apart(tmp_path, monkeypatch):
    """The library case decodes through `sparsespec.generate` with call memory on: its first prompt's
    calls open with none (even where an earlier case ran on the same model), the later ones recall."""
    from sparsespec.harness import decoding
    model = build_tiny("llama")
    prompts = [SimpleNamespace(id=f"p{i}", input_ids=random_prompt(300, seed=i)[0], reference=None) for i in range(3)]
    monkeypatch.setattr(decoding, "load_inputs", lambda cfg: (model, None, prompts))
    out = tmp_path / "bench"
    argv = ["--out", str(out), "--cases", "quiet", "--library-only", "--library-tokens", "8,12", "--method", ENTRY, *RUN]
    assert load_bench.main(argv) == 0
    for tokens in (8, 12):                   # the second case runs on the model the first one taught
        record = json.loads((out / f"library_quiet_{tokens}" / "case.json").read_text())
        samples = [json.loads(line) for line in (out / f"library_quiet_{tokens}" / "samples.jsonl").read_text().splitlines()]
        assert [s["recalled"] for s in samples] == [False, True, True] and record["later_recalled"] == 2
        ratios = [s[f"{ENTRY}_tokens_per_s"] / s["ar_tokens_per_s"] for s in samples]
        assert record["speedup_first_call"] == pytest.approx(ratios[0])
        assert record["speedup_later_calls"] == pytest.approx((ratios[1] * ratios[2]) ** 0.5)
        assert record["outputs_match_ar"] == 1.0
    header, _, *rows = (out / "load_bench.md").read_text().splitlines()
    columns = [c.strip() for c in header.split("|")]
    first, later = columns.index("first call"), columns.index("later calls (95% CI)")
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        assert cells[first].endswith("x") and cells[later].split()[0].endswith("x")
