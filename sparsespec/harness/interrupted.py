"""What a run stopped by Ctrl-C or SIGTERM (`kill`, SLURM's scancel or time limit) says: one line with the
samples kept and the command that resumes it, and the shell's exit status for that signal."""
from __future__ import annotations

import shlex
import signal
from pathlib import Path

from sparsespec.harness.results import SAMPLES


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the run is, so it stops as Ctrl-C stops it (a KeyboardInterrupt is no
    Exception: no `except Exception` on the way swallows it)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def stop_like_ctrl_c_on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in the main thread instead of ending the process silently."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def exit_code(stop: KeyboardInterrupt) -> int:
    """The shell's status for a process ended by the signal: 128 + 15 for SIGTERM, 128 + 2 for Ctrl-C."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def kept_samples(folder: Path) -> int:
    """Finished samples under `folder` (a benchmark's or a sweep's sub-folders included): the
    complete lines of every samples.jsonl; a line cut short is not counted (resume drops it)."""
    count = 0
    for path in Path(folder).rglob(SAMPLES):
        complete = path.read_bytes().split(b"\n")[:-1]
        count += sum(1 for line in complete if line.strip())
    return count


def resume_command(program: str, arguments: list[str], folder: Path, multirun: bool) -> str:
    """The command line that resumes the run: the same arguments, into the same folder."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    kept = [a for a in arguments if not a.startswith(key + "=")]
    return shlex.join(["python", program, *kept, f"{key}={folder}"])


def interrupted_line(program: str, arguments: list[str], folder: Path, multirun: bool) -> str:
    count = kept_samples(folder)
    return (f"interrupted: {count} finished sample{'s' if count != 1 else ''} kept in {folder}; "
            f"resume with: {resume_command(program, arguments, folder, multirun)}")
