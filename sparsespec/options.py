"""Declared options: each drafter and each controller declares its options once, as a dataclass.

    @dataclass(frozen=True)
    class Options(OptionSet):
        sink: int = option(4, "StreamingLLM's attention sinks soak up attention", check=at_least(0))

The declaration holds the type (the annotation), the default, a one-line reason and a value check.
Everything else is derived from it: defaults, validation with one-line `ConfigError`s, coercion of
command-line strings (lm-eval's model_args), the Hydra schema of `conf/method/*.yaml`, and the
resolved options recorded in summary.json (`sparsespec/method_options.py` puts them together).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

from sparsespec.errors import ConfigError

UNIONS = (typing.Union, types.UnionType)
Check = Callable[[Any], "str | None"]   # None when the value is fine, else what would be accepted


def option(default, reason: str, *, check: Check | None = None):
    """One declared option: its default, why that default, and (optionally) a value check."""
    return field(default=default, metadata={"reason": reason, "check": check})


# --- value checks: each returns None, or what would have been accepted ---------------------------

def at_least(low) -> Check:
    return lambda v: None if v >= low else f">= {low}"


def above(low, meaning: str = "") -> Check:
    return lambda v: None if v > low else f"> {low}{meaning}"


def in_range(low, high, *, high_open: bool = True) -> Check:
    def check(v):
        inside = low <= v < high if high_open else low <= v <= high
        return None if inside else f"in [{low}, {high}{')' if high_open else ']'}"
    return check


def one_of(*choices) -> Check:
    return lambda v: None if v in choices else f"one of {list(choices)}"


def non_empty(check: Check | None = None) -> Check:
    """A non-empty sequence whose items pass `check`."""
    def check_items(v):
        if len(v) == 0:
            return "a non-empty list"
        bad = next((x for x in v if check is not None and check(x) is not None), None)
        return None if bad is None else f"a list of values {check(bad)}"
    return check_items


# --- types: what an annotation accepts, and how a string becomes one --------------------------------

def accepts(hint, value) -> bool:
    """Whether `value` is of the annotation `hint` (bools are not ints; NaN and inf are not floats)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in UNIONS:
        return any(accepts(a, value) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(accepts(args[0], v) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:   # ints are floats too; NaN and inf are not option values
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, hint)


def describe(hint) -> str:
    """'an integer', 'a number or null', 'a list of integers', ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in UNIONS:
        return " or ".join(describe(a) for a in args)
    if origin is tuple:
        return f"a list of {describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string",
            type(None): "null", Any: "any value"}.get(hint, getattr(hint, "__name__", str(hint)))


def coerce(text: str, hint):
    """A command-line string as the annotation's type: "4" -> 4, "true" -> True, "2:4:8" -> (2, 4, 8)
    or "2|4|8" (lm-eval's `key=value,...` strings cannot hold commas). Unparseable text stays a string, so
    validation reports it."""
    text = text.strip()
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        parts = text.translate(str.maketrans(":|;", "   ")).split()
        return tuple(coerce(p, args[0]) for p in parts)
    if origin in UNIONS:
        for arg in args:
            value = coerce(text, arg)
            if accepts(arg, value):
                return value
        return text
    if hint is type(None):
        return None if text.lower() in ("none", "null") else text
    if hint is bool or hint is Any:
        words = {"true": True, "false": False, **({"none": None, "null": None} if hint is Any else {})}
        if hint is bool or text.lower() in words:
            return words.get(text.lower(), text)
    for kind in {int: (int,), float: (int, float), Any: (int, float)}.get(hint, ()):   # "3" stays an int
        try:
            return kind(text)
        except ValueError:
            continue
    return text


# --- the declaration base class ---------------------------------------------------------------------

@dataclass(frozen=True)
class OptionSet:
    """Base of every declared option set. Subclasses are frozen dataclasses of `option(...)` fields
    and may override `check_together` for rules that span several options."""

    OWNER: ClassVar[str] = "options"

    @classmethod
    def fields(cls) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(cls)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in cls.fields()]

    @classmethod
    def hints(cls) -> dict:
        return typing.get_type_hints(cls)

    @classmethod
    def defaults(cls) -> dict:
        return {f.name: f.default for f in cls.fields()}

    @classmethod
    def reasons(cls) -> dict:
        return {f.name: f.metadata.get("reason", "") for f in cls.fields()}

    @classmethod
    def check_value(cls, name: str, value, owner: str) -> None:
        """One option's type and range, with a one-line error naming the value and what is accepted."""
        fld = next(f for f in cls.fields() if f.name == name)
        hint = cls.hints()[name]
        if not accepts(hint, value):
            raise ConfigError(f"{owner} option {name}={value!r} must be {describe(hint)}")
        check = fld.metadata.get("check")
        problem = check(value) if check is not None and value is not None else None
        if problem:
            raise ConfigError(f"{owner} option {name}={value!r} must be {problem}")

    @classmethod
    def build(cls, values: Mapping, owner: str | None = None):
        """The declared defaults updated with `values`, every value checked."""
        owner = owner or cls.OWNER
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown} for {owner}; accepted: {sorted(cls.names())}")
        values = {k: cls._as_declared_shape(k, v) for k, v in values.items()}
        for name, value in values.items():
            cls.check_value(name, value, owner)
        built = cls(**values)
        problem = built.check_together()
        if problem:
            raise ConfigError(f"{owner}: {problem}")
        return built

    @classmethod
    def subset(cls, name: str, *names: str, **overrides):
        """A new option set made of some of this one's declared fields (not a second declaration):
        `SparseKV.Options.subset("StreamingOptions", "sink", "budget")`. `overrides` replace a
        field's default: `k=option(10, "why")`."""
        chosen = [f for f in cls.fields() if f.name in names]
        missing = sorted(set(names) - {f.name for f in chosen})
        if missing:
            raise TypeError(f"{cls.__name__} declares no option(s) {missing}")
        hints = cls.hints()
        spec = [(f.name, hints[f.name], overrides.get(f.name, field(default=f.default, metadata=f.metadata)))
                for f in chosen]
        return dataclasses.make_dataclass(name, spec, bases=(OptionSet,), frozen=True)

    @classmethod
    def _as_declared_shape(cls, name: str, value):
        """Lists (YAML, lm-eval) become tuples; a single value of a list-typed option becomes a 1-tuple."""
        if isinstance(value, (list, range)):
            return tuple(value)
        if typing.get_origin(cls.hints()[name]) is tuple and not isinstance(value, tuple) and value is not None:
            return (value,)
        return value

    def check_together(self) -> str | None:
        """A rule spanning several options; None when they fit together."""
        return None

    def as_dict(self) -> dict:
        """Plain values (tuples as lists), as results and configs record them."""
        values = {f.name: getattr(self, f.name) for f in self.fields()}   # no deep copy: a value may be a model
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


@dataclass(frozen=True)
class NoOptions(OptionSet):
    """A drafter or controller with nothing to set."""
