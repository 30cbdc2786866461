"""The same cells decoded by two commits, alternating processes: how much the newer code changes speed.

    python experiments/paired_code.py docs/runs/paired_code_library_call_memory
    python experiments/paired_code.py --old docs/runs/matrix/smollm2_8k/0_smollm2_135m_summarization_ctx8000 \
                                      --new docs/runs/pending/smollm2_8k/0_smollm2_135m_summarization_ctx8000

FOLDER holds `old_1, new_1, old_2, new_2, ...` (each one run of a commit, in the order run); or the runs
are named with `--old DIR --new DIR`, repeated, the i-th --old paired with the i-th --new. A run is either
harness folders (`run.py ... hydra.run.dir=FOLDER/old_1`: one `<entry>/samples.jsonl` per method) or
library load cases (`load_bench.py --library-only --out FOLDER/old_1`: `<case>/samples.jsonl`, one line a
prompt with `ar_tokens_per_s` and `<method>_tokens_per_s`). Runs are paired by number (old_i with
new_i) and their samples by prompt id. For each method, per prompt and repetition (n = prompts x pairs):

    speed-up   (new tok/s / new AR tok/s) / (old tok/s / old AR tok/s): what the claims read, each
               ratio taken inside one process, so the machine's drift between processes cancels
    tok/s      new / old of the method's own tokens/s, and of AR's (the drift itself)

with the geometric mean and its 95% interval (`sparsespec.stats.geometric_ci`); beside them, each
commit's own speed-up over AR pooled over its runs. Library cases add the later calls alone: each run's
first prompt left out (the model's first call, with no call memory).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.load import read_jsonl  # noqa: E402
from sparsespec.stats import geometric_ci  # noqa: E402

RUN = re.compile(r"^(old|new)_(\d+)$")


def runs(folder: Path) -> list[tuple[Path, Path]]:
    """(old_i, new_i) for every i both exist for, in order."""
    found = {(m.group(1), int(m.group(2))): p for p in folder.iterdir() if (m := RUN.match(p.name)) and p.is_dir()}
    pairs = [(found["old", i], found["new", i]) for i in sorted({i for _, i in found}) if ("old", i) in found
             and ("new", i) in found]
    if not pairs:
        raise SystemExit(f"error: {folder} holds no old_N and new_N run folders of the same N")
    return pairs


def samples(run: Path) -> dict[str, list[dict]]:
    """method -> its samples in prompt order, each {"prompt_id", "tokens_per_s", "ar_tokens_per_s"}."""
    out = {}
    for path in sorted(run.glob("*/samples.jsonl")):
        rows = read_jsonl(path)
        if not rows:
            continue
        if "tokens_per_s" in rows[0]:                       # a harness method folder
            if rows[0].get("method") != "ar":
                out[path.parent.name] = [{"prompt_id": r["prompt_id"], "tokens_per_s": r["tokens_per_s"],
                                          "ar_tokens_per_s": r["ar_tokens_per_s"]} for r in rows]
            continue
        for key in rows[0]:                                 # a library case: <method>_tokens_per_s beside AR's
            if key.endswith("_tokens_per_s") and key != "ar_tokens_per_s":
                label = f"{path.parent.name}: {key.removesuffix('_tokens_per_s')}"
                out[label] = [{"prompt_id": r["prompt_id"], "tokens_per_s": r[key],
                               "ar_tokens_per_s": r["ar_tokens_per_s"], "library": True} for r in rows]
    return out


def compare(run_pairs: list[tuple[Path, Path]]) -> list[dict]:
    """One record per method: the paired estimates (module docstring) over (old, new) run folders."""
    pairs = [(samples(old), samples(new)) for old, new in run_pairs]
    records = []
    for method in sorted(set.intersection(*(set(o) & set(n) for o, n in pairs))):
        rows = []
        for old, new in pairs:
            by_id = {s["prompt_id"]: s for s in old[method]}
            rows += [(i, by_id[s["prompt_id"]], s) for i, s in enumerate(new[method]) if s["prompt_id"] in by_id]
        old_x = [o["tokens_per_s"] / o["ar_tokens_per_s"] for _, o, _ in rows]
        new_x = [n["tokens_per_s"] / n["ar_tokens_per_s"] for _, _, n in rows]
        speedup = [n / o for o, n in zip(old_x, new_x)]
        record = {"method": method, "n": len(rows), "speedup": geometric_ci(speedup),
                  "old": geometric_ci(old_x), "new": geometric_ci(new_x),
                  "tokens_per_s": geometric_ci(n["tokens_per_s"] / o["tokens_per_s"] for _, o, n in rows),
                  "ar_tokens_per_s": geometric_ci(n["ar_tokens_per_s"] / o["ar_tokens_per_s"] for _, o, n in rows)}
        if new[method][0].get("library"):
            later = [i > 0 for i, _, _ in rows]
            record["later_calls"] = geometric_ci(r for r, keep in zip(speedup, later) if keep)
            record["new_later_calls"] = geometric_ci(x for x, keep in zip(new_x, later) if keep)
        records.append(record)
    return records


def describe(estimate) -> str:
    return f"{estimate.mean:.3f}x [{estimate.low:.3f}, {estimate.high:.3f}], n = {estimate.n}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="a folder of old_N / new_N runs")
    parser.add_argument("--old", type=Path, action="append", default=[], help="an old run folder (repeatable)")
    parser.add_argument("--new", type=Path, action="append", default=[], help="a new run folder (repeatable)")
    args = parser.parse_args(argv)
    if (args.folder is None) == (not args.old and not args.new):
        parser.exit(2, "error: give either FOLDER or --old DIR --new DIR, not both and not neither\n")
    if len(args.old) != len(args.new):
        parser.exit(2, f"error: {len(args.old)} --old but {len(args.new)} --new; they pair in order, so give as many\n")
    for path in [args.folder] if args.folder else args.old + args.new:
        if not path.is_dir():
            parser.exit(2, f"error: {path} is not a folder\n")
    for r in compare(runs(args.folder) if args.folder else list(zip(args.old, args.new))):
        print(f"{r['method']}: new / old speed-up over AR {describe(r['speedup'])}"
              + (f"; later calls {describe(r['later_calls'])}" if "later_calls" in r else ""))
        print(f"  tok/s new / old: method {describe(r['tokens_per_s'])}; AR {describe(r['ar_tokens_per_s'])}")
        print(f"  speed-up over AR, runs pooled: old {describe(r['old'])}; new {describe(r['new'])}"
              + (f" (later calls {describe(r['new_later_calls'])})" if "new_later_calls" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
