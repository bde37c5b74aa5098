"""Command-line flags for every estimator's settings section, derived from its dataclass.

Each registered estimator's section (``Estimator.settings``: ``credit.<section>``) gives one flag
per field, ``--<section>-<field>`` (``_`` -> ``-``), typed and described from the field's rule and
docstring; a plug-in's settings appear in ``--help`` without an edit here. Nested sections (the
trainer's ``credit.call_credit.counterfactual`` ...: replays need an environment) and settings
declared ``trainer_only`` (``config_rules.setting``; e.g. the masked pass's placeholder text) have
no flag.
The flags are parsed into the same :class:`~verl_credit.config.CreditConfig` the trainer builds
(``CreditConfig.from_mapping``), so a bad value gets the trainer's message, naming the key.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from verl_credit.config_rules import Choice, Number, Section, Switch, Weights, field_docstrings, rule_of
from verl_credit.estimators.registry import estimator_sections

__all__ = ["FLAG_NAMES", "add_section_arguments", "flag_of", "section_values"]

#: the flags that were named by hand before the flags were derived from the settings (kept, so
#: that existing command lines keep working): (section, field) -> flag
FLAG_NAMES: dict[tuple[str, str], str] = {
    ("iapo", "beta_plus"): "--beta-plus",
    ("iapo", "clip_c"): "--clip-c",
    ("iapo", "neg_route"): "--neg-route",
    ("iapo", "beta_minus"): "--beta-minus",
    ("call_credit", "mode"): "--call-mode",
    ("call_credit", "smoothing"): "--smoothing",
    ("call_credit", "gamma"): "--gamma",
    ("gigpo", "step_advantage_w"): "--gigpo-w",
    ("gigpo", "gamma"): "--gigpo-gamma",
    ("gigpo", "mode"): "--gigpo-mode",
    ("gigpo", "state"): "--gigpo-state",
    ("turn_reward", "lambda_turn"): "--turn-lambda",
    ("turn_reward", "gamma"): "--turn-gamma",
    ("info_gain", "weight"): "--info-weight",
    ("info_gain", "gate_temperature"): "--info-gate-temperature",
}
#: switches that also keep a hand-named "off" flag: (section, field) -> flag
NEGATIVE_FLAG_NAMES: dict[tuple[str, str], str] = {("info_gain", "normalize"): "--info-no-normalize"}
#: separates section and field in an argument's ``dest`` (``argparse.Namespace`` attribute)
_DEST_SEPARATOR = "."


def flag_of(section: str, name: str) -> str:
    """The flag of ``credit.<section>.<name>``."""
    return FLAG_NAMES.get((section, name)) or f"--{section}-{name}".replace("_", "-")


def _weights(names: tuple[str, ...]) -> Any:
    def parse(text: str) -> dict[str, float]:
        values: dict[str, float] = {}
        for item in text.split(","):
            key, sep, number = item.partition("=")
            if not sep:
                raise argparse.ArgumentTypeError(f"expected NAME=NUMBER,... with names {names}, got {text!r}")
            try:
                values[key.strip()] = float(number)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{key.strip()}: not a number: {number!r}") from None
        return values

    return parse


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split()).replace("``", "")
    head, dot, _ = flat.partition(". ")
    return (head + ("." if dot else "")).replace("%", "%%")


def add_section_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument group per registered estimator section, one flag per field. Unset flags stay
    out of the namespace (the section's default applies)."""
    for section, kind in estimator_sections().items():
        group = parser.add_argument_group(f"credit.{section}", (kind.__doc__ or "").split("\n")[0] or None)
        docs = field_docstrings(kind)
        defaults = kind()
        for item in fields(kind):
            rule = rule_of(kind, item.name)
            if isinstance(rule, Section) or item.metadata.get("trainer_only", False):
                continue
            dest = f"{section}{_DEST_SEPARATOR}{item.name}"
            default = getattr(defaults, item.name)
            meaning = _first_sentence(docs.get(item.name, ""))
            help_text = f"{meaning} (credit.{section}.{item.name}; {rule.describe()}; default {default!r})".strip()
            options: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
            if isinstance(rule, Switch):
                group.add_argument(flag_of(section, item.name), action=argparse.BooleanOptionalAction, **options)
                negative = NEGATIVE_FLAG_NAMES.get((section, item.name))
                if negative is not None:
                    group.add_argument(
                        negative,
                        action="store_false",
                        dest=dest,
                        default=argparse.SUPPRESS,
                        help=f"= --no-{flag_of(section, item.name)[2:]}",
                    )
                continue
            if isinstance(rule, Choice):
                options["choices"] = rule.names()
            elif isinstance(rule, Number):
                options["type"] = int if rule.integer else float
                options["metavar"] = item.name.upper()
            elif isinstance(rule, Weights):
                options["type"] = _weights(rule.names)
                options["metavar"] = ",".join(f"{name}=W" for name in rule.names)
            else:
                options["metavar"] = item.name.upper()
            group.add_argument(flag_of(section, item.name), **options)


def section_values(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The section flags given on the command line: ``{section: {field: value}}``."""
    values: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        section, sep, name = dest.partition(_DEST_SEPARATOR)
        if sep:
            values.setdefault(section, {})[name] = value
    return values
