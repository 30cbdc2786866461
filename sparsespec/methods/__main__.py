"""`python -m sparsespec.methods [name ...]`: every name `method=` accepts (the engine's methods and
the conf/method files) with its options, defaults and reasons. An unknown name is one line, exit 2."""
from __future__ import annotations

import re
import sys

from sparsespec.errors import ConfigError, exit_with_error
from sparsespec.harness.entries import conf_method_names, method_node
from sparsespec.controllers import CONTROLLERS
from sparsespec.method_options import controllers_for, drafter_class
from sparsespec.methods import METHODS


# A sentence ends at . ! or ? before a space and a capital, a backquote or a parenthesis, except after
# an abbreviation ("e.g. Llama", "Zhang et al. 2023").
SENTENCE_END = re.compile(r"(?<!e\.g\.)(?<!i\.e\.)(?<!\bal\.)(?<!\bcf\.)(?<!\bvs\.)(?<=[.!?])\s+(?=[A-Z`(])")


def first_sentence(doc: str, name: str) -> str:
    """The first sentence of a module docstring, whole, on one line, without a leading "`name`: "."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return SENTENCE_END.split(paragraph, maxsplit=1)[0].removeprefix(f"`{name}`: ")


def describe(method: str) -> str:
    """A readable list of `method`'s options: name, default, reason (`python -m sparsespec.methods`)."""
    drafter = drafter_class(method)
    lines = [f"{method}: {first_sentence(sys.modules[drafter.__module__].__doc__ or '', method)}"]
    sections = [("options", drafter.Options, {})]
    for name in controllers_for(method):
        own = {k: v for k, v in drafter.controller_defaults.items() if k in CONTROLLERS[name].Options.names()}
        sections.append((f"controller={name}" + (" (default)" if name == drafter.default_controller else ""),
                         CONTROLLERS[name].Options, own))
    for title, options, own in sections:
        if not options.names():
            continue
        lines.append(f"  {title}")
        defaults, reasons = options.defaults(), options.reasons()
        for name in options.names():
            default, reason = (own[name], f"{method}'s own default") if name in own else (defaults[name], reasons[name])
            lines.append(f"    {name:<17} {default!r:<10} {reason}")
    return "\n".join(lines)


def conf_methods() -> dict[str, tuple[str, dict]]:
    """conf/method name -> (the engine's method it runs, the options its file sets)."""
    def of(name: str) -> tuple[str, dict]:
        node = method_node(name)
        return str(node.name), {k: v for k, v in dict(node.options or {}).items() if v is not None}
    return {name: of(name) for name in conf_method_names()}


def settings(options: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items())


def listing(name: str, confs: dict[str, tuple[str, dict]], named: bool) -> str:
    """`name`'s options. A conf file that runs another method says which, with what; the other
    method's options follow when `name` was asked for by name."""
    method, options = confs.get(name, (name, {}))
    source = f"conf/method/{name}.yaml"
    if method == name:
        return describe(name) + (f"\n  method={name} ({source}) sets {settings(options)}" if options else "")
    line = f"{name}: {method} with {settings(options) or 'its defaults'} ({source}); {method}'s options apply"
    return line + ("\n" + describe(method) if named else "")


def main(argv: list[str]) -> None:
    confs = conf_methods()
    accepted = sorted(set(METHODS) | set(confs))
    unknown = [name for name in argv if name not in accepted]
    if unknown:
        exit_with_error(ConfigError(f"unknown method {unknown[0]!r}; accepted: {', '.join(accepted)}"))
    for name in argv or accepted:
        print(listing(name, confs, named=bool(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
