"""The denominator, old and new, on the same prompts in one process: AR by every attention path,
transformers' generate() (dynamic, and static + compiled), and SparseSpec-L beside them.

    python experiments/fair_ar.py --model smollm2_135m --ctx 8000 --task code --prompts 3 \
        --out docs/runs/fair_ar/smollm2_8k_code
    python experiments/fair_ar.py --model qwen2.5_coder_0.5b --ctx 16000 --task code --prompts 2 \
        --hf-prompts 1 --out docs/runs/fair_ar/qwen_16k_code

Every engine row of a prompt decodes from that prompt's one shared prefill (`sparsespec.prefill`),
through `sparsespec.generate` as a library user calls it, at the process's thread count:

    ar@sdpa           AR stepping through transformers' SDPA (`enable_gqa` on CPU): the old denominator
    ar@packed_sdpa    AR by packed-GQA SDPA (transformers' own q = 1 packing): the new default
    ar@packed_matmul  AR by packed-GQA softmax(q k^T) v
    sparsespec        the method with its defaults, its k = 0 rounds by the fastest AR path of this prompt
    sparsespec k=4    fixed k = 4, likewise

transformers' rows prefill on their own (`--hf-prompts` of the prompts, each a long prefill more):
hf_generate and hf_generate_static (static cache, compiled step; compile time apart, `compile_s`).
The rows' order rotates with the prompt, so no row always runs first. Each prompt's result is one
line of results.jsonl, written when the prompt is done: a run stopped halfway resumes at the next
prompt. fair_ar.md tables decode tokens/s (geometric mean over prompts) and each row's paired
speed-up over the old and the new denominator (geometric mean, 95% t interval on the log scale).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

import sparsespec
from sparsespec.engine.attention import AR_ATTENTION
from sparsespec.errors import ConfigError
from sparsespec.hf_reference import hf_generate
from sparsespec.models import load_model
from sparsespec.stats import geometric_ci
from sparsespec.tables import markdown_table
from sparsespec.tasks import load_prompts

OLD = "ar@sdpa"           # the denominator every committed cell divided by before this benchmark
RESULTS, TABLE = "results.jsonl", "fair_ar.md"
SPECULATIVE = {"sparsespec": ("sparsespec", {}), "sparsespec k=4": ("sparsespec", {"controller": "fixed", "k": 4})}


def engine_rows(model, ids: torch.Tensor, new: int, order: list[str]) -> dict[str, sparsespec.Generation]:
    """Every engine row from one prefill of `ids`, in `order` (AR rows before the speculative ones)."""
    methods = {f"ar@{p}": ("ar", {}) for p in AR_ATTENTION} | SPECULATIVE
    starts = sparsespec.prefill(model, ids, methods=methods, max_new_tokens=new)
    gens = {}
    for label in [r for r in order if r.startswith("ar@")]:
        gens[label] = sparsespec.generate(model, ids, prefilled=starts[label], stop_at_eos=False,
                                          ar_attention=label.removeprefix("ar@"), remember=False)
    fastest = min((r for r in gens), key=lambda r: gens[r].decode_s).removeprefix("ar@")
    for label in [r for r in order if not r.startswith("ar@")]:
        # each prompt's rows on their own, as the committed tables were measured (no call memory)
        gens[label] = sparsespec.generate(model, ids, prefilled=starts[label], stop_at_eos=False, ar_attention=fastest,
                                          remember=False)
    return gens


def row(gen) -> dict:
    return {"tokens_per_s": gen.decode_tokens / gen.decode_s, "decode_s": gen.decode_s, "prefill_s": gen.prefill_s,
            "tokens": gen.tokens, "mean_accepted": gen.mean_accepted, "options": gen.options}


def decode_prompt(model, prompt, index: int, new: int, hf: bool) -> dict:
    ids = torch.as_tensor(prompt.input_ids)
    labels = [f"ar@{p}" for p in AR_ATTENTION] + list(SPECULATIVE)
    shift = index % len(labels)
    order = labels[shift:] + labels[:shift]
    gens = engine_rows(model, ids, new, order)
    if hf:
        for method in ("hf_generate", "hf_generate_static")[::1 if index % 2 == 0 else -1]:
            gens[method] = hf_generate(model, ids, method=method, max_new_tokens=new, stop_at_eos=False)
    reference = gens[OLD].tokens
    rows = {label: row(g) for label, g in gens.items()}
    for label, r in rows.items():
        r["equal_to_ar"] = r.pop("tokens") == reference
    return {"prompt": prompt.id, "index": index, "prompt_tokens": ids.numel(), "order": order, "rows": rows}


def paired(results: list[dict], label: str, over: str):
    """Geometric-mean speed-up of `label` over `over` on the prompts with both, 95% t interval (an `Estimate`)."""
    return geometric_ci(r["rows"][label]["tokens_per_s"] / r["rows"][over]["tokens_per_s"]
                        for r in results if label in r["rows"] and over in r["rows"])


def tokens_per_s(results: list[dict], label: str) -> float:
    """Geometric mean of `label`'s decode tokens/s over the prompts it decoded."""
    return geometric_ci(r["rows"][label]["tokens_per_s"] for r in results if label in r["rows"]).mean


def fastest_ar(results: list[dict]) -> str:
    """The AR path with the highest geometric-mean tokens/s over the prompts: the new denominator."""
    return max((f"ar@{p}" for p in AR_ATTENTION), key=lambda label: tokens_per_s(results, label))


def table(results: list[dict], meta: dict) -> str:
    best = fastest_ar(results)
    labels = list(dict.fromkeys(label for r in results for label in r["rows"]))
    lines = []
    for label in labels:
        have = [r["rows"][label] for r in results if label in r["rows"]]
        cells = {"row": label, "prompts": len(have), "decode tok/s": tokens_per_s(results, label)}
        for name, over in (("/ old AR (ar@sdpa)", OLD), (f"/ fastest AR ({best})", best)):
            e = paired(results, label, over)
            cells[name] = f"{e.mean:.2f}x" + ("" if e.low is None else f" [{e.low:.2f}, {e.high:.2f}]")
        cells["equal to AR"] = f"{sum(h['equal_to_ar'] for h in have)}/{len(have)}"
        compile_s = [h["options"].get("compile_s") for h in have if h["options"].get("compile_s") is not None]
        cells["compile s (untimed)"] = f"{sum(compile_s) / len(compile_s):.0f}" if compile_s else "-"
        lines.append(cells)
    head = (f"{meta['model']}, {meta['task']} at {meta['ctx']} tokens, {meta['new']} new tokens a prompt, greedy; "
            f"{meta['hardware']}, torch {meta['torch']}, {meta['threads']} threads. Engine rows share each prompt's prefill; "
            f"speed-ups are paired per prompt (geometric mean, 95% t interval on the log scale).")
    return head + "\n\n" + markdown_table(lines, formats={"decode tok/s": ".2f"}) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2_135m", help="an embedded model name (conf/model/)")
    p.add_argument("--task", default="code", help="summarization, qa, code or retrieval (embedded texts)")
    p.add_argument("--ctx", type=int, default=8000, help="prompt tokens")
    p.add_argument("--prompts", type=int, default=3, help="prompts decoded (each by every row)")
    p.add_argument("--hf-prompts", type=int, default=None, help="of those, how many transformers' rows decode (default all)")
    p.add_argument("--new", type=int, default=64, help="new tokens a prompt")
    p.add_argument("--out", required=True, help="folder for results.jsonl and fair_ar.md (resumed if it holds them)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in (out / RESULTS).read_text().splitlines()] if (out / RESULTS).exists() else []
    try:
        model, tokenizer = load_model({"name": args.model, "embedded": args.model})
        prompts = load_prompts(args.task, source="embedded", tokenizer=tokenizer, context_tokens=args.ctx,
                               num_prompts=args.prompts)
    except ConfigError as err:
        raise SystemExit(f"fair_ar: {err}")
    meta = {"model": args.model, "task": args.task, "ctx": args.ctx, "new": args.new, "threads": torch.get_num_threads(),
            "hardware": f"{platform.processor() or platform.machine()} ({torch.backends.cpu.get_cpu_capability()})",
            "torch": torch.__version__}
    hf_prompts = args.prompts if args.hf_prompts is None else args.hf_prompts
    for index, prompt in enumerate(prompts):
        if any(r["prompt"] == prompt.id for r in done):
            continue
        start = time.perf_counter()
        result = decode_prompt(model, prompt, index, args.new, hf=index < hf_prompts)
        result["seconds"] = time.perf_counter() - start
        done.append(result)
        with open(out / RESULTS, "a") as f:
            f.write(json.dumps(result) + "\n")
        (out / TABLE).write_text(table(done, meta))
        print(f"prompt {index + 1}/{len(prompts)} done in {result['seconds']:.0f} s", flush=True)
    print((out / TABLE).read_text())


if __name__ == "__main__":
    main()
