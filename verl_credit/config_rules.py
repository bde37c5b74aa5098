"""The declared type and allowed range of every config key, and the one check that enforces them.

Every field of a config dataclass (:mod:`verl_credit.config`, :mod:`verl_credit.verl.settings`)
is made with :func:`setting`, which stores its rule in the field's ``metadata``: its type, its
allowed range and, where ``null`` is allowed, what ``null`` means. :func:`check_fields` (called
first in each ``__post_init__``) enforces the rules; a field declared without a rule raises at
once, so a new key cannot ship without validation.

Types are strict, because a lenient reading silently changes training: a number given as a
string (``'0.5'``), a boolean given as a string (``'false'`` is truthy in Python) or as ``0``/``1``,
a float where a count is expected -- each is refused with a message naming the key, the allowed
range and the value. Numbers must be finite and inside their range; a limit (a timeout, a
deadline, a context budget) is switched off only by its documented value (``null`` or ``0``),
never by an infinite or huge number.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Protocol

__all__ = [
    "MAX_COUNT",
    "MAX_RETRIES",
    "MAX_SECONDS",
    "MAX_TOKENS",
    "MAX_WEIGHT",
    "Choice",
    "Number",
    "PluginSections",
    "Rule",
    "Section",
    "Switch",
    "Table",
    "Text",
    "Texts",
    "Weights",
    "check_fields",
    "field_docstrings",
    "rule_of",
    "setting",
]

#: the longest timeout or deadline a setting accepts (one day): a larger one is no limit at all
MAX_SECONDS = 86400.0
#: the largest weight, multiplier or smoothing constant: keeps every credit term finite in float32
#: (see ``verl_credit.estimators.needs.TURN_REWARD_LIMIT``)
MAX_WEIGHT = 1e6
#: the largest worker count, replay budget, turn count or concurrency a setting accepts
MAX_COUNT = 4096
#: the most retries of one request a setting accepts
MAX_RETRIES = 100
#: the largest token count (a context length, a prompt or reply budget) a setting accepts
MAX_TOKENS = 2**24


class Rule(Protocol):
    """What one key accepts."""

    def problem(self, value: Any) -> bool:
        """Whether ``value`` breaks the rule."""
        ...

    def describe(self) -> str:
        """What the key accepts, as the tail of ``"<key> must be ..."``."""
        ...


def _number_text(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:g}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Number:
    """A finite number (``integer``: an ``int``) in ``[low, high]`` (``low_open``/``high_open``:
    the bound itself excluded; ``None``: unbounded on that side). ``null``: what ``null`` means
    (``None``: null is refused); ``zero``: what ``0`` means where it switches a limit off."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    null: str | None = None
    zero: str | None = None

    def problem(self, value: Any) -> bool:
        if value is None:
            return self.null is None
        if self.integer:
            if not isinstance(value, int) or isinstance(value, bool):
                return True
        elif not _is_number(value) or not math.isfinite(value):
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return True
        return self.high is not None and (value >= self.high if self.high_open else value > self.high)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind} in {left}{_number_text(self.low)}, {_number_text(self.high)}{right}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_number_text(self.low)}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {_number_text(self.high)}"
        else:
            text = kind
        if self.zero is not None:
            text += f" (0: {self.zero})"
        return text + (f" or null ({self.null})" if self.null is not None else "")


@dataclass(frozen=True)
class Switch:
    """``true`` or ``false`` (a real boolean: not the string ``'false'``, not ``0``/``1``)."""

    def problem(self, value: Any) -> bool:
        return not isinstance(value, bool)

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Choice:
    """One of ``options`` (a tuple, or a function giving it: registries can grow)."""

    options: tuple[str, ...] | Callable[[], tuple[str, ...]]

    def names(self) -> tuple[str, ...]:
        return tuple(self.options() if callable(self.options) else self.options)

    def problem(self, value: Any) -> bool:
        return not isinstance(value, str) or value not in self.names()

    def describe(self) -> str:
        return f"one of {self.names()}"


@dataclass(frozen=True)
class Text:
    """A string, non-empty unless ``empty``; ``null``: what ``null`` means (``None``: refused)."""

    null: str | None = None
    empty: bool = False

    def problem(self, value: Any) -> bool:
        if value is None:
            return self.null is None
        return not isinstance(value, str) or (not value and not self.empty)

    def describe(self) -> str:
        text = "a string" if self.empty else "a non-empty string"
        return text + (f" or null ({self.null})" if self.null is not None else "")


@dataclass(frozen=True)
class Texts:
    """A list of non-empty strings (possibly empty itself)."""

    def problem(self, value: Any) -> bool:
        if not isinstance(value, tuple | list):
            return True
        return any(not isinstance(item, str) or not item for item in value)

    def describe(self) -> str:
        return "a list of non-empty strings"


@dataclass(frozen=True)
class Table:
    """An open mapping with string keys (e.g. an environment's constructor options)."""

    def problem(self, value: Any) -> bool:
        return not isinstance(value, Mapping) or any(not isinstance(key, str) for key in value)

    def describe(self) -> str:
        return "a mapping with string keys"


@dataclass(frozen=True)
class Weights:
    """A mapping with exactly the keys ``names``, each value a :class:`Number` ``each``."""

    names: tuple[str, ...]
    each: Number

    def problem(self, value: Any) -> bool:
        if not isinstance(value, Mapping) or set(value) != set(self.names):
            return True
        return any(self.each.problem(value[name]) for name in self.names)

    def describe(self) -> str:
        return f"a mapping of {self.names} to {self.each.describe()}"


@dataclass(frozen=True)
class Section:
    """A nested settings object of class ``kind`` (validated by its own ``__post_init__``)."""

    kind: type

    def problem(self, value: Any) -> bool:
        return not isinstance(value, self.kind)

    def describe(self) -> str:
        return f"a {self.kind.__name__}"


@dataclass(frozen=True)
class PluginSections:
    """The settings sections of plug-in estimators: a mapping of section name -> an instance of that
    section's dataclass, for the names ``sections()`` lists (not keys of their own: each section
    is ``credit.<name>``)."""

    sections: Callable[[], Mapping[str, type]]

    def problem(self, value: Any) -> bool:
        if not isinstance(value, Mapping):
            return True
        known = self.sections()
        return any(name not in known or not isinstance(item, known[name]) for name, item in value.items())

    def describe(self) -> str:
        return "a mapping of registered estimators' section names to their settings"


def setting(
    default: Any = MISSING,
    rule: Rule | None = None,
    *,
    factory: Callable[[], Any] | None = None,
    trainer_only: bool = False,
) -> Any:
    """A dataclass field with ``default`` (or ``factory``) and the :class:`Rule` it must obey.

    ``trainer_only``: the setting acts in the trainer alone (e.g. on its forward passes), never on
    credit routed from a file, so ``verl-credit route`` has no flag for it.
    """
    if rule is None:
        raise TypeError("setting() needs a rule")
    metadata = {"rule": rule, "trainer_only": trainer_only}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def rule_of(kind: type, name: str) -> Rule:
    """The rule of field ``name`` of the config dataclass ``kind``."""
    for item in fields(kind):
        if item.name == name:
            rule = item.metadata.get("rule")
            if rule is None:
                raise TypeError(
                    f"{kind.__name__}.{name} declares no rule: make it with verl_credit.config_rules.setting"
                )
            return rule
    raise KeyError(name)


def check_fields(section: Any, prefix: str, *, skip: tuple[str, ...] = ()) -> None:
    """Check every field of the dataclass instance ``section`` against its rule.

    Raises:
        ValueError: ``"<prefix>.<key> must be <what the rule accepts>, got <value>"`` for the
            first field that breaks its rule (``Weights`` name the entry: ``<key>.<name>``).
        TypeError: a field declares no rule (a programming error).
    """
    for item in fields(section):
        if item.name in skip:
            continue
        rule = rule_of(type(section), item.name)
        value = getattr(section, item.name)
        key = f"{prefix}.{item.name}"
        if isinstance(rule, Weights) and isinstance(value, Mapping):
            _check_weights(rule, value, key)
        if rule.problem(value):
            raise ValueError(f"{key} must be {rule.describe()}, got {value!r}")


def _check_weights(rule: Weights, value: Mapping[Any, Any], key: str) -> None:
    """Name the entry of a weight mapping that is missing, unknown or out of range."""
    missing = [name for name in rule.names if name not in value]
    if missing:
        raise ValueError(f"{key} is missing {missing} (it must map each of {rule.names} to a number)")
    unknown = [name for name in value if name not in rule.names]
    if unknown:
        raise ValueError(f"{key} has unknown key(s) {unknown} (known: {rule.names})")
    for name in rule.names:
        if rule.each.problem(value[name]):
            raise ValueError(f"{key}.{name} must be {rule.each.describe()}, got {value[name]!r}")


def field_docstrings(kind: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (a string right after the field);
    empty when the class's source cannot be read (e.g. a class made at run time)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(kind)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            if isinstance(following.value.value, str):
                docs[node.target.id] = following.value.value
    return docs
