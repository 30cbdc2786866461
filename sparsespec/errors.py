"""Errors meant for the user: one line that names the bad value and what would be accepted."""


class ConfigError(ValueError):
    """Bad user input (method, option, context, model, task). The CLI prints it as one line and exits 2."""


class UnavailableError(RuntimeError):
    """A model or dataset that cannot be had here (offline, not installed). The message says how to get it."""
