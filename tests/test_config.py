"""The config tree composes for every model x task x ctx x method, and the checks that run before
any model loads say the right thing. Nothing here loads a model."""
from __future__ import annotations

import dataclasses
import itertools
import subprocess
import re
from pathlib import Path

import pytest
from hydra import compose
from omegaconf import OmegaConf

from sparsespec.method_options import option_names, resolve
from sparsespec.errors import ConfigError
from sparsespec.harness.checks import (check_config, context_warnings, device_name, method_options, model_spec,
                                       resolved_options)
from sparsespec.harness.contexts import exact_context_overrides
from sparsespec.methods import METHODS
from sparsespec.models import EMBEDDED_MODELS, ModelSpec

from conftest import make

CONF = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_config_groups_hold_what_the_issue_names():
    assert set(options("model")) >= {"smollm2_135m", "qwen2.5_coder_0.5b", "llama3_8b", "mistral_7b",
                                     "llama3.1_8b", "qwen2.5_7b"}
    assert set(options("task")) >= {"summarization", "qa", "code", "retrieval"}
    assert set(options("ctx")) >= {f"{n}k" for n in (1, 2, 4, 8, 16, 32, 10, 20, 30, 40, 50, 60, 64, 128)}
    assert set(options("method")) >= {"ar", "sparsespec", "sparsespec_fixed"}
    assert set(options("logger")) == {"wandb", "none"}


def test_defaults(hydra_conf):
    cfg = make()
    assert (cfg.model.name, cfg.task.name, cfg.ctx, cfg.method.label, cfg.logger.name) == \
        ("smollm2_135m", "summarization", 4000, "sparsespec", "wandb")
    assert resolved_options("sparsespec", method_options(cfg.method))["controller"] == "entropy"
    assert cfg.max_new_tokens == 128 and cfg.temperature == 0.0 and cfg.compare_ar is True
    assert cfg.task.source == "embedded" and cfg.model.embedded == "smollm2_135m"
    assert cfg.dtype == "float32" and cfg.device == "auto"
    check_config(cfg)


def test_wandb_is_offline_unless_asked(hydra_conf, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert make().logger.mode == "offline"
    assert make("logger.mode=online").logger.mode == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert make().logger.mode == "disabled"


def test_ctx_files_set_ctx_and_nothing_else(hydra_conf):
    for name in options("ctx"):
        assert OmegaConf.to_container(OmegaConf.load(CONF / "ctx" / f"{name}.yaml")) == {"ctx": int(name[:-1]) * 1000}
        assert make(f"ctx={name}").ctx == int(name[:-1]) * 1000


def with_ctx(cfg, ctx: int):
    cfg = cfg.copy()
    OmegaConf.update(cfg, "ctx", ctx)
    return cfg


@pytest.mark.slow   # ~4-8 s a model; test_every_experiment_composes stays in the fast tier
@pytest.mark.parametrize("model", options("model"))
def test_every_combination_composes(hydra_conf, model):
    """model x task x ctx x method, one model's share per test. Hydra composes each model x task x
    method; a ctx file sets the one key `ctx` and nothing else (test above), so the ctx axis is that
    config with `ctx` set, which `test_ctx_axis_is_separable` checks against Hydra on a sample.
    (Composing all ~2300 literally takes ~0.1 s each.) Every combination must pass the checks, or be
    rejected exactly when prompt + new tokens exceed the model's context."""
    failures = []
    for task, method in itertools.product(options("task"), options("method")):
        base = make(f"model={model}", f"task={task}", f"method={method}", "logger=none")
        assert base.task.name == task and base.model.name == model
        ModelSpec.coerce(model_spec(base))
        for ctx in options("ctx"):
            cfg = with_ctx(base, int(ctx[:-1]) * 1000)
            too_long = cfg.ctx + cfg.max_new_tokens > cfg.model.max_context
            try:
                check_config(cfg)
                rejected = False
            except ConfigError as err:
                rejected = True
                if "max_context" not in str(err):
                    failures.append((model, task, ctx, method, str(err)))
            if rejected != too_long:
                failures.append((model, task, ctx, method, f"rejected={rejected}, too_long={too_long}"))
    assert not failures, failures[:5]


@pytest.mark.slow   # composes a multirun per context (~7 s)
def test_ctx_axis_is_separable(hydra_conf):
    """Hydra's own composition of model x task x ctx x method equals the shortcut above (a sample
    of 40 combinations spread over every option)."""
    combos = list(itertools.product(options("model"), options("task"), options("ctx"), options("method")))
    for model, task, ctx, method in combos[::len(combos) // 40]:
        literal = make(f"model={model}", f"task={task}", f"ctx={ctx}", f"method={method}", "logger=none")
        shortcut = with_ctx(make(f"model={model}", f"task={task}", f"method={method}", "logger=none"),
                            int(ctx[:-1]) * 1000)
        assert OmegaConf.to_container(literal) == OmegaConf.to_container(shortcut), (model, task, ctx, method)


def test_every_experiment_composes(hydra_conf):
    for name in options("experiment"):
        cfg = compose(config_name="config", overrides=[f"experiment={name}"], return_hydra_config=True)
        assert cfg.model.name and cfg.method.name in METHODS, name


def test_dotted_model_names_work_on_the_command_line(hydra_conf):
    assert make("model=qwen2.5_coder_0.5b").model.max_context == 32768
    assert make("model=llama3.1_8b").model.path == "meta-llama/Llama-3.1-8B-Instruct"


def test_model_files_are_model_specs():
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    for name in options("model"):
        node = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml"))
        assert set(node) == fields, name
        assert node["name"] == name
        assert node["embedded"] is None or node["embedded"] in EMBEDDED_MODELS
        ModelSpec.coerce(node)


def test_model_path_replaces_the_embedded_copy(hydra_conf):
    spec = model_spec(make("model.path=/some/folder"))
    assert spec["path"] == "/some/folder" and spec["embedded"] is None
    ModelSpec.coerce(spec)


def test_method_options_are_engine_options(hydra_conf):
    for name in options("method"):
        cfg = make(f"method={name}")
        assert cfg.method.name in METHODS
        assert set(cfg.method.options) == option_names(cfg.method.name), name
        resolve(cfg.method.name, method_options(cfg.method))   # every shipped YAML resolves as it stands


def test_method_options_drop_nulls(hydra_conf):
    assert method_options(make("method=sparsespec_fixed", "method.options.k=12").method) == {"controller": "fixed", "k": 12}
    assert method_options(make("method=ar").method) == {}


def test_named_contexts_are_thousands(hydra_conf):
    assert make("ctx=1k").ctx == 1000
    assert make("ctx=60k").ctx == 60000
    assert make("ctx=128k").ctx == 128000


def test_exact_integer_context(hydra_conf):
    assert exact_context_overrides(["ctx=3000", "seed=1"]) == ["ctx='3000'", "seed=1"]
    assert make("ctx=3000").ctx == 3000
    assert exact_context_overrides(["ctx=3000,60k"]) == ["ctx='3000',60k"]
    assert exact_context_overrides(["ctx=60k", "model.max_context=100"]) == ["ctx=60k", "model.max_context=100"]


def test_experiment_overrides_last(hydra_conf):
    cfg = make("experiment=smoke")
    assert cfg.ctx == 1000 and cfg.num_prompts == 2 and cfg.max_new_tokens == 16
    check_config(cfg)


def test_submitit_launchers_compose(hydra_conf):
    for launcher, target in (("submitit_local", "LocalLauncher"), ("submitit_slurm", "SlurmLauncher")):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
        assert cfg.hydra.launcher._target_.endswith(target)
    cfg = compose(config_name="config", return_hydra_config=True,
                  overrides=["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                             "hydra.launcher.gpus_per_node=1", "hydra.launcher.timeout_min=240",
                             "hydra.launcher.mem_gb=64"])
    assert (cfg.hydra.launcher.partition, cfg.hydra.launcher.gpus_per_node) == ("gpu", 1)


def test_budget_beyond_the_context_is_accepted(hydra_conf):
    check_config(make("ctx=1k", "method.options.budget=5000"))     # a dense draft, noted in the run's options


@pytest.mark.parametrize("overrides, fragment", [
    (["ctx=60k"], "exceeds model smollm2_135m's max_context=8192"),
    (["ctx=8k", "max_new_tokens=500"], "exceeds model smollm2_135m's max_context=8192"),
    (["method.options.sink=0", "method.options.recent=0", "method.options.topk=0"], "no position"),
    (["method.options.controller=magic"], "magic"),
    (["+method.options.bogus=1"], "bogus"),
    (["method=ar", "+method.options.budget=0.1"], "budget"),
    (["method=ar", "+method.options.k=4"], "drafts nothing, so it takes no option(s) ['k']"),
    (["method.name=nosuch"], "nosuch"),
    (["ctx=-5"], "ctx=-5"),
    (["device=tpu"], "tpu"),
    (["compare_ar=maybe"], "compare_ar='maybe' must be true or false"),
    (["top_p=0"], "top_p"),
    (["temperature=nan"], "temperature=nan must be a finite number >= 0"),
    (["temperature=inf"], "temperature=inf must be a finite number >= 0"),
    (["temperature=abc"], "temperature='abc' must be a finite number >= 0"),
    (["top_p=nan"], "top_p=nan must be a number in (0, 1]"),
    (["top_p=inf"], "top_p=inf must be a number in (0, 1]"),
    (["top_p=abc"], "top_p='abc' must be a number in (0, 1]"),
    (["seed=abc"], "seed='abc' must be an integer"),
    (["seed=1.5"], "seed=1.5 must be an integer"),
    (["prefill_memo_gb=-1"], "prefill_memo_gb=-1 must be a number of GiB >= 0"),
    (["prefill_memo_gb=lots"], "prefill_memo_gb='lots' must be a number of GiB >= 0"),
    (["prefill_cache_gb=-2"], "prefill_cache_gb=-2 must be a number of GiB >= 0"),
    (["prefill_cache_dir=''"], "prefill_cache_dir='' must be null (off) or a folder's path"),
    (["prefill_cache_dir=pyproject.toml"], "prefill_cache_dir='pyproject.toml' must be null (off) or a folder's path"),
    (["task.source=longbench", "task.path=no/such/folder"], "task.path=no/such/folder does not exist"),
    (["task=retrieval", "task.variant=needle"], "task.variant='needle' is unknown; accepted: mixed, niah_single"),
    (["task=retrieval", "task.depth=1.5"], "task.depth=1.5 must be a number from 0 to 1"),
    (["task=retrieval", "task.source=longbench"], "task.source='longbench' has no retrieval task"),
])
def test_bad_values_are_named(hydra_conf, overrides, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        check_config(make(*overrides))
    message = str(info.value)
    assert fragment in message and "\n" not in message


@pytest.mark.parametrize("device, fragment", [
    ("cuda", "device='cuda' but CUDA is not available here"),
    ("cuda:0", "device='cuda:0' but CUDA is not available here"),
])
def test_cuda_without_cuda_is_named_before_loading(hydra_conf, monkeypatch, device, fragment):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=re.escape(fragment) + ".*accepted here: auto, cpu$"):
        check_config(make(f"device={device}"))
    assert device_name("auto") == "cpu"


def test_a_cuda_device_this_machine_lacks_is_named(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_name("cuda:1") == "cuda:1"
    expected = "device='cuda:2' does not exist here; accepted: cuda, cuda:0 to cuda:1"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        device_name("cuda:2")


def test_paper_gpu_command_passes_past_the_trained_length(hydra_conf):
    """`python run.py model=llama3_8b method=sparsespec ctx=60k` (README, docs/harness.md) passes
    the checks, with one warning that names the trained length; past max_context it still stops."""
    cfg = make("model=llama3_8b", "method=sparsespec", "ctx=60k")
    check_config(cfg)
    assert (cfg.model.max_context, cfg.model.trained_context) == (65536, 8192)
    warnings = context_warnings(cfg)
    assert len(warnings) == 1 and "ctx=60000" in warnings[0] and "llama3_8b's trained length 8192" in warnings[0]
    check_config(make("model=mistral_7b", "ctx=60k"))
    assert "mistral_7b's trained length 32768" in context_warnings(make("model=mistral_7b", "ctx=60k"))[0]
    assert context_warnings(make("model=llama3_8b", "ctx=8k")) == []          # 8000 + 128 fits 8192
    assert context_warnings(make("model=llama3.1_8b", "ctx=60k")) == []
    for overrides in (["ctx=128k"], ["ctx=64k", "max_new_tokens=2000"]):
        with pytest.raises(ConfigError, match="exceeds model llama3_8b's max_context=65536"):
            check_config(make("model=llama3_8b", *overrides))


def test_trained_context_at_most_max_context(hydra_conf):
    for name in options("model"):
        model = make(f"model={name}").model
        assert model.trained_context is not None and model.trained_context <= model.max_context, name


def test_resolved_options_name_the_controller_and_its_k(hydra_conf):
    """summary.json's method_options: a fixed-k run names its k even when left at the default."""
    assert resolved_options("sparsespec", method_options(make("method=sparsespec_fixed").method))["k"] == 4
    fixed = resolved_options("sparsespec", method_options(make("method=sparsespec_fixed", "method.options.k=12").method))
    assert (fixed["controller"], fixed["k"]) == ("fixed", 12) and "budget" in fixed
    entropy = resolved_options("sparsespec", method_options(make().method))
    assert entropy["controller"] == "entropy" and entropy["candidates"] == list(range(1, 17)) and "k" not in entropy
    assert resolved_options("ar", {}).keys().isdisjoint({"k", "candidates", "prior_k"})


def matrix_chunks() -> dict[str, list[str]]:
    """experiments/run_matrix.sh's chunks as bash itself expands them (`--list`), each as the argument
    list the script passes to run.py (unquoted expansion: split on whitespace, quotes inside the value
    kept for Hydra's grammar)."""
    script = CONF.parent / "experiments" / "run_matrix.sh"
    listing = subprocess.run(["bash", str(script), "--list"], capture_output=True, text=True, check=True).stdout
    return {name: args.split() for name, _, args in (line.partition("\t") for line in listing.splitlines())}


def test_only_the_retrieval_task_passes_its_variant_and_depth_to_the_loader(hydra_conf):
    from sparsespec.harness.run_config import task_spec
    assert task_spec(make("task=retrieval")).loader_options() == {"variant": "mixed"}
    assert task_spec(make("task=retrieval", "task.variant=qa", "task.depth=0.3")).loader_options() == \
        {"variant": "qa", "depth": 0.3}
    assert task_spec(make("task=qa")).loader_options() == {}


def sweep_jobs(args: list[str]) -> list[list[str]]:
    """The argument list of each job a multirun launches: `task=qa,code` gives one list per task
    (a value in brackets is a list, not a sweep)."""
    jobs = [[]]
    for arg in args:
        key, _, value = arg.partition("=")
        values = value.split(",") if "," in value and not value.startswith("[") else [value]
        jobs = [job + [f"{key}={v}"] for job in jobs for v in values]
    return jobs


@pytest.mark.slow   # composes every chunk of the matrix (~10 s)
def test_every_matrix_chunk_composes_and_its_methods_resolve(hydra_conf, tmp_path):
    from sparsespec.harness.run_config import build_run_config
    chunks = matrix_chunks()
    assert {"smollm2_2k", "qwen_16k", "qwen_16k_12", "qwen_32k", "qwen_32k_12"} <= set(chunks)
    # the matrix sweeps the retrieval task too (where a recent window must miss the evidence); a chunk
    # that names no task runs every one
    tasks = OmegaConf.load(CONF / "experiment" / "matrix_cpu.yaml").hydra.sweeper.params.task
    assert set(tasks.split(",")) == {"summarization", "qa", "code", "retrieval"}
    cells = []
    for name, args in chunks.items():
        if not any(arg.startswith("task=") for arg in args):
            args = [*args, f"task={tasks}"]
        for job in sweep_jobs(args):
            cfg = make("experiment=matrix_cpu", *job)
            check_config(cfg)
            build_run_config(cfg, tmp_path)
            # what the claims need in every chunk: the controller beside fixed k, and recycled top-K at
            # streaming's and SnapKV's k=4 (analysis/claims.py SAME_K_RECYCLED)
            assert {"sparsespec", "sparsespec_fixed:k=4", "streaming", "snapkv_static"} <= set(cfg.bench.methods), name
            cells.append((cfg.model.name, cfg.ctx, cfg.task.name))
    # running every chunk decodes no cell twice (the analysis refuses a prompt decoded twice in a cell)
    assert len(cells) == len(set(cells)), sorted(c for c in cells if cells.count(c) > 1)


def test_help_lists_every_group_a_user_picks_and_not_the_option_schema(hydra_conf):
    template = compose(config_name="config", return_hydra_config=True).hydra.help.template
    groups = {line.split(":")[0] for line in template.splitlines() if re.match(r"^[a-z]+: ", line)}
    assert groups == {"ctx", "experiment", "logger", "method", "model", "task"}
    assert f"method: {', '.join(options('method'))}" in template
    assert "python -m sparsespec.methods" in template and "bench.methods=" in template


@pytest.mark.parametrize("arguments, words", [
    (["-m", "method=ar,sparsespec", "method.options.budget=0.05"],
     ["method=ar has no option 'budget'", "it takes no options", """'bench.methods=["sparsespec:budget=0.05"]'"""]),
    (["-m", "method=sparsespec,pld,streaming", "method.options.budget=0.1,0.2"],
     ["method=pld has no option 'budget'", "its options: ", "max_ngram",
      """'bench.methods=["sparsespec:budget=0.1","sparsespec:budget=0.2",pld,"streaming:budget=0.1","""
      """"streaming:budget=0.2"]'"""]),
    (["method.options.budgett=0.1"], ["method=sparsespec has no option 'budgett'", "budget, "]),
])
def test_an_option_a_chosen_method_lacks_is_one_line_pointing_to_bench_entries(arguments, words):
    from sparsespec.harness.option_overrides import check_option_overrides

    with pytest.raises(ConfigError) as err:
        check_option_overrides(arguments)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    if len(words) == 2:                                  # no chosen method takes it: no benchmark to point to
        assert "bench.methods" not in message


@pytest.mark.parametrize("arguments", [
    ["method.options.budget=0.05"], ["-m", "method=sparsespec,streaming", "method.options.budget=0.05,0.1"],
    ["method=ar", "+method.options.k=4"],              # an added key: resolve() names the problem later
    ["experiment=smoke", "method.options.k=4"],        # the experiment picks the method: left to Hydra
    ["method=sparsespec_fixed", "method.options.k=12"], ["--help"], ["ctx=3000"]])
def test_options_every_chosen_method_takes_pass(arguments):
    from sparsespec.harness.option_overrides import check_option_overrides

    check_option_overrides(arguments)
