"""Context lengths: named files in conf/ctx/ (1k = 1000 tokens) plus any exact integer, `ctx=3000`.

`ctx=<value>` selects a config in the `ctx` group. Hydra accepts only strings as group choices, and
only choices it can find, so for an integer it has neither. `exact_context_overrides` fixes both
before Hydra composes: it stores a `ctx/<N>` config (setting `ctx: N`) in Hydra's ConfigStore for
each integer N the overrides ask for, sweeps included, and quotes N (`ctx='3000'`) so Hydra reads
it as the name of that config.
"""
from __future__ import annotations

from collections.abc import Iterable

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep

GROUP = "ctx"


def register_exact_context(tokens: int) -> None:
    """Make `ctx/<tokens>` a config of the `ctx` group that sets `ctx: <tokens>`."""
    ConfigStore.instance().store(group=GROUP, name=str(tokens), node={GROUP: tokens},
                                 package="_global_", provider="sparsespec")


def _choices(override: Override) -> list[int | float | str] | None:
    """The values a `ctx=` override selects; None for forms left to Hydra (glob, nested sweeps)."""
    value = override.value()
    values = list(override.sweep_iterator()) if isinstance(value, (ChoiceSweep, RangeSweep)) else [value]
    if override.is_sweep_override() and not isinstance(value, (ChoiceSweep, RangeSweep)):
        return None
    if not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in values):
        return None
    return values


def _rewrite(raw: str, parser: OverridesParser) -> str:
    override = parser.parse_override(raw)
    choices = _choices(override)
    if override.key_or_group != GROUP or choices is None or all(isinstance(c, str) for c in choices):
        return raw
    for choice in choices:
        if isinstance(choice, int):
            register_exact_context(choice)
    # Numbers are quoted so Hydra takes them as config names; a float finds no config, and Hydra
    # then lists the named lengths.
    prefix = raw.split("=", 1)[0]
    return prefix + "=" + ",".join(c if isinstance(c, str) else f"'{c}'" for c in choices)


def exact_context_overrides(overrides: Iterable[str]) -> list[str]:
    """Return the overrides with every integer `ctx` choice registered and quoted; others untouched.

    Malformed overrides are returned unchanged, for Hydra to report in its own words.
    """
    parser = OverridesParser.create()
    result = []
    for raw in overrides:
        is_ctx = "=" in raw and raw.split("=", 1)[0].lstrip("+~") == GROUP
        result.append(_rewrite(raw, parser) if is_ctx else raw)
    return result
