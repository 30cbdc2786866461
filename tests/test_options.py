"""Declared options: every default is valid, bad values get one line, strings coerce by type."""
from __future__ import annotations

import math
from typing import Any

import pytest

from sparsespec.controllers import CONTROLLERS
from sparsespec.errors import ConfigError
from sparsespec.method_options import coerce_options, controllers_for, option_names, resolve
from sparsespec.methods.__main__ import describe
from sparsespec.methods import METHODS
from sparsespec.methods.policies.base import GatheredOptions
from sparsespec.options import coerce

OPTION_SETS = [(f"method {n}", cls.Options) for n, cls in METHODS.items()] + \
              [(f"controller {n}", cls.Options) for n, cls in CONTROLLERS.items()]


@pytest.mark.parametrize("owner, options", OPTION_SETS, ids=[o for o, _ in OPTION_SETS])
def test_every_declared_option_has_a_reason_and_a_valid_default(owner, options):
    for name, reason in options.reasons().items():
        assert reason.strip(), f"{owner}: option {name} declares no reason"
    for name, default in options.defaults().items():
        if default is not None:
            options.check_value(name, default, owner)   # raises if a default fails its own check


def test_drafter_and_controller_options_never_share_a_name():
    controller_names = {n for cls in CONTROLLERS.values() for n in cls.Options.names()}
    for method, drafter in METHODS.items():
        assert not set(drafter.Options.names()) & (controller_names | {"controller"}), method


@pytest.mark.parametrize("value", [True, 2.5, "4", None])
def test_an_integer_option_refuses_other_types(value):
    with pytest.raises(ConfigError, match=r"sink=.* must be an integer"):
        resolve("sparsespec", {"sink": value})


@pytest.mark.parametrize("value", [math.nan, math.inf, "abc", False])
def test_a_number_option_refuses_non_finite_and_non_numbers(value):
    with pytest.raises(ConfigError, match="must be a finite number"):
        resolve("sparsespec", {"controller": "entropy", "tau": value})


def test_defaults_fill_in_and_a_method_may_override_its_controllers_default():
    assert resolve("pld", {}).as_dict() == {"controller": "fixed", "k": 10, "max_ngram": 2}
    assert resolve("streaming", {}).as_dict()["k"] == CONTROLLERS["fixed"].Options().k
    entropy = resolve("sparsespec", {"candidates": [2, 4]}).as_dict()
    assert entropy["controller"] == "entropy" and entropy["candidates"] == [2, 4]
    assert resolve("ar", {}).as_dict() == {}


def test_prompt_lookup_drafts_have_no_entropy_so_the_entropy_controller_does_not_apply():
    assert "entropy" in controllers_for("sparsespec") and "entropy" not in controllers_for("pld")
    assert controllers_for("ar") == []


@pytest.mark.parametrize("text, hint, expected", [
    ("4", int, 4), ("0.25", float, 0.25), ("3", float, 3), ("true", bool, True), ("False", bool, False),
    ("2:4:8", tuple[int, ...], (2, 4, 8)), ("2|4", tuple[int, ...], (2, 4)), ("none", int | None, None),
    ("7", int | None, 7), ("inductor", bool | str, "inductor"), ("true", bool | str, True), ("abc", int, "abc"),
    ("true", Any, True), ("8", Any, 8), ("truncated:8", Any, "truncated:8"),
])
def test_strings_coerce_to_the_declared_type(text, hint, expected):
    assert coerce(text, hint) == expected


def test_lm_eval_strings_become_valid_options():
    options = coerce_options("sparsespec", {"candidates": "2:4:8", "budget": "0.2", "static_draft": "true"})
    assert resolve("sparsespec", options).as_dict()["candidates"] == [2, 4, 8]
    assert options == {"candidates": (2, 4, 8), "budget": 0.2, "static_draft": True}


def test_a_subset_keeps_the_declaration_and_refuses_unknown_fields():
    streaming, full = METHODS["streaming"].Options, GatheredOptions
    assert set(streaming.names()) < set(full.names())
    assert streaming.reasons()["sink"] == full.reasons()["sink"]
    assert streaming.defaults()["budget"] == full.defaults()["budget"]
    with pytest.raises(TypeError, match="nope"):
        full.subset("Broken", "sink", "nope")


def test_describe_lists_every_option_with_its_default():
    text = describe("sparsespec")
    for name in option_names("sparsespec") - {"controller"}:
        assert f"    {name} " in text


@pytest.mark.slow   # composes every method's config
def test_the_method_listing_takes_every_name_method_accepts(capsys):
    """`python -m sparsespec.methods <name>` for every conf/method file (sparsespec_fixed included)
    and every engine method; an unknown name is one line and exit 2."""
    from sparsespec.harness.entries import conf_method_names
    from sparsespec.methods.__main__ import main

    names = sorted(set(conf_method_names()) | set(METHODS))
    assert "sparsespec_fixed" in names
    for name in names:
        main([name])
        assert capsys.readouterr().out.startswith(f"{name}: ")
    main(["sparsespec_fixed"])
    assert "sparsespec with controller='fixed'" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["sparsespec_fixd"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: unknown method 'sparsespec_fixd'; accepted: ") and "sparsespec_fixed" in err


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_listing_gives_each_methods_first_sentence_whole(method):
    """Each method's first listed line ends its sentence (no "...paid to each")."""
    headline = describe(method).splitlines()[0]
    assert headline.endswith((".", ")")), headline
    assert headline.count("(") == headline.count(")"), headline


def test_first_sentence_keeps_abbreviations_and_joins_lines():
    from sparsespec.methods.__main__ import first_sentence

    doc = "`x`: drafts like Y (e.g. Llama drafting for\nLlama, Zhang et al. 2023). Second sentence.\n\nMore."
    assert first_sentence(doc, "x") == "drafts like Y (e.g. Llama drafting for Llama, Zhang et al. 2023)."
