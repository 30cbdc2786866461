"""Two ways to make a draft step cheaper, each against the engine's own step, paired in one process.

    python experiments/draft_step_variants.py --shape smollm2_135m --contexts 8000 --out docs/runs/draft_step_variants/smollm2_cpu
    python experiments/draft_step_variants.py --shape tiny --contexts 1000 --blocks 1 --out /tmp/variants   # smoke

The variants (neither is in the engine; this script is their record):
    int8_large   the int8 draft copy quantizes only the Linear layers of >= 2^19 weights; the smaller
                 projections stay fp32 (in a microbenchmark with the weights in cache, fp32 was faster
                 for them: 15 against 40 us for 576 x 192)
    ladder       the draft step written out as a ladder of tensor ops over the draft copy's own modules
                 (F.rms_norm, RoPE, the gathered draft cache, the same attention hook), with none of
                 transformers' module plumbing: what the per-layer Python overhead costs

Rounds are the engine's (`batch_round` via experiments/cost_model.py: random weights, a random KV cache
of `ctx` positions, k = 4, rolled back after every round). The engine's step and each variant run in
alternating blocks of 4 rounds (`--blocks` each), and the table gives each one's median draft step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from cost_model import MAX_NEW_TOKENS, SHAPES, build_model, filled_sequence, time_rounds
from sparsespec.controllers import make_controller
from sparsespec.engine.attention import ATTN_IMPLEMENTATION, sparsespec_attention
from sparsespec.engine.cache import num_decoder_layers
from sparsespec.method_options import resolve
from sparsespec.methods import METHODS
from sparsespec.methods.sparse_kv import GatheredProposer
from sparsespec.tables import markdown_table

K = 4
LARGE = 1 << 19


def int8_large_copy(model):
    """The int8 draft copy with only the Linear layers of >= LARGE weights quantized."""
    import copy

    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    draft = copy.deepcopy(model, memo=shared)
    large = {name: torch.ao.quantization.default_dynamic_qconfig for name, m in draft.named_modules()
             if isinstance(m, torch.nn.Linear) and m.weight.numel() >= LARGE}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(draft, large, dtype=torch.qint8, inplace=True)
    draft.eval()
    draft.set_attn_implementation(ATTN_IMPLEMENTATION)
    return draft


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def ladder_step(proposer: GatheredProposer, tokens, positions):
    """The draft step as tensor ops over a Llama-family model's modules: tokens (B,) -> (B, V) logits."""
    model, core = proposer.model, proposer.model.model
    proposer.cache.query_position = positions.view(-1, 1)
    x = core.embed_tokens(tokens.view(-1, 1))                                 # (B, 1, H)
    cos, sin = core.rotary_emb(x, positions.view(-1, 1))                      # (B, 1, D)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                             # (B, 1, 1, D)
    b = x.shape[0]
    for i, layer in enumerate(core.layers):
        attn, mlp = layer.self_attn, layer.mlp
        h = F.rms_norm(x, (x.shape[-1],), layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        q = attn.q_proj(h).view(b, 1, -1, attn.head_dim).transpose(1, 2)     # (B, H, 1, D)
        k = attn.k_proj(h).view(b, 1, -1, attn.head_dim).transpose(1, 2)     # (B, Hkv, 1, D)
        v = attn.v_proj(h).view(b, 1, -1, attn.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = proposer.cache.layers[i].update(k, v)
        o, _ = proposer.hook(attn, q, k, v, None, attn.scaling)              # (B, 1, H, D)
        x = x + attn.o_proj(o.reshape(b, 1, -1))
        ln = layer.post_attention_layernorm
        h = F.rms_norm(x, (x.shape[-1],), ln.weight, ln.variance_epsilon)
        x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
    x = F.rms_norm(x, (x.shape[-1],), core.norm.weight, core.norm.variance_epsilon)
    return model.lm_head(x)[:, -1]


def draft_ms(model, cache, seq, drafter, blocks: int, variant: str) -> dict:
    """Median ms of a draft step: the engine's and the variant's, in alternating blocks of 4 rounds."""
    engine_copy, engine_step = drafter.step_model, GatheredProposer.step
    times = {"engine": [], variant: []}
    variant_copy = int8_large_copy(model) if variant == "int8_large" else engine_copy
    try:
        for _ in range(blocks):
            for name in times:
                use_variant = name == variant
                drafter.drafting_model = drafter.step_model = variant_copy if use_variant else engine_copy
                GatheredProposer.step = ladder_step if use_variant and variant == "ladder" else engine_step
                rounds = time_rounds(model, cache, seq, drafter, make_controller("fixed", k=K), reps=4, warmup=1)
                times[name] += [r.draft_s / K for r in rounds]
    finally:
        drafter.drafting_model = drafter.step_model = engine_copy
        GatheredProposer.step = engine_step
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2_135m")
    p.add_argument("--contexts", default="8000", help="comma-separated context lengths (tokens)")
    p.add_argument("--blocks", type=int, default=5, help="alternating blocks of 4 rounds per step variant")
    p.add_argument("--out", type=Path, required=True, help="folder for draft_step_variants.json and .md")
    args = p.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    if not contexts or min(contexts) < 64 or args.blocks < 1:
        p.exit(2, f"error: --contexts {args.contexts!r} and --blocks {args.blocks} must be contexts >= 64 and >= 1 block\n")
    args.out.mkdir(parents=True, exist_ok=True)
    from sparsespec.harness.environment import cpu_name

    model = build_model(args.shape, torch.device("cpu"), torch.float32)
    rows = []
    with torch.inference_mode(), sparsespec_attention(model):
        for ctx in contexts:
            cache, seq = filled_sequence(model, ctx, K, torch.device("cpu"), torch.float32, seed=ctx)
            drafter = METHODS["sparsespec"](model, prompt_len=ctx, max_new_tokens=MAX_NEW_TOKENS, max_k=K,
                                            options=resolve("sparsespec", {}).drafter_options)
            drafter.policy.importance = [torch.rand(model.config.num_key_value_heads, seq.state.ids.shape[0])
                                         for _ in range(num_decoder_layers(model))]
            for variant in ("int8_large", "ladder"):
                ms = draft_ms(model, cache, seq, drafter, args.blocks, variant)
                rows.append({"ctx": ctx, "variant": variant, "engine step ms": ms["engine"],
                             "variant step ms": ms[variant], "variant / engine": ms[variant] / ms["engine"]})
                print(rows[-1], flush=True)
    report = {"shape": args.shape, "hardware": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "blocks": args.blocks, "rows": rows}
    (args.out / "draft_step_variants.json").write_text(json.dumps(report, indent=1))
    text = (f"Draft step variants, {args.shape} shape (random weights and KV), fp32 target on {report['hardware']}, "
            f"{report['threads']} threads, k = {K}; medians over {args.blocks} alternating blocks of 4 rounds each.\n\n"
            + markdown_table(rows, formats={"engine step ms": ".2f", "variant step ms": ".2f", "variant / engine": ".3f"}))
    (args.out / "draft_step_variants.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
