"""What a run stopped by Ctrl-C says: one line with the samples kept and the command that resumes it."""
from __future__ import annotations

import shlex
from pathlib import Path

from .results import SAMPLES

EXIT_INTERRUPTED = 130   # the shell's code for a process ended by SIGINT (128 + 2)


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
