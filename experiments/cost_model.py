"""Timing-only cost model: C_AR, C_d and C_v(k) of a model *shape*, with random weights and a random KV cache.

    python experiments/cost_model.py --device cuda --shape llama3_8b --contexts 16000,32000,60000
    python experiments/cost_model.py --device cpu --shape tiny --contexts 2000,4000      # smoke test

No weights, no hub, no prefill: the model is built from a config (random init), and the full KV
cache is filled with random K/V of the right shape at the given context. Every cost is then timed
on the engine's own code path (`sparsespec.engine.loop.batch_round`, the same round the benchmark runs,
with the engine's `Stopwatch`, which synchronises the GPU):

- C_AR: one AR round = one decode step (1 token) over the full cache, greedy pick included, timed
  for each way an AR step can attend (`sparsespec.engine.attention.AR_ATTENTION`); C_AR is the fastest;
- C_d: one sparse draft step (the `sparsespec` drafter, budget 10% of the context) over the
  gathered draft cache of M + up to k positions, per step of a k-step round;
- C_v(k): one verification of k+1 tokens over the full cache, recording attention (sparsespec's verification observer);
- select: the per-round top-K selection and gather that fills the draft cache.

Each is defined once, in `sparsespec.stats` (the harness's summaries use the same functions), over
`--reps` rounds after two warm-up rounds; the cache is rolled back to the context after every round,
so all rounds run at the same length. Random weights make acceptance meaningless, so tau (tokens per
round, the bonus token included) is *assumed*: tau = a*k + 1 with a in {0.6, 0.8}, and the
cost-model bound is `stats.cost_bound`: tau * C_AR / (k * C_d + C_v(k)) (`+sel` adds the select cost
to the denominator). Beside them, at `--hf-contexts`, transformers' own generate() per decode step:
dynamic cache, and static cache with a compiled step (`hf_generate_static`; compile seconds apart).
Writes cost_model.json and cost_model.md into --out after each context, so a
run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from sparsespec import stats
from sparsespec.engine.attention import AR_ATTENTION, DEFAULT_AR_ATTENTION, sparsespec_attention
from sparsespec.engine.loop import Sequence, batch_round
from sparsespec.engine.batch_cache import BatchCache
from sparsespec.engine.cache import num_decoder_layers
from sparsespec.controllers import make_controller
from sparsespec.method_options import resolve
from sparsespec.methods import METHODS
from sparsespec.engine.sampling import Sampler
from sparsespec.engine.selection import sliding_window_of
from sparsespec.tables import markdown_table
from sparsespec.engine.timing import synchronize

SHAPES = {
    # Meta-Llama-3-8B: GQA 32/8 heads, head dim 128, rope theta 5e5; positions up to 128K (Llama 3.1)
    "llama3_8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=131072),
    # SmolLM2-135M (the embedded CPU model): GQA 9/3 heads, head dim 64, tied embeddings
    "smollm2_135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True),
    # a few-layer stand-in with the same GQA ratio, to check the script on a CPU
    "tiny": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                 intermediate_size=1408, vocab_size=32000, rope_theta=500000.0, max_position_embeddings=131072),
}
ASSUMED_ACCEPTANCE = (0.6, 0.8)    # accepted drafts per drafted token; tau = a*k + 1 (timing-only: no real acceptance)
MAX_NEW_TOKENS = 128               # only sizes the drafter's buffers, as in the benchmark


def build_model(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    params = dict(SHAPES[shape])
    theta = params.pop("rope_theta")
    config = LlamaConfig(**params, rope_parameters={"rope_type": "default", "rope_theta": theta},
                         attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):          # allocate and initialise straight on the device
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def filled_sequence(model, ctx: int, max_k: int, device: torch.device, dtype: torch.dtype, seed: int):
    """(a batch cache of one row holding `ctx` positions of random K/V (no prefill), its `Sequence`)."""
    config = model.config
    hkv, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    capacity = ctx + MAX_NEW_TOKENS + max_k + 2          # as the loop sizes it
    cache = BatchCache(num_decoder_layers(model), capacity, [ctx], device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for layer in cache.layers:
        layer.keys = torch.randn(1, hkv, capacity, head_dim, device=device, dtype=dtype, generator=gen)
        layer.values = torch.randn(1, hkv, capacity, head_dim, device=device, dtype=dtype, generator=gen)
        layer.is_initialized = True
    ids = torch.randint(config.vocab_size, (ctx,), device=device, generator=gen)
    return cache, Sequence(0, ids, None, Sampler(), capacity, MAX_NEW_TOKENS, model, cache)


def time_rounds(model, cache, seq, drafter, controller, reps: int, warmup: int = 2,
                ar_attention: str = DEFAULT_AR_ATTENTION) -> list:
    """`reps` timed rounds of the loop (after `warmup`), each from the same cache length."""
    windows = [sliding_window_of(model, i) for i in range(num_decoder_layers(model))]
    seq.drafter, proposer = drafter, drafter.batch_proposer(windows)
    ctx, rounds = seq.state.length, []
    for i in range(warmup + reps):
        batch_round(model, cache, [seq], proposer, controller, seq.state.sampler, windows, ar_attention)
        seq.state.length = ctx                            # roll back: every round at the same context
        cache.set_lengths([ctx])
        seq.tokens.clear()
        if i >= warmup:
            rounds.append(seq.rounds[-1])
    return rounds


def measure_context(model, ctx: int, ks: list[int], reps: int, budget: float, device, dtype, seed: int,
                    warmup_s: float = 0.0) -> dict:
    cache, seq = filled_sequence(model, ctx, max(ks), device, dtype, seed)
    config = model.config
    ar = METHODS["ar"](model, prompt_len=ctx, max_new_tokens=MAX_NEW_TOKENS, max_k=1,
                       options=resolve("ar", {}).drafter_options)
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:     # clocks up, kernels chosen: the first path timed is not penalised
        for path in AR_ATTENTION:
            time_rounds(model, cache, seq, ar, make_controller("fixed"), reps=0, warmup=1, ar_attention=path)
    c_ar_by_path = {}
    for path in AR_ATTENTION:                                # an AR round is one decode step
        totals = stats.round_totals(time_rounds(model, cache, seq, ar, make_controller("fixed"), reps=2 * reps,
                                                ar_attention=path))
        c_ar_by_path[path] = stats.c_ar(totals.verify_s, totals.emitted)
    ar_path = min(c_ar_by_path, key=c_ar_by_path.get)
    c_ar = c_ar_by_path[ar_path]
    rows, draft_m = [], None
    drafter_cls = METHODS["sparsespec"]
    for k in ks:
        drafter = drafter_cls(model, prompt_len=ctx, max_new_tokens=MAX_NEW_TOKENS, max_k=k,
                              options=resolve("sparsespec", {"budget": budget}).drafter_options)
        # stand-in for the prefill observation window: random scores pick the first round's top-K;
        # from the first verification on, the recorded attention replaces them (the real path)
        drafter.policy.importance = [torch.rand(config.num_key_value_heads, seq.state.ids.shape[0], device=device)
                          for _ in range(num_decoder_layers(model))]
        rounds = time_rounds(model, cache, seq, drafter, make_controller("fixed", k=k), reps=reps)
        assert all(r.drafted == k and r.draft_steps == k for r in rounds), "a round drafted fewer than k tokens"
        totals = stats.round_totals(rounds)
        c_d = stats.c_draft(totals)
        c_v = stats.c_verify_by_k(rounds)[k]
        sel = totals.select_s / totals.rounds
        row = {"k": k, "c_d_s": c_d, "c_v_s": c_v, "select_s": sel, "c_d_over_c_ar": c_d / c_ar,
               "c_v_over_c_ar": c_v / c_ar, "bounds": {}}
        for a in ASSUMED_ACCEPTANCE:
            tau = a * k + 1
            row["bounds"][f"{a}"] = {"tau": tau, "bound": stats.cost_bound(tau, k, c_ar, c_d, c_v),
                                     "bound_with_select": stats.cost_bound(tau, k, c_ar, c_d, c_v, select_s=sel)}
        rows.append(row)
        draft_m = drafter.budget.total
        del drafter
    del cache, seq
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"ctx": ctx, "draft_budget_tokens": draft_m, "c_ar_s": c_ar, "ar_attention": ar_path,
            "c_ar_s_by_attention": c_ar_by_path, "reps": reps, "rows": rows}


HF_NEW_TOKENS = 32      # transformers' rows: enough steps for a stable per-step mean


def time_hf_rows(model, ctx: int, device) -> list[dict]:
    """transformers' generate() on `ctx` random ids: seconds per decode step, dynamic and static+compiled."""
    from sparsespec.hf_reference import hf_generate

    ids = torch.randint(model.config.vocab_size, (ctx,), device=device, generator=torch.Generator(device).manual_seed(ctx))
    rows = []
    for method in ("hf_generate", "hf_generate_static"):
        gen = hf_generate(model, ids, method=method, max_new_tokens=HF_NEW_TOKENS, stop_at_eos=False)
        rows.append({"ctx": ctx, "method": method, "step_s": gen.decode_s / max(1, len(gen.rounds)),
                     "compile_s": gen.options.get("compile_s")})
        print(f"ctx {ctx} {method}: {rows[-1]['step_s'] * 1e3:.2f} ms a step", flush=True)
    return rows


def markdown(report: dict) -> str:
    a_lo, a_hi = ASSUMED_ACCEPTANCE
    intro = (f"Cost model, timing only: {report['shape']} shape, random weights, random KV cache; "
             f"{report['dtype']} on {report['hardware']}. Means of {report['reps']} rounds (sparsespec.stats). "
             f"tau is ASSUMED (no real acceptance): tau = a*k + 1 tokens per round, a in {{{a_lo}, {a_hi}}}; "
             f"bound = tau*C_AR / (k*C_d + C_v(k)); '+sel' adds the select+gather cost per round.")
    rows = [{"ctx": res["ctx"], "draft M": res["draft_budget_tokens"], "k": r["k"], "C_AR ms": res["c_ar_s"] * 1e3,
             "C_d ms": r["c_d_s"] * 1e3, "C_d/C_AR": r["c_d_over_c_ar"], "C_v(k) ms": r["c_v_s"] * 1e3,
             "C_v/C_AR": r["c_v_over_c_ar"], "select ms": r["select_s"] * 1e3,
             f"bound a={a_lo}": r["bounds"][str(a_lo)]["bound"], f"bound a={a_hi}": r["bounds"][str(a_hi)]["bound"],
             f"bound a={a_hi} +sel": r["bounds"][str(a_hi)]["bound_with_select"]}
            for res in report["results"] for r in res["rows"]]
    formats = {column: ".2f" for column in (rows[0] if rows else {}) if column not in ("ctx", "draft M", "k")}
    paths = [{"ctx": res["ctx"], **{f"C_AR ms, {p}": s * 1e3 for p, s in res["c_ar_s_by_attention"].items()},
              "fastest": res["ar_attention"]} for res in report["results"]]
    ar_table = ("\n\nC_AR by the way the AR step attends (C_AR above is the fastest):\n\n"
                + markdown_table(paths, formats={c: ".2f" for c in (paths[0] if paths else {}) if c.startswith("C_AR")})
                if paths else "")
    hf = [{"ctx": h["ctx"], "row": h["method"], "step ms": h["step_s"] * 1e3, "compile s": h.get("compile_s")}
          for h in report.get("hf", [])]
    hf_table = ("\n\ntransformers' generate() per decode step (random ids, greedy, "
                f"{HF_NEW_TOKENS} new tokens):\n\n" + markdown_table(hf, formats={"step ms": ".2f", "compile s": ".1f"})
                if hf else "")
    skipped = "".join(f"\nSkipped ctx {s['ctx']}: {s['why']}" for s in report["skipped"])
    return (intro + "\n\n" + (markdown_table(rows, formats=formats) if rows else "(no context measured)")
            + ar_table + hf_table + skipped)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3_8b")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--contexts", default="16000,32000,60000", help="comma-separated context lengths (tokens)")
    p.add_argument("--ks", default="4,8,16", help="draft lengths k for C_v(k)")
    p.add_argument("--budget", type=float, default=0.1, help="draft KV budget, fraction of the context")
    p.add_argument("--reps", type=int, default=10, help="timed rounds per measurement (AR gets twice as many)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="skip a context whose estimated time would end past this many seconds from start")
    p.add_argument("--warmup-s", type=float, default=3.0,
                   help="seconds of untimed AR rounds (every path) before the first context is timed")
    p.add_argument("--hf-contexts", default=None,
                   help="contexts at which to time transformers' generate() rows (default: the first context; '' for none)")
    p.add_argument("--out", default=".", help="folder for cost_model.json and cost_model.md")
    args = p.parse_args(argv)

    start = time.perf_counter()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if device.type == "cpu":
        torch.set_flush_denormal(True)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    ks = sorted(int(k) for k in args.ks.split(",") if k)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import transformers

    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"shape": args.shape, "config": SHAPES[args.shape], "device": str(device), "dtype": str(dtype).split(".")[-1],
              "hardware": hardware, "torch": torch.__version__, "transformers": transformers.__version__,
              "ks": ks, "budget": args.budget, "reps": args.reps, "assumed_acceptance": list(ASSUMED_ACCEPTANCE),
              "tau_definition": "assumed: a*k + 1 tokens per round (a accepted drafts per drafted token, plus the "
                                "target's own token); not measured", "results": [], "skipped": []}
    t0 = time.perf_counter()
    model = build_model(args.shape, device, dtype)
    synchronize(device)
    report["build_s"] = time.perf_counter() - t0
    print(f"built {args.shape} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, {report['dtype']}) "
          f"on {hardware} in {report['build_s']:.1f} s", flush=True)

    last = None        # (ctx, seconds) of the previous context, to estimate the next one
    with torch.inference_mode(), sparsespec_attention(model):
        for ctx in contexts:
            if args.deadline_s is not None and last is not None:
                estimate = last[1] * ctx / last[0] * 1.5
                if time.perf_counter() - start + estimate > args.deadline_s:
                    why = f"estimated {estimate:.0f} s would pass the {args.deadline_s:.0f} s deadline"
                    report["skipped"].append({"ctx": ctx, "why": why})
                    print(f"skip ctx {ctx}: {why}", flush=True)
                    continue
            t0 = time.perf_counter()
            try:
                res = measure_context(model, ctx, ks, args.reps, args.budget, device, dtype, seed=ctx,
                                      warmup_s=args.warmup_s if not report["results"] else 0.0)
            except torch.OutOfMemoryError as err:
                report["skipped"].append({"ctx": ctx, "why": f"out of memory: {str(err).splitlines()[0]}"})
                torch.cuda.empty_cache()
                continue
            res["seconds"] = time.perf_counter() - t0
            last = (ctx, res["seconds"])
            report["results"].append(res)
            report["total_s"] = time.perf_counter() - start
            (out / "cost_model.json").write_text(json.dumps(report, indent=1))
            (out / "cost_model.md").write_text(markdown(report) + "\n")
            print(f"ctx {ctx}: measured in {res['seconds']:.1f} s", flush=True)
    hf_contexts = contexts[:1] if args.hf_contexts is None else [int(c) for c in args.hf_contexts.split(",") if c]
    report["hf"] = []
    for ctx in hf_contexts:
        if args.deadline_s is not None and time.perf_counter() - start > 0.6 * args.deadline_s:
            report["skipped"].append({"ctx": ctx, "why": "transformers' rows skipped: past 60% of the deadline"})
            continue
        report["hf"] += time_hf_rows(model, ctx, device)
        report["total_s"] = time.perf_counter() - start
        (out / "cost_model.json").write_text(json.dumps(report, indent=1))
        (out / "cost_model.md").write_text(markdown(report) + "\n")
    report["total_s"] = time.perf_counter() - start
    (out / "cost_model.json").write_text(json.dumps(report, indent=1))
    (out / "cost_model.md").write_text(markdown(report) + "\n")
    print(markdown(report))
    print(f"\nwrote {out / 'cost_model.md'} and cost_model.json ({report['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
