"""Registry of decoding methods: `method=<name>` in `sparsespec.generate` and in `conf/method/`.

Where things go: a new drafting policy over the sparse KV is a subclass in `sparse_kv.py`; a new
kind of drafter is a module here with a `Drafter` subclass, registered below."""
from __future__ import annotations

from .ar import AutoregressiveDrafter
from .assisted import AssistedDrafter
from .base import Drafter
from .layerskip import LayerSkipDrafter
from .oracle import OracleDrafter
from .pld import PromptLookupDrafter
from .sparse_kv import SnapKVStaticDrafter, SparseKVDrafter, StreamingDrafter

METHODS: dict[str, type[Drafter]] = {
    cls.name: cls
    for cls in (AutoregressiveDrafter, SparseKVDrafter, StreamingDrafter, SnapKVStaticDrafter,
                OracleDrafter, LayerSkipDrafter, AssistedDrafter, PromptLookupDrafter)
}


def method_names() -> list[str]:
    return sorted(METHODS)
