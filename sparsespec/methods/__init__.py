"""Registry of decoding methods: `method=<name>` in `sparsespec.generate` and in `conf/method/`.

Where things go: a new KV-selection policy for the sparse draft (what to observe, how to score, which
positions to attend to) is one module in `policies/` with one `KVPolicy` subclass that names itself;
it is found and registered here automatically. A new kind of drafter is a module here with a
`Drafter` subclass (`base.py`), added to the list below. Either way, add `conf/method/<name>.yaml`."""
from __future__ import annotations

from sparsespec.methods.ar import AutoregressiveDrafter
from sparsespec.methods.assisted import AssistedDrafter
from sparsespec.methods.base import Drafter
from sparsespec.methods.layerskip import LayerSkipDrafter
from sparsespec.methods.pld import PromptLookupDrafter
from sparsespec.methods.policies import POLICIES
from sparsespec.methods.sparse_kv import SparseKVDrafter

METHODS: dict[str, type[Drafter]] = {
    **{cls.name: cls for cls in (AutoregressiveDrafter, LayerSkipDrafter, AssistedDrafter, PromptLookupDrafter)},
    **{name: SparseKVDrafter.for_policy(policy) for name, policy in POLICIES.items()},
}


def method_names() -> list[str]:
    return sorted(METHODS)
