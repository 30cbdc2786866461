"""Side-by-side benchmark: AR and every method back to back, in one process, on the same prompts.

    python experiments/benchmark.py experiment=bench_cpu          # embedded models on this CPU
    python experiments/benchmark.py experiment=bench_cpu bench.grid='[{model: smollm2_135m, ctx: [2000]}]'

For each (model, context) it writes, per method: decode tokens/s and speed-up vs AR (pooled over
prompts), mean accepted length, the measured costs C_AR (one AR step), C_d (one draft step),
C_v(k) (one verification of k drafts) and the select+gather cost per round, and the cost-model
bound tau * C_AR / (k * C_d + C_v(k)) with tau the mean accepted length and k the mean draft
length, with the fraction of it reached. Prefill is reported on its own. Other processes' CPU use
is sampled before and after each context, and the context is flagged "noisy" when it was high.
Results: bench.json, bench.md and bench_speedup.png/.pdf in the Hydra output folder.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import hydra
from hydra import compose
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sparsespec  # noqa: E402
from sparsespec.errors import ConfigError  # noqa: E402
from sparsespec.harness.checks import method_options, model_spec  # noqa: E402
from sparsespec.harness.environment import collect  # noqa: E402
from sparsespec.models import load_model  # noqa: E402
from sparsespec.tasks import load_prompts  # noqa: E402

NOISY_BUSY = 0.15  # share of all cores busy while this process idles: someone else is computing


def busy_fraction(seconds: float = 2.0) -> float | None:
    """Share of CPU time spent busy machine-wide over `seconds` while this process sleeps, from
    /proc/stat (the 1-minute load average would count this benchmark's own previous context)."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)        # idle + iowait, total
    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except OSError:
        return None
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def sample_load() -> dict:
    busy = busy_fraction()
    noisy = busy > NOISY_BUSY if busy is not None else os.getloadavg()[0] > 0.5
    return {"busy": busy, "noisy": noisy}


def method_setups(names: list[str]) -> dict[str, tuple[str, dict]]:
    """label -> (engine method, options), read from conf/method/<name>.yaml. An entry may override
    options after a colon: "sparsespec_fixed:k=8,recent=128"."""
    out = {}
    for label in names:
        name, _, extra = label.partition(":")
        overrides = [f"method.options.{kv}" for kv in extra.split(",") if kv]
        cfg = compose(config_name="config", overrides=[f"method={name}", *overrides])
        out[label] = (cfg.method.name, method_options(cfg))
    return out


def cost_row(label: str, gens: list, ar_gens: list) -> dict:
    """Pooled speed, the measured costs and the cost-model bound for one method."""
    tokens = sum(g.decode_tokens for g in gens)
    decode_s = sum(g.decode_s for g in gens)
    ar_tps = sum(g.decode_tokens for g in ar_gens) / sum(g.decode_s for g in ar_gens)
    c_ar = sum(g.decode_s for g in ar_gens) / sum(len(g.rounds) for g in ar_gens)
    rounds = [r for g in gens for r in g.rounds]
    steps = sum(r.draft_steps for r in rounds)
    row = {"method": label, "tokens_per_s": tokens / decode_s, "speedup_vs_ar": (tokens / decode_s) / ar_tps,
           "mean_accepted": tokens / len(rounds), "acceptance_rate": statistics.fmean(g.acceptance_rate for g in gens),
           "outputs_match_ar": all(g.tokens == a.tokens for g, a in zip(gens, ar_gens)),
           "prefill_s": statistics.fmean(g.prefill_s for g in gens), "c_ar_s": c_ar,
           "c_draft_s": sum(r.draft_s for r in rounds) / steps if steps else None,
           "select_s_per_round": sum(r.select_s for r in rounds) / len(rounds),
           "mean_k": statistics.fmean(r.drafted for r in rounds)}
    by_k: dict[int, list[float]] = {}
    for r in rounds:
        by_k.setdefault(r.drafted, []).append(r.verify_s)
    row["c_verify_s_by_k"] = {k: statistics.fmean(v) for k, v in sorted(by_k.items())}
    if row["c_draft_s"] is not None:
        k = row["mean_k"]
        c_v = statistics.fmean(r.verify_s for r in rounds)
        row["bound"] = row["mean_accepted"] * c_ar / (k * row["c_draft_s"] + c_v)
        row["bound_reached"] = row["speedup_vs_ar"] / row["bound"]
    return row


def warm_up(model, input_ids, method: str, options: dict) -> None:
    """Run every code path once (and build draft-weight copies) on the prompt's first 2048 tokens,
    so the warm-up does not cost a full long prefill; an absolute budget that needs more falls
    back to the whole prompt."""
    try:
        sparsespec.generate(model, input_ids[:2048], method=method, max_new_tokens=6, **options)
    except ConfigError:
        sparsespec.generate(model, input_ids, method=method, max_new_tokens=6, **options)


def run_context(cfg, model, tokenizer, setups, ctx: int) -> dict:
    load = sample_load()                                   # before the prompts are built: we idle
    prompts = load_prompts(cfg.task.name, source=cfg.task.source, tokenizer=tokenizer, context_tokens=ctx,
                           num_prompts=cfg.bench.num_prompts, seed=cfg.seed)
    common = dict(max_new_tokens=cfg.max_new_tokens, stop_at_eos=False)
    for method, options in [("ar", {}), *setups.values()]:      # untimed warm-up of every code path
        warm_up(model, prompts[0].input_ids, method, options)
    gens = {label: [] for label in ["ar", *setups]}
    for prompt in tqdm(prompts, desc=f"ctx {ctx}", leave=False):
        gens["ar"].append(sparsespec.generate(model, prompt.input_ids, method="ar", **common))
        for label, (method, options) in setups.items():
            gens[label].append(sparsespec.generate(model, prompt.input_ids, method=method, **common, **options))
    rows = [cost_row(label, g, gens["ar"]) for label, g in gens.items()]
    after = sample_load()                                  # someone may have started during the run
    return {"ctx": ctx, "context_tokens": [len(p.input_ids) for p in prompts], "busy_before": load["busy"],
            "busy_after": after["busy"], "noisy": load["noisy"] or after["noisy"], "rows": rows}


def markdown(results: list[dict], hardware: str) -> str:
    lines = [f"Hardware: {hardware}. Decode only; prefill is its own column. Greedy, fp32 unless noted.", "",
             "| model | ctx | method | tok/s | speed-up | mean acc. | match AR | C_AR ms | C_d ms | C_v ms (mean k) "
             "| select ms/round | bound | reached | prefill s |", "|" + "---|" * 14]
    for res in results:
        for r in res["rows"]:
            c_v = statistics.fmean(r["c_verify_s_by_k"].values()) * 1e3
            fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
            lines.append(f"| {res['model']} | {res['ctx']}{' (noisy)' if res['noisy'] else ''} | {r['method']} | "
                         f"{r['tokens_per_s']:.2f} | {r['speedup_vs_ar']:.2f}x | {r['mean_accepted']:.2f} | "
                         f"{r['outputs_match_ar']} | {r['c_ar_s'] * 1e3:.1f} | {fmt(r['c_draft_s'] and r['c_draft_s'] * 1e3)} | "
                         f"{c_v:.1f} ({r['mean_k']:.1f}) | {r['select_s_per_round'] * 1e3:.1f} | "
                         f"{fmt(r.get('bound'), '{:.2f}x')} | {fmt(r.get('bound_reached'), '{:.0%}')} | "
                         f"{r['prefill_s']:.1f} |")
    return "\n".join(lines)


def plot_speedup(results: list[dict], hardware: str, path: Path) -> None:
    """Speed-up vs AR against context, one panel per model, one line per method (PNG + PDF)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in results))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        runs = sorted((r for r in results if r["model"] == model), key=lambda r: r["ctx"])
        for method in [row["method"] for row in runs[0]["rows"] if row["method"] != "ar"]:
            xs = [r["ctx"] for r in runs]
            ys = [next(row["speedup_vs_ar"] for row in r["rows"] if row["method"] == method) for r in runs]
            style = dict(lw=2.5, color="black", zorder=3) if method == "sparsespec" else dict(lw=1, alpha=0.8)
            ax.plot(xs, ys, marker="o", label=method, **style)
        ax.axhline(1.0, color="grey", ls="--", lw=0.8)
        ax.set(xscale="log", xlabel="context (tokens)", ylabel="decode speed-up vs AR (x)", title=model)
        ax.set_xticks([r["ctx"] for r in runs], [f"{r['ctx'] // 1000}K" for r in runs])
        ax.minorticks_off()
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"Greedy decode, 128 new tokens, same process and prompt per context. {hardware}", fontsize=8)
    fig.tight_layout()
    for suffix in (".png", ".pdf"):
        fig.savefig(path.with_suffix(suffix), dpi=130)
    plt.close(fig)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if "bench" not in cfg:
        raise SystemExit("error: no `bench` settings; run with experiment=bench_cpu (or bench_gpu)")
    setups = method_setups(list(cfg.bench.methods))
    results = []
    env = None
    for entry in cfg.bench.grid:
        mcfg = compose(config_name="config", overrides=[f"model={entry.model}"])
        model, tokenizer = load_model(model_spec(mcfg), dtype=cfg.bench.get("dtype") or mcfg.model.dtype,
                                      device=None if cfg.device == "auto" else cfg.device)
        env = env or collect(device=str(next(model.parameters()).device), dtype=str(next(model.parameters()).dtype))
        for ctx in entry.ctx:
            res = run_context(cfg, model, tokenizer, setups, int(ctx))
            res["model"] = entry.model
            results.append(res)
            print(markdown([res], env.get("gpu") or env.get("cpu", "cpu")), flush=True)
        del model
    out = Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    hardware = env.get("gpu") or env.get("cpu", "cpu")
    (out / "bench.json").write_text(json.dumps({"results": results, "env": env,
                                                "config": OmegaConf.to_container(cfg, resolve=True)}, indent=1))
    (out / "bench.md").write_text(markdown(results, hardware) + "\n")
    plot_speedup(results, hardware, out / "bench_speedup")
    print(f"\nwrote {out / 'bench.md'}")


if __name__ == "__main__":
    main()
