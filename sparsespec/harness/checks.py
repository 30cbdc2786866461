"""Check a composed run config before anything heavy loads; turn it into plain arguments.

Every problem raises `ConfigError` with one line that names the value and what is accepted.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from omegaconf import DictConfig, OmegaConf

from sparsespec.errors import ConfigError
from sparsespec.method_options import resolve
from sparsespec.options import accepts
from sparsespec.tasks import SOURCES, TASKS, check_task_options

from sparsespec.harness.order import check_run_order

LOGGERS = ("wandb", "none")
WANDB_MODES = ("offline", "online", "disabled")
WANDB_ALIASES = {"dryrun": "offline", "run": "online"}   # W&B's older names, which WANDB_MODE still accepts
DEVICES = ("auto", "cpu", "cuda")


def as_dict(node) -> dict:
    """A config node as a plain, resolved dict (a plain dict passes through)."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def model_spec(cfg: DictConfig) -> dict:
    """`cfg.model` as `sparsespec.models.load_model` takes it. A `path` the user set replaces the
    embedded copy, so `model.path=...` works on an embedded model config too."""
    spec = as_dict(cfg.model)
    if spec.get("path") and spec.get("embedded"):
        spec["embedded"] = None
    return spec


def method_options(method) -> dict:
    """A `method` config's options (`cfg.method`, or an entry's `method_node`) without the nulls: a null
    leaves the engine's default in place."""
    return {k: v for k, v in as_dict(method.options or {}).items() if v is not None}


def device_name(requested: str) -> str:
    """`auto` -> cuda when available, else cpu; an explicit CUDA device must exist here."""
    if requested not in DEVICES and not str(requested).startswith("cuda:"):
        raise ConfigError(f"device={requested!r} is unknown; accepted: {', '.join(DEVICES)} or cuda:N")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        check_cuda_device(requested)
    return requested


def check_cuda_device(requested: str) -> None:
    """`cuda` or `cuda:N` must name a CUDA device this machine has."""
    if not torch.cuda.is_available():
        raise ConfigError(f"device={requested!r} but CUDA is not available here (torch {torch.__version__}); "
                          f"accepted here: auto, cpu")
    index = requested.partition(":")[2]
    count = torch.cuda.device_count()
    if index and not (index.isdigit() and int(index) < count):
        raise ConfigError(f"device={requested!r} does not exist here; accepted: cuda, cuda:0 to cuda:{count - 1}")


def _positive_int(name: str, value) -> None:
    if not accepts(int, value) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1")


def check_numbers(cfg: DictConfig) -> None:
    _positive_int("ctx", cfg.ctx)
    _positive_int("num_prompts", cfg.num_prompts)
    _positive_int("max_new_tokens", cfg.max_new_tokens)
    _positive_int("batch_size", cfg.get("batch_size", 1))
    if not accepts(int, cfg.seed):
        raise ConfigError(f"seed={cfg.seed!r} must be an integer")
    for name in ("stop_at_eos", "compare_ar", "warmup", "cost_profile", "online_threads"):
        if not isinstance(cfg[name], bool):
            raise ConfigError(f"{name}={cfg[name]!r} must be true or false")
    if not accepts(float, cfg.prefill_memo_gb) or cfg.prefill_memo_gb < 0:
        raise ConfigError(f"prefill_memo_gb={cfg.prefill_memo_gb!r} must be a number of GiB >= 0 (0 keeps no prefill)")
    if not accepts(float, cfg.prefill_cache_gb) or cfg.prefill_cache_gb < 0:
        raise ConfigError(f"prefill_cache_gb={cfg.prefill_cache_gb!r} must be a number of GiB >= 0 (0 keeps no file)")
    folder = cfg.prefill_cache_dir
    if folder is not None and (not isinstance(folder, str) or not folder or Path(folder).expanduser().is_file()):
        raise ConfigError(f"prefill_cache_dir={folder!r} must be null (off) or a folder's path, not a file's")
    if not accepts(float, cfg.temperature) or cfg.temperature < 0:
        raise ConfigError(f"temperature={cfg.temperature!r} must be a finite number >= 0 (0 means greedy)")
    if not accepts(float, cfg.top_p) or not 0.0 < cfg.top_p <= 1.0:
        raise ConfigError(f"top_p={cfg.top_p!r} must be a number in (0, 1]")
    if cfg.logger.name not in LOGGERS:
        raise ConfigError(f"logger={cfg.logger.name!r} is unknown; accepted: {', '.join(LOGGERS)}")
    if cfg.logger.name == "wandb" and cfg.logger.mode not in (*WANDB_MODES, *WANDB_ALIASES):
        raise ConfigError(f"logger.mode={cfg.logger.mode!r} is unknown; accepted: {', '.join(WANDB_MODES)} "
                          f"(or W&B's older {', '.join(f'{a} = {m}' for a, m in WANDB_ALIASES.items())})")


def wandb_mode(mode: str | None) -> str:
    """`logger.mode` as one of WANDB_MODES (an older alias by its current name; unset: offline)."""
    return WANDB_ALIASES.get(mode, mode or "offline")


def check_context_fits(ctx: int, max_new_tokens: int, model_name: str, max_context: int | None) -> None:
    """The prompt plus the new tokens must fit in the model's context window."""
    if max_context is not None and ctx + max_new_tokens > max_context:
        raise ConfigError(
            f"ctx={ctx} + max_new_tokens={max_new_tokens} exceeds model {model_name}'s max_context={max_context}; "
            f"use ctx <= {max_context - max_new_tokens}, a longer-context model, or model.max_context=N "
            f"to run past the trained length on purpose")


def trained_length_warning(ctx: int, max_new_tokens: int, model_name: str,
                           trained_context: int | None) -> str | None:
    """One line when the prompt plus the new tokens run past the length the model was trained to
    (allowed up to max_context: the paper times 60K on Llama-3-8B), else None."""
    if trained_context is None or ctx + max_new_tokens <= trained_context:
        return None
    return (f"ctx={ctx} + max_new_tokens={max_new_tokens} is past {model_name}'s trained length {trained_context}; "
            f"RoPE extrapolates, so task quality is not meaningful, speed is")


def context_warnings(cfg: DictConfig) -> list[str]:
    """What the run should say once at its start and record in summary.json."""
    warning = trained_length_warning(cfg.ctx, cfg.max_new_tokens, cfg.model.name, cfg.model.get("trained_context"))
    return [warning] if warning else []


def resolved_options(method: str, options: dict) -> dict:
    """Every setting the method will run with, declared defaults included (the controller's k of a
    fixed-k run that left k at its default, for one), so results name them all."""
    return resolve(method, options).as_dict()   # one-line ConfigError on anything it rejects


def check_method_options(method: str, options: dict) -> None:
    """Known method, known options with valid values. A draft budget larger than the context is
    not an error: the draft is then dense (the run's resolved options say so)."""
    resolved_options(method, options)


def check_task(task: str, source: str, variant: str | None = None, depth: float | None = None) -> None:
    if task not in TASKS:
        raise ConfigError(f"task.name={task!r} is unknown; accepted: {', '.join(TASKS)}")
    if source not in SOURCES:
        raise ConfigError(f"task.source={source!r} is unknown; accepted: {', '.join(SOURCES)}")
    check_task_options(task, source, variant, depth)


def check_task_path(path: str | None) -> None:
    """A local task file or folder must exist (null: the source's own data)."""
    if path is not None and not Path(str(path)).expanduser().exists():
        raise ConfigError(f"task.path={path} does not exist; point it at a local file or folder of the task's "
                          f"data, or set task.path=null")


def make_output_folder(key: str, path) -> Path:
    """Create the output folder `key` (hydra.run.dir / hydra.sweep.dir) names, or say in one line why not."""
    folder = Path(str(path)).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{key}={path} is an existing file, not a folder; choose a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{key}={path} cannot be created ({err.strerror or err}); "
                          f"choose a folder you can write to") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={path} is not writable; choose a folder you can write to")
    return folder


def check_config(cfg: DictConfig) -> None:
    """Everything that can be checked without loading the model or the prompts."""
    check_numbers(cfg)
    check_task(cfg.task.name, cfg.task.source, cfg.task.get("variant"), cfg.task.get("depth"))
    check_task_path(cfg.task.path)
    device_name(cfg.device)
    check_context_fits(cfg.ctx, cfg.max_new_tokens, cfg.model.name, cfg.model.max_context)
    check_method_options(cfg.method.name, method_options(cfg.method))
    check_run_order(cfg.run_order)
