"""`python -m sparsespec.lm_eval.cli ...`: lm-eval's own command line, with the `sparsespec` model registered.

lm-eval 0.4.13 discovers no plugins, so this imports `sparsespec.lm_eval.model` (which registers the
model) and then runs lm-eval's CLI with the arguments unchanged, e.g.

    python -m sparsespec.lm_eval.cli --model sparsespec \
        --model_args pretrained=embedded:smollm2_135m,method=sparsespec,controller=entropy \
        --include_path tests/lm_eval_tasks --tasks sparsespec_pydoc --output_path results/lm_eval

Before lm-eval starts, `--model_args` of the `sparsespec` model are checked (method, options), so a
bad value fails in a second with one line and exit status 2. After lm-eval has written its results
file, the speculation statistics (also inside it, under `config.sparsespec`) are written next to it
as `speculation_<date>.json`. See docs/lm_eval.md.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sparsespec.errors import ConfigError, UnavailableError

PROG = "python -m sparsespec.lm_eval.cli"
TASKS_NOT_FOUND = "Tasks not found: "   # how lm-eval 0.4.13 starts the ValueError for an unknown --tasks name


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's CLI on `argv` (default: the command line); 2 on a bad configuration."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    from sparsespec.lm_eval import model as lm_eval_model

    setup_logging()
    cli = HarnessCLI()
    args = parse_cli_args(cli, sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        check_model_args(args, lm_eval_model)
        execute(cli, args)
    except (ConfigError, UnavailableError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    for path in write_speculation_files(getattr(args, "output_path", None), started):
        print(f"speculation statistics written to {path}")
    return 0


def parse_cli_args(cli, argv: list[str]):
    """HarnessCLI parses `sys.argv` (inserting `run` when no subcommand is given); restore it after."""
    saved = sys.argv
    sys.argv = [PROG, *argv]
    try:
        return cli.parse_args()
    finally:
        sys.argv = saved


def check_model_args(args, lm_eval_model) -> None:
    """Validate the sparsespec model's pretrained, method and options before lm-eval loads anything."""
    if getattr(args, "model", None) != "sparsespec":
        return
    model_args = dict(getattr(args, "model_args", None) or {})
    lm_eval_model.embedded_name(model_args.pop("pretrained", None))
    lm_eval_model.parse_model_args(model_args.pop("method", "sparsespec"), model_args)


def execute(cli, args) -> None:
    """lm-eval's command; its unknown-task error (a ValueError, before any model loads) becomes one line."""
    try:
        cli.execute(args)
    except ValueError as err:
        if not str(err).startswith(TASKS_NOT_FOUND):
            raise
        missing = str(err).removeprefix(TASKS_NOT_FOUND)
        raise ConfigError(f"--tasks {missing}: no such task; list the accepted names with `{PROG} ls tasks` "
                          f"(with the same --include_path)") from None


def write_speculation_files(output_path: str | None, since: float) -> list[Path]:
    """Next to each results file lm-eval wrote since `since`, the speculation report it holds."""
    written = []
    for results_file in new_results_files(output_path, since):
        speculation = json.loads(results_file.read_text(encoding="utf-8")).get("config", {}).get("sparsespec")
        if speculation is None:
            continue
        target = results_file.with_name(speculation_file_name(results_file.name))
        target.write_text(json.dumps(speculation, indent=2) + "\n", encoding="utf-8")
        written.append(target)
    return written


def new_results_files(output_path: str | None, since: float) -> list[Path]:
    if not output_path:
        return []
    root = Path(output_path)
    if root.suffix == ".json":  # lm-eval writes <stem>_<date>.json next to it
        candidates = root.parent.glob(f"{root.stem}_*.json")
    else:                       # lm-eval writes <output_path>/<model>/results_<date>.json
        candidates = root.glob("*/results_*.json")
    return sorted(p for p in candidates if p.stat().st_mtime >= since
                  and not p.name.startswith("speculation_"))


def speculation_file_name(results_name: str) -> str:
    if results_name.startswith("results_"):
        return "speculation_" + results_name[len("results_"):]
    return Path(results_name).stem + "_speculation.json"


if __name__ == "__main__":
    sys.exit(main())
