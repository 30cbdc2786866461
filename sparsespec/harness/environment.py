"""Where a run ran: package versions, git commit and code fingerprint, CPU (flags, BLAS) and GPU, threads,
dtype (for summary.json)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from sparsespec.threads import DEFAULT_THREADS

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


# What decides a run's numbers: engine, configs, entry point, pins (experiments/ only passes run.py arguments).
CODE_PATHS = ("sparsespec", "conf", "run.py", "pyproject.toml")


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_fingerprint(repo: Path = REPO, commit: str = "HEAD") -> str | None:
    """A hash of the git objects of CODE_PATHS at `commit` (`git ls-tree`: mode, object id and name of
    each): equal for two commits exactly when they hold the same code. None outside a repo."""
    listing = _git(repo, "ls-tree", "--full-tree", commit, "--", *CODE_PATHS)
    return None if listing is None else hashlib.sha1(listing.encode()).hexdigest()


def git_state(repo: Path = REPO) -> dict:
    """The checkout's commit, whether tracked files differ from it (`dirty`), the fingerprint of its
    code at that commit (`code`, see code_fingerprint) and whether tracked files under CODE_PATHS
    differ from it (`code_dirty`); None for each outside a repo. `repo` is the checkout's root."""
    commit = _git(repo, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "code": None, "code_dirty": None}
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    code_status = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    return {"commit": commit, "dirty": None if status is None else bool(status),
            "code": code_fingerprint(repo, commit),
            "code_dirty": None if code_status is None else bool(code_status)}


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def sitting_machine() -> dict:
    """What each sample records of the machine that decoded it: the CPU's name, the vector width torch
    dispatched to (one CPU name covers AVX2 and AVX-512 machines) and the GPU (None on a CPU)."""
    return {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "gpu": gpu_info()["gpu"]}


def gpu_info() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": None, "gpu_count": 0, "cuda": None}
    return {"gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
            "cuda": torch.version.cuda}


def collect(*, device: str, dtype: str, git: dict | None = None) -> dict:
    """Where this process runs. `git`: the git state read when the run started (a commit made while it
    decodes must not relabel its summary); None: read it now."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "packages": package_versions(),
        "git": git_state() if git is None else git,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **machine(),
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


CPU_FLAGS = {"avx2": "avx2", "avx512": "avx512f", "amx": "amx_tile"}   # what the matmul kernels can use


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, bool | None]:
    """Which of AVX2, AVX-512 and AMX the CPU reports (None for each without a readable `cpuinfo`)."""
    flags = None
    if cpuinfo.exists():
        line = next((l for l in cpuinfo.read_text(errors="replace").splitlines() if l.startswith("flags")), None)
        flags = set(line.split(":", 1)[1].split()) if line else None
    return {name: None if flags is None else flag in flags for name, flag in CPU_FLAGS.items()}


def blas_library() -> str | None:
    """The BLAS torch was built with (`BLAS_INFO` of `torch.__config__.show()`: mkl, openblas, ...)."""
    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return found.group(1) if found else None


def machine() -> dict:
    """The CPU facts a thread choice depends on, for summary.json."""
    return {"cpu_flags": cpu_flags(), "blas": blas_library(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "default_threads": DEFAULT_THREADS, "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
