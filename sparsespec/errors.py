"""Errors meant for the user: one line that names the bad value and what would be accepted."""
from __future__ import annotations

import sys
from typing import NoReturn


class ConfigError(ValueError):
    """Bad user input (method, option, context, model, task). The CLI prints it as one line and exits 2."""


class UnavailableError(RuntimeError):
    """A model or dataset that cannot be had here (offline, not installed). The message says how to get it."""


def one_line(message: object) -> str:
    """`message` on one line, whatever line breaks it held."""
    return " ".join(str(message).split())


def describe(err: BaseException) -> str:
    """An exception as one line, its type first: what a warning or a wrapped error quotes."""
    text = one_line(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def exit_with_error(err: Exception) -> NoReturn:
    """The command-line convention for a user error: `error: <one line>` on stderr, exit status 2."""
    print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
    sys.exit(2)
