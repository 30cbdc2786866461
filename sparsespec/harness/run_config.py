"""The run's settings as one frozen, typed `RunConfig`, built once from the composed Hydra config.

`build_run_config` checks every value (checks.py: one ConfigError line each) and resolves every method
of the run to a `MethodSpec` (a `bench.methods` entry is parsed, and its conf/method file composed,
here and nowhere later), so the rest of the run reads typed fields, not the raw config. The raw
config survives only as each method's `config`: what summary.json and the tracker write out verbatim.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from sparsespec import hf_reference
from sparsespec.errors import ConfigError

from sparsespec.harness.checks import as_dict, check_config, context_warnings, device_name, method_options, model_spec
from sparsespec.harness.entries import entry_folder, method_node, resolved_method_options

AR = "ar"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    spec: dict                  # as sparsespec.models.load_model takes it (checks.model_spec)
    max_context: int | None     # from the model file; the loaded model's own is checked after loading


@dataclass(frozen=True)
class TaskSpec:
    name: str
    source: str
    path: str | None
    subset: str | None
    min_fill: float | None
    variant: str | None
    depth: float | None
    settings: dict              # the task node as composed: a resume compares it whole

    def loader_options(self) -> dict:
        """The options only some tasks have (retrieval's variant and depth), as far as the task file sets them."""
        return {key: value for key, value in (("variant", self.variant), ("depth", self.depth)) if value is not None}


@dataclass(frozen=True)
class MethodSpec:
    entry: str                  # as listed: "sparsespec", "sparsespec_fixed:k=4", "hf_pld"
    name: str                   # the method the engine (or transformers) runs: "sparsespec", "hf_pld"
    label: str                  # what results call it: "sparsespec_fixed"
    options: dict               # as given, nulls dropped (a null keeps the engine's default)
    resolved: dict              # every option it runs with, declared defaults filled in
    folder: Path                # where its samples and summary go
    config: dict                # the run's config with this method, resolved: written out verbatim

    @property
    def key(self) -> str:
        """What makes the method itself: its name and resolved options (labels aside)."""
        return json.dumps({"method": self.name, "options": self.resolved}, sort_keys=True, default=str)

    @property
    def is_reference(self) -> bool:
        """A transformers reference decoder (hf_generate, hf_pld): no shared prefill, one prompt at a time."""
        return hf_reference.is_reference(self.name)


@dataclass(frozen=True)
class RunConfig:
    model: ModelSpec
    task: TaskSpec
    ctx: int
    num_prompts: int
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop_at_eos: bool
    compare_ar: bool
    dtype: str
    device: str                 # resolved: `auto` is cuda or cpu here
    batch_size: int
    warmup: bool
    cost_profile: bool
    online_threads: bool        # engine rows re-choose their thread count online from the probe's (True) or keep it
    run_order: str
    prefill_memo_gb: float
    prefill_cache_dir: str | None   # prefills kept on disk for later processes (None: off)
    prefill_cache_gb: float
    logger: dict                # tracking.make_tracker's settings
    experiment_name: str | None
    bench: bool                 # several methods (`bench.methods`), each in a sub-folder
    methods: tuple[MethodSpec, ...]
    warnings: tuple[str, ...]   # said once at the start, kept in summary.json

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def build_run_config(cfg: DictConfig, folder: Path) -> RunConfig:
    """`cfg` checked and read into a RunConfig whose methods write under `folder`; a ConfigError
    (one line) on the first bad value, before anything heavy loads."""
    check_config(cfg)
    methods = method_specs(cfg, Path(folder))
    return RunConfig(
        model=ModelSpec(name=cfg.model.name, spec=model_spec(cfg), max_context=cfg.model.get("max_context")),
        task=task_spec(cfg), ctx=cfg.ctx, num_prompts=cfg.num_prompts, max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, stop_at_eos=cfg.stop_at_eos,
        compare_ar=cfg.compare_ar, dtype=cfg.dtype, device=device_name(cfg.device), batch_size=batch_size(cfg),
        warmup=cfg.warmup, cost_profile=cfg.cost_profile, online_threads=cfg.online_threads,
        run_order=cfg.run_order,
        prefill_memo_gb=cfg.prefill_memo_gb, prefill_cache_dir=cfg.prefill_cache_dir,
        prefill_cache_gb=cfg.prefill_cache_gb, logger=as_dict(cfg.logger), experiment_name=cfg.experiment_name,
        bench=is_bench(cfg), methods=tuple(methods), warnings=tuple(context_warnings(cfg)))


def batch_size(cfg: DictConfig) -> int:
    return int(cfg.get("batch_size", 1) or 1)   # an older config without the key: one prompt at a time


def is_bench(cfg: DictConfig) -> bool:
    return bool(cfg.get("bench") and cfg.bench.get("methods"))


def task_spec(cfg: DictConfig) -> TaskSpec:
    task = cfg.task
    return TaskSpec(name=task.name, source=task.source, path=task.path, subset=task.get("subset"),
                    min_fill=task.get("min_fill"), variant=task.get("variant"), depth=task.get("depth"),
                    settings=as_dict(task))


def method_specs(cfg: DictConfig, folder: Path) -> list[MethodSpec]:
    """The run's methods: `method` into `folder`, or AR and every `bench.methods` entry, each
    composed once and written into its own sub-folder (entries that resolve alike decoded once)."""
    if not is_bench(cfg):
        return [spec_of(cfg.method.label, cfg.method, as_dict(cfg), folder)]
    run = as_dict(cfg)
    entries = list(dict.fromkeys([AR, *(str(m) for m in cfg.bench.methods)]))
    return distinct(spec_of(e, node, {**run, "method": as_dict(node)}, folder / entry_folder(e))
                    for e, node in ((e, method_node(e)) for e in entries))


def spec_of(entry: str, node, config: dict, folder: Path) -> MethodSpec:
    options = method_options(node)
    return MethodSpec(entry=entry, name=node.name, label=node.label, options=options,
                      resolved=resolved_method_options(node.name, options), folder=folder, config=config)


def distinct(specs) -> list[MethodSpec]:
    """`specs` with each method-and-options decoded once: an entry that resolves to an earlier one
    (`sparsespec:` after `sparsespec`) is dropped with one line saying so. Two different entries
    whose folders would be one are a ConfigError: each folder holds one method's samples."""
    kept: dict[str, MethodSpec] = {}
    folders: dict[Path, MethodSpec] = {}
    for spec in specs:
        if spec.key in kept:
            print(f"warning: bench.methods entry {spec.entry!r} is {kept[spec.key].entry!r} again (same method and "
                  f"options); decoded once, into {kept[spec.key].folder}", file=sys.stderr, flush=True)
            continue
        if spec.folder in folders:
            raise ConfigError(f"bench.methods entries {folders[spec.folder].entry!r} and {spec.entry!r} differ but "
                              f"would share the folder {spec.folder}; write one of them so its name differs "
                              f"by more than punctuation")
        kept[spec.key], folders[spec.folder] = spec, spec
    return list(kept.values())
