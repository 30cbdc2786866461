"""KV-selection policies: one module per policy, each one `method=<name>`.

Adding a policy: one module here with one `KVPolicy` subclass that sets `name` (it registers
itself; this package imports every module in it), plus `conf/method/<name>.yaml`. No edit to the
decode loop, the attention hooks or a registry list. The interface is in `base.py`; the smallest
example is `streaming.py`, one that observes verification `recycled_verification.py` (SparseSpec-L),
a query-aware one `oracle.py`.
"""
from __future__ import annotations

import importlib
import pkgutil

from sparsespec.methods.policies.base import POLICIES, KVPolicy, QueryAwarePolicy

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["POLICIES", "KVPolicy", "QueryAwarePolicy"]
