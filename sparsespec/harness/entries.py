"""Method entries: what `method=` and a `bench.methods` entry name, and the `method` config each stands for.

An entry is `name[:option=value,...]`; `name` is a conf/method file or one of transformers' reference
decoders (`hf_generate`, `hf_pld`). Two entries are the same when they resolve to the same method
with the same options (every declared default filled in): `sparsespec`, `sparsespec:` and
`sparsespec:budget=0.05` (the declared default) are one entry (`run_config.MethodSpec.key`). The
run composes each entry once, while its config is built (`run_config.build_run_config`).
"""
from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from sparsespec import hf_reference
from sparsespec.errors import ConfigError

from sparsespec.harness.checks import resolved_options

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
LABELLED_BY_ANALYSIS = ("k", "budget")


def conf_method_names() -> list[str]:
    """The names `method=` accepts: the conf/method files (`python -m sparsespec.methods` lists each)."""
    return sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))


def entry_names() -> list[str]:
    """What a `bench.methods` entry may name: a conf/method file, or one of transformers' reference decoders."""
    return conf_method_names() + sorted(hf_reference.OPTIONS)


def entry_folder(entry: str) -> str:
    """A method entry as a folder name: `sparsespec_fixed:k=4` -> `sparsespec_fixed-k=4`."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", entry).strip("-")


def parse_entry(entry: str) -> tuple[str, list[str]]:
    """`name[:option=value,...]` -> (name, ["option=value", ...]); a ConfigError naming the bad part
    (an unknown method, an option without a value) before anything is composed or loaded."""
    name, _, extra = entry.partition(":")
    if name not in entry_names():
        raise ConfigError(f"bench.methods entry {entry!r}: unknown method {name!r}; accepted: {', '.join(entry_names())}")
    assignments = [kv for kv in extra.split(",") if kv]
    for kv in assignments:
        if not kv.split("=", 1)[0] or "=" not in kv:
            raise ConfigError(f"bench.methods entry {entry!r}: {kv!r} must be option=value")
    return name, assignments


def method_node(entry: str) -> DictConfig:
    """The `method` config of an entry `name[:option=value,...]`: conf/method/<name>.yaml with those
    options, or a reference decoder of transformers' own (`hf_generate`, `hf_pld`)."""
    name, assignments = parse_entry(entry)
    if hf_reference.is_reference(name):
        options = dict(kv.split("=", 1) for kv in assignments)
        node = OmegaConf.create({"name": name, "label": name, "options": {k: None for k in hf_reference.OPTIONS[name].names()}})
        for key, value in options.items():
            OmegaConf.update(node, f"options.{key}", _parse(value))
        return node
    overrides = [f"method={name}", *(f"++method.options.{kv}" for kv in assignments)]
    # k and budget are labelled by analysis/ from the options; any other option names the run apart
    # ("sparsespec acceptance_model=paper"), so two entries of one method never share a label
    named = [kv for kv in assignments if kv.split("=", 1)[0] not in LABELLED_BY_ANALYSIS]
    if named:
        overrides.append(f"method.label='{name} {','.join(named)}'")
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=overrides).method
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides).method


def _parse(text: str):
    """A command-line value as Hydra would read it (int, float, bool, null or string)."""
    return OverridesParser.create().parse_override(f"x={text}").value()


def resolved_method_options(method: str, options: dict) -> dict:
    """Every option `method` runs with, declared defaults filled in (a ConfigError on a bad one)."""
    if hf_reference.is_reference(method):
        return hf_reference.resolve_options(method, options)
    return resolved_options(method, options)

