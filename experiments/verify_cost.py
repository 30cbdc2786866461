"""What a verification costs, and which kernel choices change it (issue: cheaper verification).

    python experiments/verify_cost.py --model smollm2_135m --ctx 8000 [--out docs/runs/verify_cost]

Three measurements, timing only (random token ids; the values never change the work done):
1. every distinct nn.Linear shape of the model, at 1 row (an AR step) and at q rows (a verification of
   q - 1 drafts), computed four ways: nn.Linear (x @ W^T), the weight stored column-major,
   W @ x^T, and fused Q|K|V and gate|up projections;
2. the attention alone, every layer's q queries over `ctx` keys the way verification computes it
   (explicit packed-GQA softmax(QK^T)V) and two SDPA variants, summed over the layers;
3. one forward of q tokens over a `ctx`-token cache, the way the decode loop verifies (explicit
   packed-GQA attention), with and without recording the attention each position received
   (SparseSpec-L's recycled scores), as a multiple of one AR step at the same context;
4. where that forward's time goes (torch.profiler, self CPU time per forward): the Linear layers'
   matrix products, the attention's, and everything else. Unlike 1. and 2., which repeat one layer's
   operands (so they stay in cache), this reads every layer's weights and KV once, as decoding does.

Prints one table and, with --out, writes verify_cost.json and verify_cost.md there.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from sparsespec.engine.attention import (apply_probs, attention_received, grouped_attention_probs, sparsespec_attention,
                                  visible_keys)
from sparsespec.harness.environment import cpu_name
from sparsespec.engine.logits import target_logits
from sparsespec.models import load_model
from sparsespec.engine.prefill import SharedPrefill
from sparsespec.tables import markdown_table


class ExplicitAttentionHook:
    """Verification of one sequence over a plain (preallocated) cache, as the loop's
    `BatchVerifyHook` computes it: probabilities in packed-GQA form, out = P @ V;
    `observer(layer_idx, probs)`, if given, sees each layer's probabilities (B, Hkv, G, q, N)."""

    def __init__(self, observer=None):
        self.observer = observer

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        q, n = query.shape[2], key.shape[2]
        probs = grouped_attention_probs(query, key, visible_keys(attention_mask, q, n, query.device), scaling)
        if self.observer is not None:
            self.observer(module.layer_idx, probs)
        return apply_probs(probs, value, query.dtype), None


def median_ms(fn, repeats: int) -> float:
    fn()                                                           # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def linear_layouts(model, rows: list[int], repeats: int) -> list[dict]:
    """Per distinct Linear shape: ms of each way to compute x @ W^T for each row count."""
    layer = model.get_decoder().layers[0]
    shapes = {tuple(m.weight.shape): m.weight.detach() for m in layer.modules() if isinstance(m, torch.nn.Linear)}
    out = []
    for (o, i), w in sorted(shapes.items()):
        column_major = w.t().contiguous().t()
        for q in rows:
            x = torch.randn(q, i)
            out.append({"weight": f"{o}x{i}", "rows": q,
                        "linear_ms": median_ms(lambda: torch.nn.functional.linear(x, w), repeats),
                        "column_major_ms": median_ms(lambda: torch.nn.functional.linear(x, column_major), repeats),
                        "w_at_xT_ms": median_ms(lambda: torch.matmul(w, x.T).T, repeats)})
    attn, mlp = layer.self_attn, layer.mlp
    qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
    for q in rows:
        x = torch.randn(q, qkv.shape[1])
        out.append({"weight": "q+k+v", "rows": q,
                    "separate_ms": median_ms(lambda: [torch.nn.functional.linear(x, p.weight) for p in
                                                      (attn.q_proj, attn.k_proj, attn.v_proj)], repeats),
                    "fused_ms": median_ms(lambda: torch.nn.functional.linear(x, qkv), repeats)})
        out.append({"weight": "gate+up", "rows": q,
                    "separate_ms": median_ms(lambda: [mlp.gate_proj(x), mlp.up_proj(x)], repeats),
                    "fused_ms": median_ms(lambda: torch.nn.functional.linear(x, gate_up), repeats)})
    return out


def attention_alone(model, ctx: int, rows: list[int], repeats: int) -> list[dict]:
    """ms of every layer's attention for q queries over ctx keys (random values), three ways: the explicit
    packed-GQA softmax(QK^T)V verification uses (it yields the probabilities SparseSpec-L records);
    torch's SDPA with the causal-block mask; and SDPA over the cached prefix alone, unmasked (the fused
    CPU kernel; what a verification would pay for the prefix if the q new tokens' own block were merged
    in separately). Whether the last two stay flat in q is what a cheaper verification hinges on."""
    config = model.config.get_text_config()
    layers, heads, kv_heads = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    key, value = torch.randn(1, kv_heads, ctx + max(rows), dim), torch.randn(1, kv_heads, ctx + max(rows), dim)
    out = []
    for q in rows:
        query = torch.randn(1, heads, q, dim)
        k, v = key[:, :, :ctx + q], value[:, :, :ctx + q]
        visible = visible_keys(None, q, ctx + q, query.device)

        block = torch.ones(q, ctx + q, dtype=torch.bool).tril(ctx)                   # query i sees keys <= ctx + i

        def attend():
            apply_probs(grouped_attention_probs(query, k, visible, dim ** -0.5), v, query.dtype)

        def sdpa_masked():
            F.scaled_dot_product_attention(query, k, v, attn_mask=block, enable_gqa=True)

        def sdpa_prefix():
            F.scaled_dot_product_attention(query, key[:, :, :ctx], value[:, :, :ctx], enable_gqa=True)
        out.append({"ctx": ctx, "rows": q, "attention_ms_all_layers": layers * median_ms(attend, repeats),
                    "sdpa_masked_ms_all_layers": layers * median_ms(sdpa_masked, repeats),
                    "sdpa_prefix_ms_all_layers": layers * median_ms(sdpa_prefix, repeats)})
    return out


OP_GROUPS = {"aten::mm": "linear", "aten::addmm": "linear", "aten::bmm": "attention_matmul"}


def time_by_op_group(forward, repeats: int) -> dict[str, float]:
    """Self CPU ms per forward, summed by OP_GROUPS (the rest is "other"), under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            forward()
    ms = {"linear": 0.0, "attention_matmul": 0.0, "other": 0.0}
    for event in prof.key_averages():
        ms[OP_GROUPS.get(event.key, "other")] += event.self_cpu_time_total / 1e3 / repeats
    return ms


def verification_forwards(model, ctx: int, rows: list[int], repeats: int) -> tuple[list[dict], list[dict]]:
    """ms of one forward of q tokens over a ctx-token cache, without and with recording; and the
    plain forward's ms by op group."""
    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(0, vocab, (ctx,), generator=torch.Generator().manual_seed(0))
    with sparsespec_attention(model), torch.inference_mode():
        shared = SharedPrefill.run(model, prompt, [], room=max(rows) + 1)
        cache = shared.cache                                  # its own: room for the rows

        def forward(q, hook):
            ids = torch.randint(0, vocab, (1, q))
            positions = torch.arange(ctx, ctx + q).view(1, -1)
            target_logits(model, input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True,
                          attn_hook=hook)
            cache.truncate(ctx)

        recorded = {}
        out, split = [], []
        for q in rows:
            def plain_forward():
                forward(q, ExplicitAttentionHook())
            split.append({"ctx": ctx, "rows": q,
                          **{f"{group}_ms": ms for group, ms in time_by_op_group(plain_forward, repeats).items()}})
            plain = median_ms(plain_forward, repeats)
            recording = median_ms(lambda: forward(q, ExplicitAttentionHook(
                lambda layer, probs: recorded.__setitem__(layer, attention_received(probs)))), repeats)
            out.append({"ctx": ctx, "rows": q, "plain_ms": plain, "recording_ms": recording})
    ar = next(r["plain_ms"] for r in out if r["rows"] == 1)
    for r in out:
        r["plain_in_ar_steps"] = r["plain_ms"] / ar
        r["recording_in_ar_steps"] = r["recording_ms"] / ar
    return out, split


def row_counts(text: str) -> list[int]:
    """--rows: comma-separated tokens per forward, each >= 1, with 1 (the AR step every ratio divides by)."""
    try:
        rows = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,5,9") from None
    if not rows or rows[0] < 1 or 1 not in rows:
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be >= 1 and 1 (the AR step) must be among them")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m", help="an embedded model: smollm2_135m, qwen2.5_coder_0.5b")
    parser.add_argument("--ctx", type=int, default=8000, help="cached tokens the verification attends to")
    parser.add_argument("--rows", type=row_counts, default="1,5,9", help="tokens per forward; 1 is the AR step")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = args.rows
    model, _ = load_model({"name": args.model, "embedded": args.model}, device="cpu")
    linears = linear_layouts(model, rows, args.repeats * 4)
    attention = attention_alone(model, args.ctx, rows, args.repeats * 2)
    forwards, split = verification_forwards(model, args.ctx, rows, args.repeats)
    text = (f"model {args.model}, {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads\n\n"
            f"Linear layers of one decoder layer (ms):\n\n{markdown_table(linears)}\n\n"
            f"Attention alone, every layer (ms):\n\n{markdown_table(attention)}\n\n"
            f"One forward over {args.ctx} cached tokens (ms; in AR steps = / the 1-row forward):\n\n{markdown_table(forwards)}\n\n"
            f"Where one plain forward's time goes (self CPU ms a forward, torch.profiler; linear: aten::mm/addmm, "
            f"attention_matmul: aten::bmm):\n\n{markdown_table(split)}\n")
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "verify_cost.json").write_text(json.dumps({"model": args.model, "ctx": args.ctx,
                                                               "linears": linears, "attention": attention,
                                                               "forwards": forwards, "forward_split": split},
                                                              indent=1))
        (args.out / "verify_cost.md").write_text(text)


if __name__ == "__main__":
    main()
