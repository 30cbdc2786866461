"""Shared fixtures: tiny random models of each architecture (logic), the embedded real model (end to end)."""
from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

torch.set_flush_denormal(True)   # random weights on CPU produce denormals, which are very slow

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096,
            initializer_range=0.3)   # wide init: less degenerate, less repetitive greedy text


def build_tiny(arch: str, seed: int = 0, **overrides):
    """A random fp32 model built from config. Each call gets its own config object (models built from
    one config share it, and attention switches would leak between them)."""
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)
    torch.manual_seed(seed)
    kw = {**TINY, **overrides}
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kw))
    elif arch == "mistral":   # a small sliding window, so prompts run past it
        model = MistralForCausalLM(MistralConfig(**{"sliding_window": 64, **kw}))
    elif arch == "qwen2":     # full layers first, then sliding layers
        model = Qwen2ForCausalLM(Qwen2Config(**{"use_sliding_window": True, "sliding_window": 64,
                                                "max_window_layers": 2, **kw}))
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = None   # random models would stop on EOS by chance
    return model.eval()


ARCHS = ("llama", "mistral", "qwen2")


@pytest.fixture(autouse=True)
def first_calls():
    """Every test's generate() calls open as first calls: the session's shared models carry no call
    memory (sparsespec/call_memory.py) from another test."""
    from sparsespec.call_memory import forget
    forget()
    yield
    forget()


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model(request):
    return build_tiny(request.param)


@pytest.fixture(scope="session")
def tiny_models():
    return {arch: build_tiny(arch) for arch in ARCHS}


def random_prompt(length: int, seed: int = 1, vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (1, length), generator=g)


@pytest.fixture(scope="session")
def real_model():
    """SmolLM2-135M-Instruct, converted from its GGUF once and cached (about 25 s the first time)."""
    from sparsespec.models import load_model
    return load_model({"name": "smollm2_135m", "embedded": "smollm2_135m", "dtype": "float32"}, device="cpu")


def stdlib_text(name: str) -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / name).read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def real_prose_prompt(real_model):
    """About 1.2K tokens of the Python language reference (real prose that ships with Python)."""
    _, tokenizer = real_model
    text = stdlib_text("pydoc_data/topics.py")[20_000:26_000]
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :1200]
    return ids


def pytest_collection_modifyitems(items):
    """A test that loads the embedded real model is a `real_model` test whether or not it says so,
    so `make test-fast` (-m "not slow and not real_model") never loads it by accident."""
    for item in items:
        if "real_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_model)


def lines_printed_offline(code: str) -> list[str]:
    """Run `code` in a fresh Python with HF_HUB_OFFLINE=1 (huggingface_hub reads it when imported);
    its non-empty stdout lines (stderr is appended to the assertion message through the exception)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = [line for line in result.stdout.splitlines() if line]
    if not lines:
        raise AssertionError(f"nothing printed: {result.stderr[-2000:]}")
    return lines


@pytest.fixture
def prefill_forwards(monkeypatch):
    """The prompt lengths of every prefill forward run from here on (the memo's and decode's)."""
    from sparsespec.engine.prefill import SharedPrefill
    seen = []
    run = SharedPrefill.run

    def counting(cls, model, prompt, *args, **kwargs):
        seen.append(prompt.numel())
        return run(model, prompt, *args, **kwargs)
    monkeypatch.setattr(SharedPrefill, "run", classmethod(counting))
    return seen


@pytest.fixture
def harness_run(monkeypatch):
    """The harness in-process on the tiny Llama with prompts of mixed lengths (test_bench.py's way):
    `run(folder, *overrides)` returns each entry's summary."""
    from pathlib import Path
    from types import SimpleNamespace

    from hydra import compose, initialize_config_dir

    import sparsespec.harness.runner as runner
    from helpers import Tokenizer

    model = build_tiny("llama")
    lengths = (300, 120, 250, 90, 200)
    prompts = [SimpleNamespace(id=f"p{i}", input_ids=random_prompt(n, seed=i)[0], reference=None)
               for i, n in enumerate(lengths)]
    monkeypatch.setattr(runner, "load_inputs", lambda cfg: (model, Tokenizer(), prompts[:cfg.num_prompts]))
    conf = Path(__file__).resolve().parents[1] / "conf"

    def run(folder, *overrides):
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose("config", overrides=["logger=none", "ctx=1k", "num_prompts=5", "max_new_tokens=12",
                                               "warmup=true", *overrides])
            return runner.run(cfg, folder)
    return run, model, prompts


def slow_but(keep, cases):
    """`cases` for parametrize, each one whose name is not in `keep` marked slow: `make test-fast` runs
    the cheap cases kept, `make test` every case. A tuple case is named by its first element."""
    keep = {keep} if isinstance(keep, str) else set(keep)
    return [case if (case[0] if isinstance(case, tuple) else case) in keep
            else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
            for case in cases]


REPO = Path(__file__).resolve().parents[1]


def cli_env(**extra: str) -> dict:
    """The environment of a `python run.py` under test: W&B offline, the hub and datasets offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_MODE")}
    return {**env, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra}


def run_py_here(cwd: Path, *overrides: str) -> int:
    """`python run.py *overrides` in `cwd` without a new interpreter: run.py executed as `__main__` in this
    process (the same lines: the ctx rewrite, the option check, Hydra and its callbacks, the runner and
    `exit_with_error`); its exit status (from SystemExit, 0 if none). It starts on a fresh Hydra, as in
    a new process (a test may hold one open: `hydra_conf`), in `cli_env()`'s environment; what the run
    leaves in the process (environment, working folder, argv, Hydra's singletons, root logging handlers,
    folders claimed by a run stopped before its end) is undone after it."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton

    from sparsespec.harness import folder_lock

    with pytest.MonkeyPatch.context() as patch:
        for key, value in cli_env().items():
            patch.setenv(key, value)
        patch.delenv("HYDRA_FULL_ERROR", raising=False)
        patch.chdir(cwd)
        patch.setattr(sys, "argv", [str(REPO / "run.py"), *overrides])
        patch.setattr(folder_lock, "_CLAIMED", {})
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        hydra_state = Singleton.get_state()
        GlobalHydra.instance().clear()
        try:
            runpy.run_path(str(REPO / "run.py"), run_name="__main__")
            return 0
        except SystemExit as stop:
            return exit_status(stop)
        finally:
            for handler in set(root.handlers) - set(handlers):
                handler.close()
            root.handlers[:], root.level = handlers, level
            for lock in folder_lock._CLAIMED.values():
                lock.release()
            Singleton.set_state(hydra_state)


@pytest.fixture
def cli_here(capfd):
    """`run_py_here` returning what `subprocess.run` would: `cli_here(cwd, *overrides)` is a
    CompletedProcess of the exit status and the stdout/stderr read at the file descriptors."""
    def run(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
        capfd.readouterr()                       # drop what earlier steps of the test printed
        status = run_py_here(cwd, *overrides)
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess([str(REPO / "run.py"), *overrides], status, out, err)
    return run


def exit_status(stop: SystemExit) -> int:
    """The status a process ending on `stop` exits with: sys.exit() is 0, sys.exit(n) is n, sys.exit("...") is 1."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


@pytest.fixture(scope="module")
def hydra_conf():
    """Hydra initialised on the project's conf/ for a module's tests; `make(...)` composes within it."""
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        yield


def make(*overrides: str):
    """The run config composed from conf/config.yaml with `overrides` (inside `hydra_conf`)."""
    from hydra import compose

    from sparsespec.harness.contexts import exact_context_overrides
    return compose(config_name="config", overrides=exact_context_overrides(list(overrides)))
