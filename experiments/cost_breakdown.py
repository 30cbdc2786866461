"""Where a round's time goes, against this machine's memory-read limit: one round at k = 4, split by phase
(KV selection, draft steps, verification) and an AR step beside it, each split by what runs.

    python experiments/cost_breakdown.py --shape smollm2_135m --contexts 4000,8000 --out docs/runs/cost_breakdown/cpu
    python experiments/cost_breakdown.py --shape smollm2_135m --contexts 8000 --draft-options static_draft=true,compile_draft=true \
        --out docs/runs/cost_breakdown/smollm2_cpu_compiled_draft          # the fixed-shape, compiled draft step
    python experiments/cost_breakdown.py --shape tiny --contexts 2000 --rounds 2 --out /tmp/breakdown   # smoke

Each context is measured in a fresh process (`--same-process` to share one): a context measured after
others inherits the allocator's state they left, and its verification can cost 1.6x more.

The rounds are the engine's own (`batch_round`, via experiments/cost_model.py: random weights, a random
KV cache of `ctx` positions, rolled back after every round), profiled by torch.profiler. The loop's
stopwatches mark the phases (`round.select`, `round.draft`, `round.verify`), and each operator's own
time goes to the phase it ran in and to one kind:

    linear     the layers' weight products (aten::mm/addmm, quantized::linear_dynamic), the fp32 LM head apart
               (the int8 draft copy's head is a quantized::linear_dynamic too, and counted here)
    LM head    a weight product with the vocabulary as one of its dimensions
    attention  scaled-dot-product attention, the explicit attention's bmm/softmax/masking
    other ops  every other operator (norms, RoPE, gathers, copies, top-K, ...)
    outside    the phase's wall time not spent in any operator: Python, dispatch, hooks

The read limit is the bytes a step must read (its weights as stored: fp32, or int8 for the draft
copy; the K/V it attends to) over the bandwidth measured here (a large sum, same threads), so
"x limit" says how far a step is from what this machine's memory allows. Profiling adds a little
per operator; the table gives the unprofiled phase times of the same rounds beside it.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from cost_model import MAX_NEW_TOKENS, SHAPES, build_model, filled_sequence, time_rounds
from sparsespec.controllers import make_controller
from sparsespec.engine.attention import sparsespec_attention
from sparsespec.engine.cache import num_decoder_layers
from sparsespec.engine.timing import PHASES
from sparsespec.errors import ConfigError
from sparsespec.method_options import resolve
from sparsespec.methods import METHODS
from sparsespec.tables import markdown_table

K = 4                      # the round the issue asks about: k = 4
KINDS = ("linear", "LM head", "attention", "other ops", "outside")
LINEAR_OPS = {"aten::mm", "aten::addmm", "quantized::linear_dynamic"}
ATTENTION_OPS = {"aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::masked_fill_", "aten::masked_fill",
                 "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
                 "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention"}


def read_bandwidth_gbs(mib: int = 512, reps: int = 5) -> float:
    """GB/s of reading a `mib` MiB float32 tensor (its sum), the best of `reps`."""
    x = torch.ones(mib * 2 ** 18)
    x.sum()
    best = min(timed(x.sum) for _ in range(reps))
    return x.numel() * 4 / best / 1e9


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def kind_of(event, vocab: int) -> str:
    if event.name in LINEAR_OPS:
        shapes = [s for s in (event.input_shapes or []) if s]
        return "LM head" if any(vocab in s for s in shapes) else "linear"
    return "attention" if event.name in ATTENTION_OPS else "other ops"


def phase_of(event) -> str | None:
    """The loop phase an operator ran in (its nearest `round.*` range), None outside a round."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("round."):
            return parent.name.split(".", 1)[1]
        parent = parent.cpu_parent
    return None


def breakdown(prof, vocab: int, rounds: int) -> dict:
    """phase -> kind -> ms per round (the phase's wall time split; `outside`: not in any operator)."""
    split = defaultdict(lambda: defaultdict(float))
    wall = defaultdict(float)
    for event in prof.events():
        if event.name.startswith("round."):
            wall[event.name.split(".", 1)[1]] += event.cpu_time_total / 1e3
            continue
        if event.cpu_parent is not None and not event.cpu_parent.name.startswith("round."):
            continue            # a nested operator: its time is in its top-level operator's total
        phase = phase_of(event)
        if phase is not None:
            split[phase][kind_of_tree(event, vocab)] += event.cpu_time_total / 1e3
    out = {}
    for phase in PHASES:
        kinds = {k: split[phase][k] / rounds for k in KINDS[:-1]}
        kinds["outside"] = max(0.0, wall[phase] / rounds - sum(kinds.values()))
        out[phase] = {"wall_ms": wall[phase] / rounds, **kinds}
    return out


def kind_of_tree(event, vocab: int) -> str:
    """The kind of a top-level operator: its own, or that of the first linear/attention op inside it
    (aten::linear -> aten::mm, aten::matmul -> aten::bmm, ...)."""
    stack = [event]
    while stack:
        e = stack.pop()
        kind = kind_of(e, vocab)
        if kind != "other ops":
            return kind
        stack.extend(e.cpu_children)
    return "other ops"


def bytes_read(model, draft_model, ctx: int, draft_positions: int) -> dict:
    """Bytes one step must read: every weight as stored (the embedding row aside) and the K/V it attends to."""
    config = model.config
    layers, hkv = num_decoder_layers(model), config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    kv_per_position = layers * hkv * head_dim * 2 * 4                         # K and V, fp32

    def weight_bytes(m) -> int:
        embedding = m.get_input_embeddings().weight
        total = sum(p.numel() * p.element_size() for p in m.parameters() if p is not embedding)
        packed = sum(mod.weight().numel() for mod in m.modules()
                     if isinstance(mod, torch.ao.nn.quantized.dynamic.Linear))  # int8 linears: 1 byte a weight
        tied_head = m.get_output_embeddings()
        if getattr(tied_head, "weight", None) is embedding:                    # a tied fp32 head is read too
            total += embedding.numel() * embedding.element_size()
        return total + packed

    target = weight_bytes(model)
    return {"ar_step": target + ctx * kv_per_position, "verify": target + ctx * kv_per_position,
            "draft_step": weight_bytes(draft_model) + draft_positions * kv_per_position}


def parse_options(text: str) -> dict:
    """`static_draft=true,compile_draft=true` -> {"static_draft": True, ...} (YAML scalars)."""
    import yaml

    pairs = [item.partition("=") for item in text.split(",") if item]
    bad = [key for key, eq, _ in pairs if not eq or not key]
    if bad:
        raise ValueError(f"{text!r}: each option is name=value")
    return {key: yaml.safe_load(value) for key, _, value in pairs}


def measure(model, ctx: int, rounds: int, budget: float, bandwidth: float, seed: int, draft_options: dict) -> dict:
    config = model.config
    cache, seq = filled_sequence(model, ctx, K, torch.device("cpu"), torch.float32, seed)
    ar = METHODS["ar"](model, prompt_len=ctx, max_new_tokens=MAX_NEW_TOKENS, max_k=1,
                       options=resolve("ar", {}).drafter_options)
    drafter = METHODS["sparsespec"](model, prompt_len=ctx, max_new_tokens=MAX_NEW_TOKENS, max_k=K,
                                    options=resolve("sparsespec", {"budget": budget, **draft_options}).drafter_options)
    drafter.policy.importance = [torch.rand(config.num_key_value_heads, seq.state.ids.shape[0])
                                 for _ in range(num_decoder_layers(model))]
    plain = {}
    for name, d, controller in (("ar", ar, lambda: make_controller("fixed")), ("k4", drafter, lambda: make_controller("fixed", k=K))):
        time_rounds(model, cache, seq, d, controller(), reps=0, warmup=2)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):   # the profiler's own start-up, untimed
            time_rounds(model, cache, seq, d, controller(), reps=0, warmup=1)
        unprofiled = time_rounds(model, cache, seq, d, controller(), reps=rounds, warmup=0)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            time_rounds(model, cache, seq, d, controller(), reps=rounds, warmup=0)
        plain[name] = {"profiled": breakdown(prof, config.vocab_size, rounds),
                       "unprofiled_ms": {p: 1e3 * sum(getattr(r, f"{p}_s") for r in unprofiled) / rounds for p in PHASES}}
    reads = bytes_read(model, drafter.drafting_model, ctx, drafter.budget.total + K)
    limit = {step: b / (bandwidth * 1e9) * 1e3 for step, b in reads.items()}
    return {"ctx": ctx, "draft_positions": drafter.budget.total, "draft_weights": drafter.resolved_options.get("draft_weights"),
            "phases": plain, "bytes_read": reads, "read_limit_ms": limit}


def rows_of(result: dict) -> list[dict]:
    """One row per step: the AR step, the k = 4 round's selection, one draft step, the verification."""
    ar, k4 = result["phases"]["ar"], result["phases"]["k4"]
    steps = [("AR step", ar["profiled"]["verify"], ar["unprofiled_ms"]["verify"], result["read_limit_ms"]["ar_step"]),
             ("select (a round)", k4["profiled"]["select"], k4["unprofiled_ms"]["select"], None),
             (f"draft step (of {K})", {k: v / K for k, v in k4["profiled"]["draft"].items()},
              k4["unprofiled_ms"]["draft"] / K, result["read_limit_ms"]["draft_step"]),
             (f"verify {K + 1} rows", k4["profiled"]["verify"], k4["unprofiled_ms"]["verify"], result["read_limit_ms"]["verify"])]
    ar_ms = ar["unprofiled_ms"]["verify"]
    return [{"ctx": result["ctx"], "step": step, "ms": ms, "x C_AR": ms / ar_ms,
             **{f"{kind} ms": split[kind] for kind in KINDS}, "profiled ms": split["wall_ms"],
             "read limit ms": limit, "x limit": ms / limit if limit else None}
            for step, split, ms, limit in steps]


def markdown(report: dict) -> str:
    rows = [row for result in report["results"] for row in rows_of(result)]
    formats = {c: ".2f" for c in (rows[0] if rows else {}) if c not in ("ctx", "step")}
    round_ms = {r["ctx"]: sum(r2["ms"] * (K if r2["step"].startswith("draft") else 1)
                              for r2 in rows if r2["ctx"] == r["ctx"] and r2["step"] != "AR step") for r in rows}
    ar_ms = {r["ctx"]: r["ms"] for r in rows if r["step"] == "AR step"}
    summary = "; ".join(f"ctx {c}: a k = {K} round costs {round_ms[c]:.1f} ms = {round_ms[c] / ar_ms[c]:.2f} AR steps"
                        for c in round_ms)
    return (f"Cost breakdown, {report['shape']} shape (random weights and KV), fp32 on {report['hardware']}, "
            f"{report['threads']} threads; draft options {report['draft_options'] or 'default'}; {report['rounds']} rounds each; read bandwidth {report['bandwidth_gbs']:.1f} GB/s "
            f"(a {report['bandwidth_mib']} MiB sum). `ms`: unprofiled; the kinds split the profiled time.\n\n"
            + markdown_table(rows, formats=formats) + f"\n\n{summary}.")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2_135m")
    p.add_argument("--contexts", default="4000,8000", help="comma-separated context lengths (tokens)")
    p.add_argument("--rounds", type=int, default=8, help="rounds per measurement, profiled and unprofiled each")
    p.add_argument("--budget", type=float, default=0.1, help="draft KV budget, fraction of the context")
    p.add_argument("--draft-options", default="", help="sparsespec drafter options, name=value,... (e.g. "
                   "static_draft=true,compile_draft=true)")
    p.add_argument("--out", type=Path, required=True, help="folder for cost_breakdown.json and cost_breakdown.md")
    p.add_argument("--same-process", action="store_true",
                   help="measure every context in this process (default: each in a fresh one; a context measured "
                        "after others inherits their allocator state: a 16K verification ran 346 ms after 4K and 8K, "
                        "217 ms alone)")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help=argparse.SUPPRESS)   # the parent's, to its children
    args = p.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    if not contexts or min(contexts) < 64 or args.rounds < 1:
        p.exit(2, f"error: --contexts {args.contexts!r} and --rounds {args.rounds} must be contexts >= 64 and >= 1 round\n")
    try:
        draft_options = parse_options(args.draft_options)
        resolve("sparsespec", draft_options)
    except (ValueError, ConfigError) as err:      # a bad option: one line
        p.exit(2, f"error: --draft-options: {err}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    from sparsespec.harness.environment import cpu_name

    torch.set_flush_denormal(True)
    mib = 512
    report = {"shape": args.shape, "hardware": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "rounds": args.rounds, "budget": args.budget, "k": K, "draft_options": draft_options, "bandwidth_mib": mib,
              "bandwidth_gbs": args.bandwidth_gbs or read_bandwidth_gbs(mib), "fresh_process_per_context": not args.same_process,
              "results": []}
    if args.same_process or len(contexts) == 1:
        model = build_model(args.shape, torch.device("cpu"), torch.float32)
        with torch.inference_mode(), sparsespec_attention(model):
            for ctx in contexts:
                report["results"].append(measure(model, ctx, args.rounds, args.budget, report["bandwidth_gbs"], seed=ctx,
                                                  draft_options=draft_options))
                write(report, args.out)
                print(f"ctx {ctx} done", flush=True)
    else:
        for ctx in contexts:
            report["results"].append(measure_in_child(args, ctx, report["bandwidth_gbs"]))
            write(report, args.out)
            print(f"ctx {ctx} done", flush=True)
    print(markdown(report))


def write(report: dict, out: Path) -> None:
    (out / "cost_breakdown.json").write_text(json.dumps(report, indent=1))
    (out / "cost_breakdown.md").write_text(markdown(report) + "\n")


def measure_in_child(args, ctx: int, bandwidth_gbs: float) -> dict:
    """One context measured by this script in a fresh process (its result, read back from its folder)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, __file__, "--shape", args.shape, "--contexts", str(ctx), "--rounds", str(args.rounds),
                   "--budget", str(args.budget), "--draft-options", args.draft_options, "--out", tmp,
                   "--bandwidth-gbs", str(bandwidth_gbs)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return json.loads((Path(tmp) / "cost_breakdown.json").read_text())["results"][0]


if __name__ == "__main__":
    main()
