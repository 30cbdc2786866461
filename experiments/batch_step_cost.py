"""Where a batched step's time goes on this CPU (the figures docs/benchmark.md quotes for batched AR):

1. the LM head alone, Qwen2.5-Coder-0.5B's shape (151936 x 896, fp32, random weights): the broadcast
   (V, D) @ (B, D, q) product against the rows folded into one (D, B*q) matrix (sparsespec/engine/logits.py);
2. one AR step of the real model at a 2K context, alone and batched (B = 2, 4), and a torch.profiler
   table of 8 steps at B = 2 and alone (each from its own `sparsespec.prefill`).

    python experiments/batch_step_cost.py --out docs/runs/batch_step_cost_qwen
"""
from __future__ import annotations

import argparse
import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path

import torch
import yaml

import sparsespec
from sparsespec.models import load_model

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"


def mean_ms(f, n: int = 6) -> float:
    f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e3


def head_products() -> list[dict]:
    torch.manual_seed(0)
    weight = torch.randn(151936, 896) * 0.02
    out = []
    for b in (1, 2, 4, 8):
        for q in (1, 5):
            h = torch.randn(b, q, 896)
            out.append({"B": b, "rows": q,
                        "broadcast_ms": mean_ms(lambda: torch.matmul(weight, h.transpose(1, 2))),
                        "folded_ms": mean_ms(lambda: torch.matmul(weight, h.reshape(b * q, 896).T))})
    return out


def ar_steps(model, ctx: int) -> tuple[list[dict], str]:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 20000, (ctx,), generator=g) for _ in range(4)]
    out = []
    for _ in range(2):
        row = {}
        for name, inputs in (("alone", prompts[0]), ("B2", prompts[:2]), ("B4", prompts)):
            gen = sparsespec.generate(model, inputs, method="ar", max_new_tokens=24, stop_at_eos=False,
                                      remember=False)      # each repetition measured on its own
            row[f"{name}_step_ms"] = gen.decode_s / 23 * 1e3
        out.append(row)
    from torch.profiler import ProfilerActivity, profile
    tables = []
    for name, inputs in (("B = 2", prompts[:2]), ("alone", prompts[:1])):
        starts = [sparsespec.prefill(model, p, methods={"a": ("ar", {})}, max_new_tokens=9) for p in inputs]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if len(inputs) > 1:
                sparsespec.generate(model, inputs, prefilled=[s["a"] for s in starts], stop_at_eos=False)
            else:
                sparsespec.generate(model, inputs[0], prefilled=starts[0]["a"], stop_at_eos=False)
        tables.append(f"8 AR steps, {name}:\n{prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=6)}")
    return out, "\n".join(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    heads = head_products()
    model = load_model(yaml.safe_load((CONF / "qwen2.5_coder_0.5b.yaml").read_text()), dtype="float32", device="cpu")
    model = model[0] if isinstance(model, tuple) else model
    with redirect_stdout(io.StringIO()):
        steps, tables = ar_steps(model, args.ctx)
    text = (f"torch {torch.__version__}, {torch.get_num_threads()} threads\n\nLM head (ms):\n{json.dumps(heads, indent=1)}\n\n"
            f"AR step at {args.ctx} tokens (ms, two passes):\n{json.dumps(steps, indent=1)}\n\n{tables}\n")
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "batch_step_cost.json").write_text(json.dumps({"head": heads, "ar_steps": steps}, indent=1))
        (args.out / "batch_step_cost.md").write_text(text)


if __name__ == "__main__":
    main()
