"""Load sparsespec results into one tidy DataFrame: one row per prompt x run.

Two sources give the same columns (see docs/CONTRACTS.md for the files):
- local run folders: a single run folder, or any tree of them (Hydra multirun
  `multirun/<date>/<time>/<job>/`), found by their `samples.jsonl`;
- W&B runs, `wandb.Api().runs(path, filters={"group": ...})`, mapped by `rows_from_wandb_run`.

Only where a row came from differs between the two sources: the `run` column, and `job` for a run
that is a job of its own (its label).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
HYDRA_CONFIG = Path(".hydra") / "config.yaml"

# Columns taken from summary.json's "run" section (or the config when it is missing).
RUN_COLUMNS = ("model", "task", "source", "method", "ctx", "seed", "dtype", "device", "temperature")
# Method options that the figures sweep over.
OPTION_COLUMNS = ("controller", "k", "budget")
# Scalars of one samples.jsonl line.
SAMPLE_COLUMNS = ("prompt_id", "context_tokens", "new_tokens", "prefill_s", "decode_s",
                  "tokens_per_s", "mean_accepted", "acceptance_rate", "ar_tokens_per_s",
                  "ar_decode_s", "ar_prefill_s", "speedup_vs_ar", "outputs_match_ar", "score",
                  "run_position", "depth",        # depth: where the evidence sits (retrieval), else None
                  # a batched run's rows (batch_size > 1): row 0 of each batch carries the batch's speed-up
                  "batch_size", "batch_row", "batch_speedup_vs_ar")
TIME_SPLIT_KEYS = ("prefill", "draft", "verify", "select", "other")
# summary.json "metrics", prefixed with "run_" (pooled over the run's prompts). Its ratios (speed-ups,
# bounds) are geometric means where ratio_mean is "geometric"; older summaries (no ratio_mean) hold
# arithmetic means, so the tables recompute speed-ups from the samples rather than average these.
METRIC_KEYS = ("n_prompts", "tokens_per_s", "ar_tokens_per_s", "ratio_mean", "speedup_vs_ar", "speedup_vs_ar_log_std",
               "speedup_vs_ar_ci95_low", "speedup_vs_ar_ci95_high", "mean_accepted", "acceptance_rate",
               "prefill_s_mean", "decode_s_mean", "outputs_match_ar", "score_mean", "c_ar_s", "c_draft_s",
               "c_verify_s", "select_s_per_round", "draft_steps_per_round", "bound", "bound_reached",
               # batched runs only (batch_size > 1; see sparsespec/harness/results.py batch_metrics)
               "batch_size", "n_batches", "batch_tokens_per_s", "ar_batch_tokens_per_s", "batch_speedup_vs_ar",
               "batch_speedup_vs_ar_ci95_low", "batch_speedup_vs_ar_ci95_high", "sequence_latency_s_mean",
               "batch_bound", "batch_bound_reached")

# Where a run's code came from, how quiet its machine was and which attention path its AR denominator
# used (summary.json env.git, run.bench.noisy, run.ar_variants.ar_attention).
PROVENANCE_COLUMNS = ("commit", "dirty", "code", "code_dirty", "noisy", "ar_path")

COLUMNS = (("run", "experiment", *RUN_COLUMNS, *OPTION_COLUMNS, "budget_frac", "hardware", "run_wall_s",
            "prefill_sharers", "job", *PROVENANCE_COLUMNS)
           + SAMPLE_COLUMNS + ("n_rounds",) + tuple(f"time_{k}_s" for k in TIME_SPLIT_KEYS)
           + tuple(f"run_{k}" for k in METRIC_KEYS) + ("rounds",))

# Methods whose draft length is fixed (no controller) and the one driven by the entropy controller.
FIXED_K_METHODS = ("sparsespec_fixed",)
CONTROLLED_METHODS = ("sparsespec",)


# ---------------------------------------------------------------- shared: records -> rows

def _get(mapping: Any, dotted: str, default: Any = None) -> Any:
    """`_get(cfg, "method.options.k")`: a nested lookup that tolerates missing levels."""
    node = mapping
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _group_name(config: dict, group: str) -> Any:
    """The name of a config group's choice: `cfg[group]["name"]`, or the value itself when scalar."""
    node = config.get(group) if isinstance(config, dict) else None
    if isinstance(node, dict):
        return node.get("name")
    return node


def run_section_from_config(config: dict) -> dict:
    """Rebuild summary.json's "run" section from a resolved config (used when it is absent)."""
    ctx = config.get("ctx")
    if isinstance(ctx, dict):
        ctx = ctx.get("length", ctx.get("tokens", ctx.get("name")))
    return {"model": _group_name(config, "model"), "task": _group_name(config, "task"),
            "source": _get(config, "task.source"),
            "method": _get(config, "method.label") or _group_name(config, "method"),
            "ctx": ctx, "seed": config.get("seed"), "dtype": config.get("dtype"),
            "device": config.get("device"), "temperature": config.get("temperature")}


def method_options(config: dict) -> dict:
    """The method's options from the resolved config (`method.options`), {} when absent."""
    options = _get(config, "method.options", {})
    return dict(options) if isinstance(options, dict) else {}


def controller_name(method: str | None, options: dict, resolved: dict | None = None) -> str | None:
    """An explicit option wins, then the controller the run resolved (summary.json
    `run.method_options`: a baseline's declared default, `fixed` for streaming), else `entropy` for
    the controlled method and `fixed` for fixed-k."""
    if options.get("controller") is not None:
        return str(options["controller"])
    if (resolved or {}).get("controller") is not None:
        return str(resolved["controller"])
    if method in CONTROLLED_METHODS:
        return "entropy"
    if method in FIXED_K_METHODS:
        return "fixed"
    return None


def run_wall_seconds(run: dict) -> float:
    """Seconds from the run's start to its end (summary.json `run.started` / `run.finished`),
    model loading and warm-up included; NaN when either stamp is missing."""
    try:
        return (datetime.fromisoformat(run["finished"]) - datetime.fromisoformat(run["started"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return math.nan


def prefill_sharers(run: dict) -> int:
    """How many methods decoded from this run's prefill (summary.json `run.prefill_shared_with`,
    written by the benchmark mode); 1 for a run that prefilled alone."""
    return len(run.get("prefill_shared_with") or []) if run.get("prefill_shared") else 1


def job_label(run: dict, run_label: str) -> str:
    """The process a run was timed in. A benchmark-mode run (summary.json `run.bench`) shares its job with
    the other methods written beside it: its output folder's parent names the job, for local folders
    and W&B runs alike. Any other run is a job of its own."""
    if run.get("bench") and run.get("output_dir"):
        return str(Path(run["output_dir"]).parent)
    return run_label


def draft_length(options: dict, run: dict, controller: str | None) -> Any:
    """A fixed draft length k: the config's, else the engine's default that the run resolved
    (summary.json `run.method_options`); None under a controller that picks k itself."""
    if controller != "fixed":
        return options.get("k")
    if options.get("k") is not None:
        return options["k"]
    return (run.get("method_options") or {}).get("k")


def hardware_label(env: dict, run: dict) -> str:
    """A short name of the machine the run timed (summary.json `env`, written by
    sparsespec/harness/environment.py): the GPU's name on a GPU, else the CPU's with the vector width
    torch dispatched to (`cpu_capability`, e.g. "AMD EPYC (AVX512)"), since one CPU name covers machines
    whose AR and draft steps differ in speed. `env` is a summary's, or a sample's own stamp (`cpu`,
    `cpu_capability`, `gpu`): a run resumed over several sittings records its last machine in its
    summary, each sample the machine that decoded it."""
    device = str(run.get("device") or env.get("device") or "")
    if env.get("gpu") and (device.startswith("cuda") or not device):
        return str(env["gpu"])
    name = str(env.get("cpu") or device or "unknown")
    return f"{name} ({env['cpu_capability']})" if env.get("cpu_capability") else name


def provenance(env: dict, run: dict) -> dict:
    """The run's commit, whether its tree was modified, its code fingerprint and whether its code was
    modified (each None when not recorded: runs before the fingerprint lack the last two), whether
    its benchmark found the machine busy before or after it (None outside a benchmark), and the
    attention path of its AR denominator, the fastest the run measured (None for a run made before AR's
    paths were measured: its AR attended through SDPA with enable_gqa)."""
    git = env.get("git") or {}
    return {**{k: git.get(k) for k in ("commit", "dirty", "code", "code_dirty")},
            "noisy": (run.get("bench") or {}).get("noisy"),
            "ar_path": (run.get("ar_variants") or {}).get("ar_attention")}


def budget_fraction(budget: Any, context_tokens: Any) -> float:
    """The draft budget as a fraction of the KV cache: itself when < 1, else tokens / context."""
    if budget is None or (isinstance(budget, float) and math.isnan(budget)):
        return math.nan
    budget = float(budget)
    if budget < 1:
        return budget
    if not context_tokens:
        return math.nan
    return budget / float(context_tokens)


def rows_from_records(summary: dict, samples: list[dict], run_label: str,
                      experiment: str | None = None) -> list[dict]:
    """One row per sample line, with the run's config and pooled metrics attached."""
    config = summary.get("config") or {}
    run = dict(run_section_from_config(config))
    run.update({k: v for k, v in (summary.get("run") or {}).items() if v is not None})
    env = summary.get("env") or {}
    metrics = summary.get("metrics") or {}
    options = method_options(config)
    controller = controller_name(run.get("method"), options, run.get("method_options"))
    base = {"run": run_label,
            "experiment": experiment if experiment is not None else config.get("experiment_name"),
            **{k: run.get(k) for k in RUN_COLUMNS},
            "controller": controller, "k": draft_length(options, run, controller),
            "budget": options.get("budget"),
            "hardware": hardware_label(env, run), "run_wall_s": run_wall_seconds(run),
            "prefill_sharers": prefill_sharers(run), "job": job_label(run, run_label),
            **provenance(env, run),
            **{f"run_{k}": metrics.get(k) for k in METRIC_KEYS}}
    return [_sample_row(base, sample) for sample in samples]


def _sample_row(base: dict, sample: dict) -> dict:
    row = dict(base)
    for key in RUN_COLUMNS:                     # a sample line names its own model/task/ctx too
        if row.get(key) is None and sample.get(key) is not None:
            row[key] = sample[key]
    row.update({k: sample.get(k) for k in SAMPLE_COLUMNS})
    split = sample.get("time_split") or {}
    row.update({f"time_{k}_s": split.get(k) for k in TIME_SPLIT_KEYS})
    rounds = sample.get("rounds") or []
    row["rounds"] = rounds
    row["n_rounds"] = len(rounds)
    row["budget_frac"] = budget_fraction(row.get("budget"), row.get("context_tokens"))
    for key in ("code", "code_dirty"):      # the code that decoded this sample, where stamped (else its run's)
        if sample.get(key) is not None:
            row[key] = sample[key]
    if sample.get("cpu_capability") is not None or sample.get("gpu") is not None:   # its machine, where stamped
        row["hardware"] = hardware_label(sample, {"device": row.get("device")})
    return row


def frame_from_rows(rows: list[dict]) -> pd.DataFrame:
    """The tidy DataFrame with its fixed column order and dtypes."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    numeric = ["ctx", "seed", "temperature", "k", "budget", "budget_frac", "context_tokens",
               "new_tokens", "n_rounds", "prefill_sharers", *[c for c in COLUMNS if c.endswith("_s")],
               "tokens_per_s", "ar_tokens_per_s", "speedup_vs_ar", "mean_accepted",
               "acceptance_rate", "score", "depth", "batch_size", "batch_row", "batch_speedup_vs_ar",
               *[f"run_{k}" for k in METRIC_KEYS]]
    for column in dict.fromkeys(numeric):
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("float64")
    for column in ("run", "job", "experiment", "model", "task", "source", "method", "dtype", "device",
                   "controller", "hardware", "prompt_id", *PROVENANCE_COLUMNS):
        df[column] = df[column].astype("object")
    return df.sort_values(["model", "task", "method", "ctx", "run", "prompt_id"],
                          na_position="last", kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------- local folders

def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every folder holding a samples.jsonl, under each path (a run folder or a tree of them)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such results folder: {path}")
        if (path / SAMPLES_FILE).is_file():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.rglob(SAMPLES_FILE)))
    return list(dict.fromkeys(p.resolve() for p in found))


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file; a torn last line (a run still writing) is skipped."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return records


def read_hydra_config(run_dir: Path) -> dict:
    """The run's `.hydra/config.yaml` as plain dict, {} when absent."""
    path = run_dir / HYDRA_CONFIG
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def experiment_choice(run_dir: Path) -> str | None:
    """The `experiment=` Hydra chose for the run (`.hydra/hydra.yaml`), None when unknown."""
    path = run_dir / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf
    choices = OmegaConf.to_container(OmegaConf.load(path).hydra.runtime.choices)
    return choices.get("experiment")


def read_run_dir(run_dir: Path) -> tuple[dict, list[dict]]:
    """(summary, samples) of one run folder; the summary is rebuilt from the config if missing."""
    summary_path = run_dir / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if not summary.get("config"):
        summary["config"] = read_hydra_config(run_dir)
    return summary, read_jsonl(run_dir / SAMPLES_FILE)


def _run_label(run_dir: Path, roots: list[Path]) -> str:
    for root in roots:
        if run_dir == root or root in run_dir.parents:
            return str(Path(root.name) / run_dir.relative_to(root))
    return str(run_dir)


def load_results(*paths: str | Path) -> pd.DataFrame:
    """One tidy DataFrame from local run folders or trees of them (one row per prompt x run)."""
    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    roots = [Path(p).resolve() for p in paths]
    rows: list[dict] = []
    for run_dir in find_run_dirs(paths):
        summary, samples = read_run_dir(run_dir)
        rows += rows_from_records(summary, samples, _run_label(run_dir, roots),
                                  experiment_choice(run_dir))
    return frame_from_rows(rows)


class NoResults(Exception):
    """A results folder that does not exist or holds no samples.jsonl."""


def load_results_folder(folder: str | Path) -> pd.DataFrame:
    """`load_results` of one folder for a command line: NoResults (a one-line reason) when there is
    nothing to read."""
    if not Path(folder).is_dir():
        raise NoResults(f"results folder {str(folder)!r} does not exist")
    df = load_results(folder)
    if df.empty:
        raise NoResults(f"no samples.jsonl under {folder}")
    return df


def results_or_exit(folder: str | Path) -> pd.DataFrame:
    """`load_results_folder` for a command's main: nothing to read is a one-line error, exit status 2."""
    try:
        return load_results_folder(folder)
    except NoResults as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


# ---------------------------------------------------------------- W&B

def _run_file_names(run: Any) -> set[str]:
    return {f.name for f in run.files()}


def _download_json_files(run: Any, folder: Path) -> tuple[dict, list[dict]]:
    run.file(SUMMARY_FILE).download(root=str(folder), replace=True)
    run.file(SAMPLES_FILE).download(root=str(folder), replace=True)
    return json.loads((folder / SUMMARY_FILE).read_text()), read_jsonl(folder / SAMPLES_FILE)


def _records_from_run_fields(run: Any) -> tuple[dict, list[dict]]:
    """Fallback for a run without the two files: rebuild them from what the harness's W&B tracker
    logs (sparsespec/harness/tracking.py): the resolved config, the summary metrics, the `samples`
    table, `prompt/*` history rows (timings) and `round/*` history rows (the per-round trace, less
    the per-token lists: entropies, accept_probs and survival are not logged there)."""
    config = dict(run.config)
    summary = {"run": config.get("run") or {}, "config": config,
               "metrics": {k: run.summary.get(k) for k in METRIC_KEYS},
               "env": config.get("env") or _env_from_metadata(run)}
    history = list(run.scan_history())
    prompts = {int(h["prompt/index"]): _strip(h, "prompt/") for h in history if h.get("prompt/index") is not None}
    rounds: dict[int, list[dict]] = {}
    for h in sorted((h for h in history if h.get("round/index") is not None), key=lambda h: h["round/index"]):
        rounds.setdefault(int(h["round/prompt"]), []).append(_round_from_history(h))
    table = _samples_table(run)
    samples = []
    for index, row in enumerate(table or [prompts[i] for i in sorted(prompts)]):
        sample = {**prompts.get(index, {}), **row}
        sample["time_split"] = {k: sample.pop(f"time_{k}_s", None) for k in TIME_SPLIT_KEYS}
        sample["rounds"] = rounds.get(index, [])
        samples.append(sample)
    return summary, samples


def _strip(row: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)}


def _round_from_history(row: dict) -> dict:
    fields = _strip(row, "round/")
    return {**{k: v for k, v in fields.items() if k not in ("index", "prompt", "mean_entropy")},
            "entropies": [], "accept_probs": [], "survival": [], "cost_draft": None, "cost_verify": None, "cost_select": None}


def _samples_table(run: Any) -> list[dict]:
    """The rows of the run's logged `samples` table (a table-file in its summary), [] if none."""
    ref = run.summary.get("samples")
    if not isinstance(ref, dict) or not ref.get("path"):
        return []
    with tempfile.TemporaryDirectory() as tmp:
        run.file(ref["path"]).download(root=tmp, replace=True)
        table = json.loads((Path(tmp) / ref["path"]).read_text())
    return [dict(zip(table["columns"], values)) for values in table["data"]]


def _env_from_metadata(run: Any) -> dict:
    """The little W&B's own system metadata says about the machine (GPU name, CPU count)."""
    metadata = getattr(run, "metadata", None) or {}
    return {"gpu": metadata.get("gpu"), "cpu": metadata.get("cpu"), "device": None}


def records_from_wandb_run(run: Any) -> tuple[dict, list[dict]]:
    """(summary, samples) of a W&B run: its uploaded summary.json + samples.jsonl when present
    (the exact files a local run folder holds), else rebuilt from its config, summary and history."""
    if {SUMMARY_FILE, SAMPLES_FILE} <= _run_file_names(run):
        with tempfile.TemporaryDirectory() as tmp:
            return _download_json_files(run, Path(tmp))
    return _records_from_run_fields(run)


def rows_from_wandb_run(run: Any) -> list[dict]:
    """The DataFrame rows of one W&B run (`wandb.apis.public.Run` or anything shaped like it)."""
    summary, samples = records_from_wandb_run(run)
    # conf/experiment/*.yaml tag their runs with the experiment's family name first.
    tags = list(getattr(run, "tags", None) or [])
    experiment = tags[0] if tags else None
    return rows_from_records(summary, samples, f"wandb:{run.id}", experiment)


def load_wandb(path: str, group: str | None = None, api: Any = None) -> pd.DataFrame:
    """One tidy DataFrame from the W&B runs of `path` ("entity/project"), optionally one group."""
    if api is None:
        import wandb  # lazy: a local analysis needs neither the package nor a login
        api = wandb.Api()
    filters = {"group": group} if group else None
    rows: list[dict] = []
    for run in api.runs(path, filters=filters):
        rows += rows_from_wandb_run(run)
    return frame_from_rows(rows)
