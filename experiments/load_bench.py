"""AR and SparseSpec-L on the same prompts, quiet and beside controlled background loads.

    python experiments/load_bench.py --out docs/runs/load_bench [--cases quiet,spin,matmul] [--load-s 1800] \
        [run.py overrides: ctx=4k num_prompts=4 max_new_tokens=64 ...]

Each case is one side-by-side harness run (`bench.methods=[sparsespec]`: AR and sparsespec from one
shared prefill a prompt, each at its own measured thread count) into `<out>/<case>/`, while its load runs:

    quiet   no load
    spin    a second process spinning one thread at normal priority
    matmul  a second process at normal priority running 2 threads of 2-row matmuls (1536 x 576, SmolLM2's
            MLP), like a second decoding job on the node: the load that stalls a verification's threads

With `--library`, each load also gets a `library` case per length of `--library-tokens` (default
64 and 256): the same prompts decoded by `sparsespec.generate(model, ids, method=...)` as a library
user calls it (defaults: no cost profile, threads chosen online; each call its own prefill), AR and the
method alternating which goes first, into `<out>/library_<case>_<tokens>/case.json`. The first prompt's
calls are the model's first; each later call starts from what the calls before it learned
(sparsespec/call_memory.py), so the table gives the first call's speed-up and the later calls' apart.

A load is bounded in time: it stops by itself after --load-s seconds or once the benchmark's process
is gone, and the case stops it when its run ends. Every case writes `<out>/<case>/case.json` (speed-up, chosen threads, share of k = 0
rounds, whether the machine was busy, whether the load lasted the whole run), then `<out>/load_bench.md`
tables every case written so far. A case whose case.json exists is skipped; an unfinished one resumes
where its run stopped (the harness resumes per prompt).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CASE_FILE = "case.json"
TABLE_FILE = "load_bench.md"
METHOD = "sparsespec"     # the default entry beside AR: the method with its defaults
LOAD_S = 1800.0      # a load's own limit: longer than one case at 8K here, short enough that a stray one ends
MATMUL_SHAPE = (2, 576, 1536)    # rows x in x out: one 2-row verification's MLP product on SmolLM2-135M
MATMUL_THREADS = 2               # the threads that each wait for the other core
READY = "load running"           # a worker's first line: its loop has begun


@dataclass(frozen=True)
class Load:
    """A background load: what it is, and the worker command of a bounded process (None: no load)."""
    name: str
    description: str
    worker: str | None


LOADS = {load.name: load for load in (
    Load("quiet", "no background load", None),
    Load("spin", "a second process spinning one thread, normal priority", "spin"),
    Load("matmul", f"a second process, normal priority: {MATMUL_THREADS} threads of {MATMUL_SHAPE[0]}-row matmuls", "matmul"),
)}


# --------------------------------------------------------------------------------------------
# the loads (each runs in its own process, started with --worker)


def spin(seconds: float, parent: int | None = None) -> int:
    """Spin one thread until `seconds` have passed or the process `parent` is gone; the loop count."""
    go_on, n = lasting(seconds, parent), 0
    while go_on():
        n += 1
    return n


def lasting(seconds: float, parent: int | None = None):
    """A check that stays true until `seconds` have passed or this process's parent is no longer
    `parent` (the benchmark that started it ended; default: the parent now). Says READY on stdout:
    the load starts now."""
    deadline, parent = time.monotonic() + seconds, os.getppid() if parent is None else parent
    print(READY, flush=True)
    return lambda: time.monotonic() < deadline and os.getppid() == parent


def matmul(seconds: float, parent: int | None = None, threads: int = MATMUL_THREADS) -> int:
    """2-row products with `threads` intra-op threads until `seconds` have passed or the process
    `parent` is gone; the product count."""
    import torch

    torch.set_num_threads(threads)
    rows, k, n = MATMUL_SHAPE
    x, w = torch.randn(rows, k), torch.randn(n, k)
    go_on, count = lasting(seconds, parent), 0
    while go_on():
        torch.nn.functional.linear(x, w)
        count += 1
    return count


WORKERS = {"spin": spin, "matmul": matmul}


class Background:
    """`with Background(load, seconds):` runs the load's process beside the block and stops it after.
    `ran_s`: how long it lived; `outlived` whether it was still running when the block ended."""

    def __init__(self, load: Load, seconds: float):
        self.load, self.seconds = load, seconds
        self.process: subprocess.Popen | None = None
        self.ran_s: float | None = None
        self.outlived: bool | None = None

    def __enter__(self):
        if self.load.worker is not None:
            self.started = time.monotonic()
            self.process = subprocess.Popen([sys.executable, __file__, "--worker", self.load.worker, "--load-s",
                                             str(self.seconds), "--parent", str(os.getpid())],
                                            stdout=subprocess.PIPE, text=True)
            if self.process.stdout.readline().strip() != READY:      # the case starts once the load runs
                raise RuntimeError(f"the {self.load.name} load did not start (exit status {self.process.wait()})")
            self._watch = threading.Thread(target=self._wait, daemon=True)
            self._watch.start()
        return self

    def _wait(self):
        self.process.wait()
        self.ran_s = time.monotonic() - self.started

    def __exit__(self, *exc):
        if self.process is None:
            return False
        self.outlived = self.process.poll() is None
        if self.outlived:
            self.process.terminate()
        self._watch.join(timeout=10)
        if self.process.poll() is None:        # did not stop when asked
            self.process.kill()
            self._watch.join()
        self.process.stdout.close()
        return False


# --------------------------------------------------------------------------------------------
# a case


def k0_share(samples: list[dict]) -> float | None:
    """Share of decode rounds that drafted nothing (k = 0: a plain AR step) over the samples' rounds."""
    rounds = [r for s in samples for r in s.get("rounds") or []]
    return sum(r["drafted"] == 0 for r in rounds) / len(rounds) if rounds else None


def run_case(load: Load, folder: Path, overrides: list[str], load_s: float, method: str = METHOD) -> dict:
    """The harness's side-by-side run of AR and `method` (a bench.methods entry) into `folder` beside
    `load`; the case record."""
    from hydra import compose, initialize_config_dir

    from sparsespec.harness import runner
    from sparsespec.harness.contexts import exact_context_overrides

    overrides = ["logger=none", f"bench.methods=['{method}']", *exact_context_overrides(overrides)]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with Background(load, load_s) as background:
        summaries = runner.run(cfg, folder)
    return case_record(load, folder, summaries, background, overrides, method)


def case_record(load: Load, folder: Path, summaries: dict, background: Background, overrides: list[str],
                method: str) -> dict:
    """What case.json holds: the case's speeds, threads, k = 0 share, and whether load and machine were as meant."""
    from analysis.load import read_jsonl
    from sparsespec.harness.entries import entry_folder
    from sparsespec.harness.run_config import AR

    ar, spec = summaries[AR], summaries[method]
    samples = read_jsonl(folder / entry_folder(method) / "samples.jsonl")
    m = spec["metrics"]
    return {"case": load.name, "load": load.description, "method": method, "overrides": overrides,
            "load_ran_s": background.ran_s, "load_outlived_run": background.outlived,
            "ar_tokens_per_s": ar["metrics"]["tokens_per_s"], "tokens_per_s": m["tokens_per_s"],
            "speedup_vs_ar": m["speedup_vs_ar"], "speedup_ci95": [m["speedup_vs_ar_ci95_low"], m["speedup_vs_ar_ci95_high"]],
            "outputs_match_ar": m["outputs_match_ar"], "k0_share": k0_share(samples),
            "ar_threads": threads_of(ar), "threads": threads_of(spec), "bench": spec["run"]["bench"],
            "cpu": spec["env"]["cpu"], "cpu_flags": spec["env"].get("cpu_flags"), "blas": spec["env"].get("blas"),
            "n_prompts": m["n_prompts"]}


def run_library_case(load: Load, folder: Path, overrides: list[str], load_s: float, tokens: int,
                     method: str = METHOD) -> dict:
    """AR and `method` (an entry, `name[:option=value,...]`) through `sparsespec.generate` with its
    defaults otherwise, on the run's prompts, beside `load`; the case record (the same fields as a
    harness case)."""
    import torch
    from hydra import compose, initialize_config_dir

    import sparsespec
    from sparsespec.harness.checks import method_options
    from sparsespec.harness.contexts import exact_context_overrides
    from sparsespec.harness.entries import method_node
    from sparsespec.harness.decoding import load_inputs
    from sparsespec.harness.environment import collect
    from sparsespec.harness.run_config import build_run_config
    from sparsespec.stats import geometric_ci

    overrides = ["logger=none", *exact_context_overrides(overrides)]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        config = build_run_config(compose("config", overrides=overrides), folder)
        node = method_node(method)
    calls = {"ar": ("ar", {}), method: (node.name, method_options(node))}
    model, _, prompts = load_inputs(config)
    sparsespec.forget(model)           # the case's first prompt is the model's first call
    folder.mkdir(parents=True, exist_ok=True)
    samples = []
    with Background(load, load_s) as background:
        for i, prompt in enumerate(prompts):
            ids = torch.as_tensor(prompt.input_ids)
            order = ("ar", method) if i % 2 == 0 else (method, "ar")
            gens = {m: sparsespec.generate(model, ids, method=calls[m][0], max_new_tokens=tokens, stop_at_eos=False,
                                           **calls[m][1]) for m in order}
            samples.append({"prompt_id": str(prompt.id), "order": list(order),
                            "threads": {m: [r.threads for r in g.rounds] for m, g in gens.items()},
                            **{f"{m}_tokens_per_s": g.tokens_per_s for m, g in gens.items()},
                            "match": gens[method].tokens == gens["ar"].tokens,
                            "recalled": gens[method].options["recalled"],     # started from an earlier call
                            # each round's choice and seconds, and AR's steps beside them: where a case lost
                            "rounds": [{"drafted": r.drafted, "accepted": r.accepted, "choice": r.choice,
                                        "s": round(r.seconds, 5)} for r in gens[method].rounds],
                            "ar_round_s": [round(r.seconds, 5) for r in gens["ar"].rounds]})
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    ratios = [s[f"{method}_tokens_per_s"] / s["ar_tokens_per_s"] for s in samples]
    speedup = geometric_ci(ratios)
    later = geometric_ci(ratios[1:]) if len(ratios) > 2 else None
    env = collect(device="cpu", dtype=config.dtype)
    return {"case": f"library {load.name} @{tokens}", "load": load.description, "method": f"{method} (generate)",
            "overrides": overrides, "load_ran_s": background.ran_s, "load_outlived_run": background.outlived,
            "ar_tokens_per_s": geometric_ci(s["ar_tokens_per_s"] for s in samples).mean,
            "tokens_per_s": geometric_ci(s[f"{method}_tokens_per_s"] for s in samples).mean,
            "speedup_vs_ar": speedup.mean, "speedup_ci95": [speedup.low, speedup.high],
            # a first call on the model opens with no memory; the later ones start from the calls before
            "speedup_first_call": ratios[0],
            "speedup_later_calls": None if later is None else later.mean,
            "speedup_later_ci95": None if later is None else [later.low, later.high],
            "later_recalled": sum(s["recalled"] for s in samples[1:]),
            "outputs_match_ar": sum(s["match"] for s in samples) / len(samples), "k0_share": k0_share(samples),
            "ar_threads": most_rounds_at(samples, "ar"), "threads": most_rounds_at(samples, method), "bench": None,
            "cpu": env.get("cpu"), "cpu_flags": env.get("cpu_flags"), "blas": env.get("blas"), "n_prompts": len(samples)}


def most_rounds_at(samples: list[dict], method: str) -> int:
    """The thread count most of `method`'s rounds ran at, over the case's samples (the online rule's choice)."""
    counts = [t for s in samples for t in s["threads"][method]]
    return max(set(counts), key=counts.count)


def threads_of(summary: dict) -> int | None:
    choice = summary["run"].get("threads")
    return None if choice is None else choice["threads"]


# --------------------------------------------------------------------------------------------
# the table


def table(records: list[dict]) -> str:
    """One row per case, in the order run."""
    from sparsespec.harness.report import interval
    from sparsespec.tables import format_cell, markdown_table

    columns = ["case", "load", "AR tok/s", "AR threads", "method", "tok/s", "threads", "speed-up (95% CI)",
               "first call", "later calls (95% CI)", "k=0 rounds", "match AR", "machine busy", "load lasted"]
    rows = []
    for r in records:
        low, high = r["speedup_ci95"]
        ci = f" {interval(low, high)}" if low is not None else ""
        rows.append(dict(zip(columns, [
            r["case"], r["load"], format_cell(r["ar_tokens_per_s"], ".2f"), format_cell(r["ar_threads"], "d"),
            r["method"], format_cell(r["tokens_per_s"], ".2f"), format_cell(r["threads"], "d"),
            f"{format_cell(r['speedup_vs_ar'], '.2f')}x{ci}", *first_and_later(r), format_cell(r["k0_share"], ".0%"),
            format_cell(r["outputs_match_ar"], ".0%"), format_cell((r["bench"] or {}).get("noisy")),
            "-" if r["load_outlived_run"] is None else ("whole run" if r["load_outlived_run"] else "ended early")])))
    return markdown_table(rows, columns)


def first_and_later(record: dict) -> tuple[str, str]:
    """A library case's speed-up on its first prompt (no call memory) and on the later ones (each
    starting from the calls before it); '-' for a harness case, or one written before call memory."""
    from sparsespec.harness.report import interval
    from sparsespec.tables import format_cell

    if record.get("speedup_first_call") is None:
        return "-", "-"
    first = f"{format_cell(record['speedup_first_call'], '.2f')}x"
    if record.get("speedup_later_calls") is None:
        return first, "-"
    low, high = record["speedup_later_ci95"]
    return first, f"{format_cell(record['speedup_later_calls'], '.2f')}x {interval(low, high)}"


def write_table(out: Path) -> Path:
    records = [json.loads(p.read_text()) for p in sorted(out.glob(f"*/{CASE_FILE}"), key=lambda p: p.stat().st_mtime)]
    path = out / TABLE_FILE
    path.write_text(table(records) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# the command line


def parse_cases(text: str) -> list[Load]:
    """`quiet,matmul` -> those loads, in order, each once."""
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in LOADS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown case {', '.join(bad) or '(none given)'}; "
                                         f"accepted: {', '.join(LOADS)}")
    return [LOADS[n] for n in dict.fromkeys(names)]


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.error = lambda message: parser.exit(2, f"error: {message}\n")     # one line, no usage block
    parser.add_argument("--out", type=Path, help="folder of the cases (<out>/<case>/) and load_bench.md")
    parser.add_argument("--cases", type=parse_cases, default=list(LOADS.values()),
                        help=f"comma-separated, from: {', '.join(LOADS)} (default: all)")
    parser.add_argument("--load-s", type=positive_seconds, default=LOAD_S, help="a load's own time limit")
    parser.add_argument("--method", default=METHOD, help="the bench.methods entry beside AR (default: sparsespec)")
    parser.add_argument("--library", action="store_true",
                        help="also run each load's library cases: sparsespec.generate with its defaults")
    parser.add_argument("--library-only", action="store_true", help="only the library cases")
    parser.add_argument("--library-tokens", default="64,256", help="new tokens of the library cases (comma-separated)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)   # a load's process
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)                  # ... and the benchmark's
    args, overrides = parser.parse_known_args(argv)
    if args.worker:
        print(WORKERS[args.worker](args.load_s, args.parent))
        return 0
    if args.out is None:
        parser.exit(2, "error: --out FOLDER is required (where the cases and load_bench.md are written)\n")
    bad = [o for o in overrides if "=" not in o or o.startswith("-")]
    if bad:
        parser.exit(2, f"error: {bad[0]!r} is neither an option of this script nor a run.py override key=value\n")
    try:
        lengths = [int(n) for n in args.library_tokens.split(",") if n]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        parser.exit(2, f"error: --library-tokens {args.library_tokens!r} must be positive integers, e.g. 64,256\n")
    library = lengths if args.library or args.library_only else []
    return run_cases(args.cases, args.out, overrides, args.load_s, args.method, library, harness=not args.library_only)


def run_cases(cases: list[Load], out: Path, overrides: list[str], load_s: float, method: str = METHOD,
              library: list[int] = (), harness: bool = True) -> int:
    """Run every case not written yet (the harness's, and the library's at each length of
    `library`), then table all written ones."""
    from hydra.errors import HydraException

    from sparsespec.errors import ConfigError, UnavailableError, exit_with_error
    from sparsespec.tables import format_cell

    out.mkdir(parents=True, exist_ok=True)
    jobs = [(load, None) for load in cases if harness] + [(load, n) for load in cases for n in library]
    for load, tokens in jobs:
        name = load.name if tokens is None else f"library_{load.name}_{tokens}"
        record_path = out / name / CASE_FILE
        if record_path.exists():
            print(f"{name}: done already ({record_path}), skipped", flush=True)
            continue
        try:
            if tokens is None:
                record = run_case(load, out / name, overrides, load_s, method)
            else:
                record = run_library_case(load, out / name, overrides, load_s, tokens, method)
        except (ConfigError, UnavailableError, HydraException) as err:
            exit_with_error(err)
        record_path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name}: {record['speedup_vs_ar']:.2f}x, threads AR {record['ar_threads']} / "
              f"{method} {record['threads']}, k=0 rounds {format_cell(record['k0_share'], '.0%')}", flush=True)
    print(f"table: {write_table(out)}", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))   # a kill stops the running load too
    sys.exit(main())
