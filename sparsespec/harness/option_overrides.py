"""`method.options.<name>=...` on the command line, checked against the chosen methods before Hydra
composes: Hydra's own answer to an option a method lacks is "Key 'budget' is not in struct", which
names no method and no way out (a sweep `-m method=ar,sparsespec method.options.budget=0.05` sets
the option on every job, AR's included)."""
from __future__ import annotations

from collections.abc import Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, OverrideType
from omegaconf import OmegaConf

from sparsespec.errors import ConfigError

from sparsespec.harness.entries import CONF_DIR, conf_method_names, method_node

PREFIX = "method.options."


def _parsed(arguments: Iterable[str]) -> list[Override]:
    """The overrides among `arguments` (flags and malformed ones are left to Hydra)."""
    parser, overrides = OverridesParser.create(), []
    for raw in arguments:
        if raw.startswith("-") or "=" not in raw:
            continue
        try:
            overrides.append(parser.parse_override(raw))
        except Exception:  # noqa: BLE001 - Hydra's parser raises its own error types; Hydra reports them later
            continue
    return overrides


def default_method() -> str:
    """conf/config.yaml's `method` default."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml").defaults)
    return next(str(d["method"]) for d in defaults if isinstance(d, dict) and "method" in d)


def chosen_methods(overrides: list[Override]) -> list[str] | None:
    """The conf/method names the command line picks (a sweep: each); None when an experiment or an
    unusual form (glob, range) may pick them instead."""
    for override in overrides:
        if override.key_or_group == "method" and override.package is None:
            value = override.value()
            values = value.list if isinstance(value, ChoiceSweep) else [value]
            return [str(v) for v in values] if all(isinstance(v, str) for v in values) else None
    if any(o.key_or_group == "experiment" for o in overrides):
        return None
    return [default_method()]


def check_option_overrides(arguments: Iterable[str]) -> None:
    """A ConfigError naming the option and the method that lacks it, and the way to set options per
    method (`bench.methods` entries), for a `method.options.<name>=` some chosen method does not take."""
    overrides = _parsed(arguments)
    options = [o for o in overrides if o.type == OverrideType.CHANGE and o.key_or_group.startswith(PREFIX)]
    methods = chosen_methods(overrides) if options else None
    if not methods or any(m not in conf_method_names() for m in methods):
        return   # an unknown method is Hydra's to name, with the accepted ones
    accepted = {m: sorted(k for k in method_node(m).options or {}) for m in methods}
    for override in options:
        name = override.key_or_group.removeprefix(PREFIX)
        for method in methods:
            if name in accepted[method]:
                continue
            takes = f"its options: {', '.join(accepted[method])}" if accepted[method] else "it takes no options"
            fix = bench_hint(methods, accepted, name, override) if any(name in accepted[m] for m in methods) else ""
            raise ConfigError(f"{override.input_line}: method={method} has no option {name!r} ({takes}){fix}")


def bench_hint(methods: list[str], accepted: dict[str, list[str]], name: str, override: Override) -> str:
    """The one-run benchmark that sets `name` only where it exists: each method that takes it once
    per value, the others as they are (AR is in every benchmark already)."""
    value = override.value()
    values = value.list if isinstance(value, ChoiceSweep) else [value]
    entries = [f'"{m}:{name}={v}"' if name in accepted[m] else m
               for m in methods if m != "ar" for v in (values if name in accepted[m] else [None])]
    return f"; to set it only where it exists, compare the methods in one run: 'bench.methods=[{','.join(entries)}]'"
