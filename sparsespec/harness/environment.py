"""Where a run ran: package versions, git commit, CPU (flags, BLAS) and GPU, threads, dtype (for summary.json)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from sparsespec import threads

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "hydra-core",
            "omegaconf", "hydra-submitit-launcher", "submitit", "wandb", "datasets", "numpy", "gguf")
REPO = Path(__file__).resolve().parents[2]   # the checkout that holds this package


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """Commit of the checkout and whether tracked files differ from it (None outside a repo)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def gpu_info() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": None, "gpu_count": 0, "cuda": None}
    return {"gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
            "cuda": torch.version.cuda}


def collect(*, device: str, dtype: str) -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "packages": package_versions(),
        "git": git_state(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **threads.machine(),
        **gpu_info(),
        "device": device,
        "dtype": dtype,
    }


NOISY_BUSY = 0.15   # share of all cores busy while this process sleeps: someone else is computing


BUSY_SAMPLE_S = 1.0   # 100 ticks a core at 100 Hz: a 15% share reads to about 1%; every run pays it twice


def cpu_busy_fraction(seconds: float = BUSY_SAMPLE_S) -> float | None:
    """Share of CPU time spent busy machine-wide over `seconds` while this process sleeps, from
    /proc/stat (the load average would count this process's own recent work); None without it."""
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


def is_noisy(busy: float | None) -> bool | None:
    """Whether other processes competed for the CPU (None when it could not be measured)."""
    return None if busy is None else busy > NOISY_BUSY
