"""The Hydra schema of `conf/method/*.yaml`, derived from the declared options.

Hydra composes in struct mode: `method.options.budget=0.2` works only if the key exists. Rather than
list every option as null in every YAML file (a second declaration that drifts), each method's full
set of option keys is stored here as `method_options/<method>`, and `conf/method/<method>.yaml`
starts from it and holds only its deltas:

    defaults:
      - /method_options/sparsespec@options
      - _self_

Keys are null: a null leaves the declared default in place (`checks.method_options` drops them).
Importing `sparsespec.harness` registers the schema, before any config is composed.
"""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from sparsespec.method_options import option_names
from sparsespec.methods import METHODS

GROUP = "method_options"


def register_method_options() -> None:
    """Idempotent: one `method_options/<method>` node per registered method."""
    store = ConfigStore.instance()
    for method in METHODS:
        store.store(group=GROUP, name=method, node={name: None for name in sorted(option_names(method))})
