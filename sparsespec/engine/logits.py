"""The target's logits at the verified positions: the one computation every verification shares
(single sequence and batched), so a change here changes both alike and AR identity is kept."""
from __future__ import annotations

import torch


def target_logits(model, **inputs) -> torch.Tensor:
    """(B, q, V) logits at every position of `inputs`.

    For a plain linear LM head they are computed as (W @ h^T)^T, which CPU BLAS runs faster than
    h @ W^T (what nn.Linear does) for a handful of rows. The batch's rows are folded into one
    (D, B*q) matrix so W is read once, instead of once per row as the broadcast (V, D) @ (B, D, q)
    form does (experiments/batch_step_cost.py measures both). Heads with soft-capping, logit scales
    or a bias go through the model's own forward."""
    head = model.get_output_embeddings()
    config = model.config.get_text_config()
    plain = (type(head) is torch.nn.Linear and head.bias is None
             and getattr(config, "final_logit_softcapping", None) is None
             and getattr(config, "logit_scale", None) is None)
    if not plain:
        return model(**inputs).logits
    hidden = model.get_decoder()(**inputs).last_hidden_state                       # (B, q, D)
    b, q, d = hidden.shape
    return torch.matmul(head.weight, hidden.reshape(b * q, d).T).T.reshape(b, q, -1)   # (B, q, V)
