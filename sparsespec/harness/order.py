"""The order in which the methods of a run decode one prompt (`run_order`).

Methods that decode a prompt back to back share a machine whose state drifts (caches, clocks, other
processes), so a method that always decodes first or last carries that drift into its speed.
`random` draws each prompt's order afresh from the run's seed and the prompt's index alone, so a
resumed run draws the very order the first sitting drew; `fixed` keeps the listed order.
"""
from __future__ import annotations

import random

from sparsespec.errors import ConfigError

RUN_ORDERS = ("random", "fixed")


def check_run_order(value) -> None:
    if value not in RUN_ORDERS:
        raise ConfigError(f"run_order={value!r} is unknown; accepted: {', '.join(RUN_ORDERS)}")


def prompt_order(entries: list[str], seed: int, index: int, run_order: str) -> list[str]:
    """`entries` in the order prompt `index` decodes them: as listed (`fixed`), or a permutation
    drawn by random.Random(f"run order {seed} {index}") (`random`; a string seed is hashed the same
    way on every machine and Python process, negative seeds included)."""
    check_run_order(run_order)
    order = list(entries)
    if run_order == "random":
        random.Random(f"run order {seed} {index}").shuffle(order)
    return order
