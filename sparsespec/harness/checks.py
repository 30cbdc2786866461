"""Check a composed run config before anything heavy loads; turn it into plain arguments.

Every problem raises `ConfigError` with one line that names the value and what is accepted.
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from sparsespec.errors import ConfigError

LOGGERS = ("wandb", "none")
WANDB_MODES = ("offline", "online", "disabled")
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


def method_options(cfg: DictConfig) -> dict:
    """`cfg.method.options` without the nulls: a null leaves the engine's default in place."""
    return {k: v for k, v in as_dict(cfg.method.options or {}).items() if v is not None}


def device_name(requested: str) -> str:
    """`auto` -> cuda when available, else cpu."""
    if requested not in DEVICES and not str(requested).startswith("cuda:"):
        raise ConfigError(f"device={requested!r} is unknown; accepted: {', '.join(DEVICES)} or cuda:N")
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1")


def check_numbers(cfg: DictConfig) -> None:
    _positive_int("ctx", cfg.ctx)
    _positive_int("num_prompts", cfg.num_prompts)
    _positive_int("max_new_tokens", cfg.max_new_tokens)
    if cfg.temperature < 0:
        raise ConfigError(f"temperature={cfg.temperature!r} must be >= 0 (0 means greedy)")
    if not 0.0 < cfg.top_p <= 1.0:
        raise ConfigError(f"top_p={cfg.top_p!r} must be in (0, 1]")
    if cfg.logger.name not in LOGGERS:
        raise ConfigError(f"logger={cfg.logger.name!r} is unknown; accepted: {', '.join(LOGGERS)}")
    if cfg.logger.name == "wandb" and cfg.logger.mode not in WANDB_MODES:
        raise ConfigError(f"logger.mode={cfg.logger.mode!r} is unknown; accepted: {', '.join(WANDB_MODES)}")


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
    """The options the engine will run with (`sparsespec.decode.validate_options`), plus the
    controller's own defaults (k for `fixed`, candidates etc. for `entropy`), so results name
    every setting, e.g. the k of a fixed-k run that left k at its default."""
    import inspect

    from sparsespec.controller import CONTROLLERS
    from sparsespec.decode import CONTROLLER_OPTIONS, validate_options
    from sparsespec.methods import METHODS

    resolved = validate_options(method, options)   # one-line ConfigError on anything it rejects
    controller = CONTROLLERS.get(resolved.get("controller"))
    if controller is not None and METHODS[method].drafts:   # AR drafts nothing: no controller runs
        for name, param in inspect.signature(controller.__init__).parameters.items():
            if name in CONTROLLER_OPTIONS and name not in resolved and param.default is not param.empty:
                default = param.default
                resolved[name] = list(default) if isinstance(default, (tuple, range)) else default
    return resolved


def check_method(method: str, options: dict) -> None:
    """Known method, known options with valid values (`validate_options`). A draft budget larger
    than the context is not an error: the draft is then dense (the run's options say so)."""
    resolved_options(method, options)


def check_task(task: str, source: str) -> None:
    from sparsespec.tasks import SOURCES, TASKS

    if task not in TASKS:
        raise ConfigError(f"task.name={task!r} is unknown; accepted: {', '.join(TASKS)}")
    if source not in SOURCES:
        raise ConfigError(f"task.source={source!r} is unknown; accepted: {', '.join(SOURCES)}")


def check_config(cfg: DictConfig) -> None:
    """Everything that can be checked without loading the model or the prompts."""
    check_numbers(cfg)
    check_task(cfg.task.name, cfg.task.source)
    device_name(cfg.device)
    check_context_fits(cfg.ctx, cfg.max_new_tokens, cfg.model.name, cfg.model.max_context)
    check_method(cfg.method.name, method_options(cfg))
