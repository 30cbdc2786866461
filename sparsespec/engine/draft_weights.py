"""Draft-only weights: drafting may run a cheaper copy of the target's weights.

Verification always runs the target's own weights, so the output is still exactly AR's under
greedy decoding, and rejection sampling still targets AR's distribution (it divides by the draft's
own q). Only the acceptance rate can change.

A decode step reads every weight once per token (a GEMV), so on a CPU its cost is the weight
bytes. PyTorch's dynamic int8 quantization (fbgemm) reads a quarter of fp32's bytes; bf16 helps
little on a CPU without bf16 units.

    "full"      the target's own modules (the paper's setting)
    "int8"      every nn.Linear dynamically quantized to int8 (CPU only)
    "bfloat16"  a bf16 copy of the model (an fp32 target on a GPU)
    "auto"      "int8" for an fp32 model on a CPU, otherwise "full"

The int8 copy shares every tensor it does not convert (embeddings, norms) with the target. Copies
are built once per target model and kept while the model lives.
"""
from __future__ import annotations

import copy
import warnings
import weakref

import torch

from sparsespec.engine.attention import ATTN_IMPLEMENTATION
from sparsespec.errors import ConfigError

DRAFT_WEIGHTS = ("auto", "full", "int8", "bfloat16")
_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # target -> {kind: draft model}


def resolve_draft_weights(model, kind: str, allowed: tuple[str, ...] = DRAFT_WEIGHTS) -> str:
    """`kind` with "auto" made concrete for this model; a one-line ConfigError if it cannot run."""
    if kind not in allowed:
        raise ConfigError(f"draft_weights={kind!r} is unknown; accepted: {list(allowed)}")
    param = next(model.parameters())
    if kind == "auto":
        return "int8" if param.device.type == "cpu" and param.dtype == torch.float32 else "full"
    if kind == "int8" and param.device.type != "cpu":
        raise ConfigError(f"draft_weights='int8' runs on CPU only (fbgemm); the model is on {param.device}; "
                          f"use 'full' or 'bfloat16'")
    if kind == "bfloat16" and param.dtype == torch.bfloat16:
        return "full"
    return kind


def draft_model(model, kind: str):
    """The module that draft steps run: `model` itself, or its cached low-precision copy."""
    if kind == "full":
        return model
    copies = _copies.setdefault(model, {})
    if kind not in copies:
        copies[kind] = _build(model, kind)
    return copies[kind]


def _build(model, kind: str):
    if kind == "bfloat16":
        draft = copy.deepcopy(model).to(torch.bfloat16)
    else:
        # new modules over the *same* tensors, then swap each nn.Linear for an int8 one
        shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
        draft = copy.deepcopy(model, memo=shared)
        with warnings.catch_warnings():   # torch.ao points to torchao; the eager API is what we need here
            warnings.simplefilter("ignore")
            torch.ao.quantization.quantize_dynamic(draft, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    draft.eval()
    draft.set_attn_implementation(ATTN_IMPLEMENTATION)   # drafting always runs with a hook
    return draft
