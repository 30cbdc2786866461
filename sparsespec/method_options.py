"""A method's options: its drafter's declared options plus its controller's, resolved and checked.

    resolve("sparsespec", {"controller": "fixed", "k": 8, "budget": 0.2})
        -> MethodOptions(controller="fixed", controller_options=FixedK.Options(k=8),
                         drafter_options=SparseKVDrafter.Options(budget=0.2, ...))

Each drafter declares `Options` (sparsespec/methods/), each controller its own (sparsespec/controllers/);
nothing here lists an option by name. Every check needs only the values, so it runs before any model
loads: in `sparsespec.generate`, in the harness's config check and in lm-eval's model_args parsing.
Checks that need the model or the prompt (a budget against the context, `exit_layer` against the
layer count) stay with the drafter.
"""
from __future__ import annotations

from dataclasses import dataclass

from sparsespec.controllers import CONTROLLERS, Controller, make_controller
from sparsespec.errors import ConfigError
from sparsespec.methods import METHODS
from sparsespec.options import OptionSet, coerce

CONTROLLER = "controller"   # the option that picks the controller


@dataclass(frozen=True)
class MethodOptions:
    method: str
    controller: str
    controller_options: OptionSet
    drafter_options: OptionSet

    def make_controller(self) -> Controller:
        return make_controller(self.controller, **self.controller_options.as_dict())

    def as_dict(self) -> dict:
        """Every setting the method runs with, defaults included (AR: none)."""
        if not METHODS[self.method].drafts:
            return self.drafter_options.as_dict()
        return {CONTROLLER: self.controller, **self.controller_options.as_dict(), **self.drafter_options.as_dict()}


def drafter_class(method) -> type:
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; accepted: {sorted(METHODS)}")
    return METHODS[method]


def controllers_for(method: str) -> list[str]:
    """The controllers a method accepts: none chooses for AR, and entropy-reading ones need drafts
    that have an entropy (prompt lookup's do not)."""
    drafter = drafter_class(method)
    if not drafter.drafts:
        return []
    return [name for name, cls in CONTROLLERS.items() if drafter.drafts_have_entropy or not cls.uses_entropy]


def option_names(method: str) -> set[str]:
    """Every option `method` accepts, under any of its controllers."""
    drafter = drafter_class(method)
    names = set(drafter.Options.names())
    for name in controllers_for(method):
        names |= {CONTROLLER, *CONTROLLERS[name].Options.names()}
    return names


def option_type(method: str, name: str):
    """The declared annotation of one of `method`'s options."""
    drafter = drafter_class(method)
    if name in drafter.Options.names():
        return drafter.Options.hints()[name]
    if name == CONTROLLER:
        return str
    for controller in controllers_for(method):
        hints = CONTROLLERS[controller].Options.hints()
        if name in hints:
            return hints[name]
    raise ConfigError(f"unknown option {name!r} for method {method!r}; accepted: {sorted(option_names(method))}")


def resolve(method: str, options: dict) -> MethodOptions:
    """The options `method` runs with, declared defaults filled in; a one-line ConfigError on an
    unknown method, an unknown option, an option of another controller, or a bad value."""
    drafter = drafter_class(method)
    options = dict(options)
    owner = f"method {method!r}"
    if not drafter.drafts:
        foreign = sorted(set(options) - set(drafter.Options.names()))
        if foreign:
            raise ConfigError(f"method {method!r} drafts nothing, so it takes no option(s) {foreign}; "
                              f"accepted: {sorted(drafter.Options.names())}")
        return MethodOptions(method, "fixed", CONTROLLERS["fixed"].Options(),
                             drafter.Options.build(options, owner))
    controller = options.pop(CONTROLLER, drafter.default_controller)
    accepted = controllers_for(method)
    if controller not in accepted:
        raise ConfigError(f"controller {controller!r} does not fit method {method!r}; accepted: {accepted}")
    unknown = sorted(set(options) - option_names(method))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for {owner}; accepted: {sorted(option_names(method))}")
    drafter_names = set(drafter.Options.names())
    controller_cls = CONTROLLERS[controller]
    foreign = sorted(set(options) - drafter_names - set(controller_cls.Options.names()))
    if foreign:
        raise ConfigError(f"option(s) {foreign} do not apply to controller {controller!r} of {owner}; "
                          f"its options: {sorted(controller_cls.Options.names())}")
    defaults = {k: v for k, v in drafter.controller_defaults.items() if k in controller_cls.Options.names()}
    controller_values = {**defaults, **{k: v for k, v in options.items() if k not in drafter_names}}
    return MethodOptions(
        method, controller,
        controller_cls.Options.build(controller_values, f"{owner} (controller {controller!r})"),
        drafter.Options.build({k: v for k, v in options.items() if k in drafter_names}, owner))


def coerce_options(method: str, raw: dict) -> dict:
    """Command-line strings (lm-eval's model_args) as the declared types; lists become tuples; other
    values pass through (a single value of a list option is taken as a one-item list by `resolve`)."""
    def one(name, value):
        if isinstance(value, str):
            return coerce(value, option_type(method, name))
        return tuple(value) if isinstance(value, list) else value
    return {name: one(name, value) for name, value in raw.items()}


def build_method(model, prompt_len: int, method: str, max_new_tokens: int, options: dict):
    """(drafter, controller, resolved options) of `method` for a prompt of `prompt_len` tokens."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    resolved = resolve(method, options)           # every option checked before any work
    controller = resolved.make_controller()
    drafter = METHODS[method](model, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                              max_k=controller.max_k, options=resolved.drafter_options)
    return drafter, controller, resolved.as_dict()
