"""Generate ``docs/configuration.md``: every ``credit.*`` key of the trainer, and the estimators.

The keys, their types, allowed values and defaults come from the code, never from this file:

* the settings dataclasses (``verl_credit.verl.settings.CreditSettings``, which holds
  ``verl_credit.config.CreditConfig``) give each key's type (the field's annotation) and what it
  accepts (the rule every field declares, ``verl_credit.config_rules``);
* the defaults are what ``verl_credit.verl.settings.load_settings`` builds from the ``credit`` node
  of ``verl_credit/config/credit_trainer.yaml`` (the trainer's own parsing and validation);
* a key's meaning is the field's docstring in the dataclass, else :data:`EXTRA_MEANINGS` below,
  else the comment right above the key in the yaml;
* the ``algorithm.adv_estimator`` values are the estimators of ``verl_credit.estimators``.

Usage::

    python scripts/docs_config.py          # write docs/configuration.md
    python scripts/docs_config.py --check  # exit 1 when docs/configuration.md is stale
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from verl_credit.config import CreditConfig
from verl_credit.config_rules import Choice, PluginSections, Rule, Section, Weights, field_docstrings
from verl_credit.estimators.registry import BUILTIN_MODULES, estimator_names, get_estimator
from verl_credit.verl.settings import CreditSettings, credit_estimators, load_settings

ROOT = Path(__file__).resolve().parents[1]
TRAINER_YAML = ROOT / "verl_credit" / "config" / "credit_trainer.yaml"
DOC_PATH = ROOT / "docs" / "configuration.md"

#: the fields of :class:`CreditSettings` whose keys sit directly under ``credit`` (not under
#: ``credit.<field>``): ``load_settings`` builds ``CreditSettings.credit`` (the credit math,
#: :class:`CreditConfig`) from the top-level keys ``credit.estimator``, ``credit.iapo``, ...
INLINED_FIELDS: frozenset[tuple[type, str]] = frozenset({(CreditSettings, "credit")})

#: meanings of keys whose field has no docstring (the dataclasses under ``verl_credit/verl/`` are
#: not edited for the docs) and whose yaml comment is not a meaning of its own
EXTRA_MEANINGS: dict[str, str] = {
    "credit.user.temperature": "Sampling temperature of the `llm` user's replies.",
    "credit.user.max_tokens": "Most tokens of one `llm`-user reply.",
    "credit.user.timeout": "Seconds per request of the `llm` user.",
    "credit.user.max_retries": "Retries (with backoff) of a failed `llm`-user request before the session fails.",
}

#: what each CALL-CREDIT role of ``credit.call_credit.omega`` is (``verl_credit.annotate.roles``)
ROLE_MEANINGS: dict[str, str] = {
    "IG": "information gathering: reads, views, searches, or runs something only to learn about the code",
    "AE": "action execution: changes files or state, e.g. edits, writes, patches, creates, deletes, installs",
    "RV": "result verification: checks a change, e.g. runs tests, type checks, linters, builds, a reproduction",
}

_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")
_RST_ROLE = re.compile(r":(?:func|mod|class|data|attr|meth|obj):`~?([^`]+)`")
_KEY_PREFIX = re.compile(r"^``credit[\w.*]*``\s*:\s*")


@dataclass(frozen=True)
class KeyDoc:
    """One documented ``credit.*`` key (a leaf value, not a section)."""

    key: str
    type_text: str
    default_text: str
    accepts_text: str
    meaning: str


@dataclass(frozen=True)
class SectionDoc:
    """One ``credit`` section (``credit`` itself, ``credit.iapo``, ``credit.call_credit.counterfactual``, ...)."""

    key: str
    about: str
    keys: list[KeyDoc]


@dataclass(frozen=True)
class _Field:
    """A leaf field found by walking the settings classes."""

    key: str
    section: str
    owner: type
    name: str
    annotation: str
    rule: Rule
    attribute_path: tuple[str, ...]
    weight_name: str | None = None


# --------------------------------------------------------------------------- reading the sources


def credit_node(yaml_path: Path = TRAINER_YAML) -> dict[str, Any]:
    """The trainer yaml's ``credit`` node as plain data, interpolations unresolved."""
    return OmegaConf.to_container(OmegaConf.load(yaml_path), resolve=False)["credit"]


def yaml_credit_keys(node: Mapping[str, Any], prefix: str = "credit") -> list[str]:
    """Every key of a ``credit`` node, walked recursively, as full dotted names."""
    keys: list[str] = []
    for name, value in node.items():
        key = f"{prefix}.{name}"
        keys.append(key)
        if isinstance(value, Mapping):
            keys.extend(yaml_credit_keys(value, key))
    return keys


def yaml_comments(text: str) -> dict[str, str]:
    """The comment block written right above each key of a yaml text (no blank line between), by
    full dotted key. Only block mappings are followed (the trainer yaml has no other nesting)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^( *)([A-Za-z_][\w-]*)\s*:", line)
        if match is None:
            pending = []
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if pending:
            comments[".".join(name for _, name in stack)] = " ".join(pending)
        pending = []
    return comments


def yaml_lines(text: str) -> dict[str, int]:
    """The line number of each key of a yaml text, by full dotted key (the order of the docs)."""
    lines: dict[str, int] = {}
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines()):
        match = re.match(r"^( *)([A-Za-z_][\w-]*)\s*:", line)
        if match is None or line.lstrip().startswith("#"):
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        lines.setdefault(".".join(name for _, name in stack), number)
    return lines


def settings_sections(kind: type = CreditSettings, prefix: str = "credit") -> Iterator[tuple[str, type]]:
    """Every section key (``credit``, ``credit.iapo``, ...) and the settings class it documents."""
    yield prefix, kind
    for item in fields(kind):
        rule = item.metadata.get("rule")
        if not isinstance(rule, Section):
            continue
        if (kind, item.name) in INLINED_FIELDS:
            yield from (entry for entry in settings_sections(rule.kind, prefix) if entry[0] != prefix)
        else:
            yield from settings_sections(rule.kind, f"{prefix}.{item.name}")


def settings_field_keys(kind: type = CreditSettings, prefix: str = "credit") -> list[str]:
    """The full key of every field of the settings dataclasses, sections included (an inlined
    field is not a key of its own: its fields are)."""
    keys: list[str] = []
    for item in fields(kind):
        rule = item.metadata.get("rule")
        if isinstance(rule, PluginSections):
            continue  # plug-in estimators' sections: documented by their packages
        inlined = (kind, item.name) in INLINED_FIELDS
        key = prefix if inlined else f"{prefix}.{item.name}"
        if not inlined:
            keys.append(key)
        if isinstance(rule, Section):
            keys.extend(settings_field_keys(rule.kind, key))
    return keys


def _leaf_fields(kind: type, prefix: str, path: tuple[str, ...] = ()) -> Iterator[_Field]:
    for item in fields(kind):
        rule = item.metadata.get("rule")
        if rule is None:
            raise TypeError(f"{kind.__name__}.{item.name} declares no rule")
        if isinstance(rule, PluginSections):
            continue  # plug-in estimators' sections: documented by their packages
        if isinstance(rule, Section):
            inlined = (kind, item.name) in INLINED_FIELDS
            yield from _leaf_fields(rule.kind, prefix if inlined else f"{prefix}.{item.name}", (*path, item.name))
            continue
        key = f"{prefix}.{item.name}"
        annotation = str(item.type)
        yield _Field(key, prefix, kind, item.name, annotation, rule, (*path, item.name))
        if isinstance(rule, Weights):
            for name in rule.names:
                yield _Field(f"{key}.{name}", prefix, kind, item.name, "float", rule.each, (*path, item.name), name)


# --------------------------------------------------------------------------- formatting


def builtin_estimators() -> list[str]:
    """The estimators shipped with verl-credit, in :data:`BUILTIN_MODULES` order (the registry's own
    order depends on which module the process imported first; plug-ins are left out)."""
    rank = {module: index for index, module in enumerate(BUILTIN_MODULES)}
    names = [name for name in estimator_names() if type(get_estimator(name)).__module__ in rank]
    return sorted(names, key=lambda name: rank[type(get_estimator(name)).__module__])


def clean_text(text: str) -> str:
    """A docstring or comment as one markdown line: rst literals and roles become code spans."""
    text = _RST_ROLE.sub(r"``\1``", inspect.cleandoc(text))
    text = text.replace("``", "`")
    return " ".join(text.split())


def no_html(text: str) -> str:
    """``text`` with ``<``/``>`` outside code spans escaped (markdown would read them as HTML tags)."""
    parts = text.split("`")
    escaped = (
        part if index % 2 else part.replace("<", "&lt;").replace(">", "&gt;") for index, part in enumerate(parts)
    )
    return "`".join(escaped)


def cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return no_html(text.replace("\n", " ").replace("|", "\\|"))


def value_text(value: Any) -> str:
    """A value as it is written in the yaml."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value if value and yaml.safe_load(value) == value and "#" not in value else json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{name}: {value_text(item)}" for name, item in value.items()) + "}"
    raise TypeError(f"no yaml form for {value!r}")


def type_text(annotation: str) -> str:
    """A field annotation in yaml words (``tuple[str, ...]`` is a list, ``None`` is ``null``)."""
    text = annotation.replace("tuple[str, ...]", "list[str]").replace("Mapping[", "mapping[")
    return re.sub(r"\bNone\b", "null", text).replace("Any", "any")


def accepts_text(rule: Rule) -> str:
    """What a key accepts, from its declared rule."""
    if isinstance(rule, Choice):
        names = builtin_estimators() if rule.options is estimator_names else list(rule.names())
        text = "one of " + ", ".join(f"`{name}`" for name in names)
        return text + (" (or a plug-in estimator)" if rule.options is estimator_names else "")
    if isinstance(rule, Weights):
        return f"a mapping of {', '.join(rule.names)}, each {rule.each.describe()}"
    return rule.describe()


def _value_at(settings: Any, attribute_path: tuple[str, ...], weight_name: str | None) -> Any:
    value = settings
    for name in attribute_path:
        value = getattr(value, name)
    return value[weight_name] if weight_name is not None else value


def _dataclass_default(owner: type, name: str, weight_name: str | None) -> Any:
    for item in fields(owner):
        if item.name == name:
            if item.default is not MISSING:
                value = item.default
            elif item.default_factory is not MISSING:
                value = item.default_factory()
            else:
                return MISSING
            return value[weight_name] if weight_name is not None else value
    raise KeyError(name)


def _yaml_value(node: Mapping[str, Any], key: str) -> Any:
    value: Any = {"credit": node}
    for name in key.split("."):
        if not isinstance(value, Mapping) or name not in value:
            return MISSING
        value = value[name]
    return value


def _resolved_node(node: Mapping[str, Any], algorithm: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with ``${algorithm.X}`` replaced by the yaml's ``algorithm.X``, else by the field's
    own default (the trainer takes it from verl's ``ppo_trainer.yaml``, where both agree)."""
    resolved: dict[str, Any] = {}
    for name, value in node.items():
        match = _INTERPOLATION.match(value) if isinstance(value, str) else None
        if isinstance(value, Mapping):
            resolved[name] = _resolved_node(value, algorithm)
        elif match is not None:
            source = match.group(1).split(".")
            if source[0] == "algorithm" and len(source) == 2 and source[1] in algorithm:
                resolved[name] = algorithm[source[1]]
            else:
                resolved[name] = _dataclass_default(CreditConfig, name, None)
        else:
            resolved[name] = value
    return resolved


# --------------------------------------------------------------------------- the document


def sections(yaml_path: Path = TRAINER_YAML) -> list[SectionDoc]:
    """Every ``credit`` section with its keys, in the order of the trainer yaml.

    Raises:
        ValueError: a key of the yaml has no settings field (the trainer would refuse it), or a key
            has no meaning written anywhere.
    """
    text = yaml_path.read_text(encoding="utf-8")
    whole = OmegaConf.to_container(OmegaConf.load(yaml_path), resolve=False)
    node = whole["credit"]
    algorithm = whole.get("algorithm") or {}
    leaves = list(_leaf_fields(CreditSettings, "credit"))
    documented = {leaf.key for leaf in leaves} | set(settings_field_keys())
    unknown = [key for key in yaml_credit_keys(node) if key not in documented]
    if unknown:
        raise ValueError(f"keys of {yaml_path.name} with no settings field: {', '.join(unknown)}")
    loaded = load_settings(_resolved_node(node, algorithm))
    comments = yaml_comments(text)
    lines = yaml_lines(text)
    docstrings = {leaf.owner: field_docstrings(leaf.owner) for leaf in leaves}

    def order(key: str) -> tuple[int, int]:
        return (0, lines[key]) if key in lines else (1, 0)

    result: list[SectionDoc] = []
    for section_key, kind in sorted(settings_sections(), key=lambda entry: order(entry[0])):
        rows = sorted((leaf for leaf in leaves if leaf.section == section_key), key=lambda leaf: order(leaf.key))
        about = clean_text(_KEY_PREFIX.sub("", inspect.cleandoc(kind.__doc__ or "")))
        about = about[:1].upper() + about[1:]
        if section_key == "credit":
            about = (
                "The top-level keys: the estimator and GRPO's normalization (`verl_credit.config.CreditConfig`) "
                "and the training-row layout (`verl_credit.verl.settings.CreditSettings`)."
            )
        result.append(
            SectionDoc(section_key, about, [_key_doc(leaf, node, loaded, docstrings, comments) for leaf in rows])
        )
    return result


def _key_doc(
    leaf: _Field,
    node: Mapping[str, Any],
    loaded: CreditSettings,
    docstrings: Mapping[type, Mapping[str, str]],
    comments: Mapping[str, str],
) -> KeyDoc:
    if leaf.weight_name is not None:
        meaning = (
            f"omega({leaf.weight_name}), the weight of {leaf.weight_name} calls ({ROLE_MEANINGS[leaf.weight_name]})."
        )
    else:
        written = docstrings[leaf.owner].get(leaf.name) or EXTRA_MEANINGS.get(leaf.key) or comments.get(leaf.key)
        if not written:
            raise ValueError(
                f"{leaf.key} has no meaning written: add a docstring under the field, a comment above the key in "
                f"{TRAINER_YAML.name}, or an entry of EXTRA_MEANINGS in {Path(__file__).name}"
            )
        meaning = clean_text(written)
    value = _value_at(loaded, leaf.attribute_path, leaf.weight_name)
    default = f"`{value_text(value)}`"
    raw = _yaml_value(node, leaf.key)
    match = _INTERPOLATION.match(raw) if isinstance(raw, str) else None
    if match is not None:
        default += f" (follows `{match.group(1)}`)"
    elif raw is MISSING:
        meaning += f" Not in the trainer yaml: set it with `+{leaf.key}=...`."
    code_default = _dataclass_default(leaf.owner, leaf.name, leaf.weight_name)
    if code_default is not MISSING and _comparable(code_default) != _comparable(value):
        default += f" (code default `{value_text(code_default)}`)"
    return KeyDoc(leaf.key, type_text(leaf.annotation), default, accepts_text(leaf.rule), meaning)


def _comparable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_comparable(item) for item in value]
    if isinstance(value, Mapping):
        return {name: _comparable(item) for name, item in value.items()}
    return value


def estimator_rows() -> list[tuple[str, str, str, str]]:
    """``(name, needs, trainer, what it does)`` of each shipped estimator."""
    only_credit_trainer = set(credit_estimators())
    rows = []
    for name in builtin_estimators():
        estimator = get_estimator(name)
        module = sys.modules[type(estimator).__module__]
        summary = clean_text((module.__doc__ or "").split("\n\n")[0])
        summary = re.sub(rf"^`{re.escape(name)}`\s*:\s*", "", summary)
        summary = summary[:1].upper() + summary[1:]
        needs = ", ".join(f"`{need}`" for need in sorted(estimator.needs)) or "nothing"
        trainer = "`credit_sync` only" if name in only_credit_trainer else "any (verl's own trainer too)"
        rows.append((f"`{name}`", needs, trainer, summary))
    return rows


def render(yaml_path: Path = TRAINER_YAML) -> str:
    """The text of ``docs/configuration.md``."""
    found = sections(yaml_path)
    count = sum(len(section.keys) for section in found)
    in_yaml = not any("Not in the trainer yaml" in key.meaning for section in found for key in section.keys)
    any_trainer = [f"`{name}`" for name in builtin_estimators() if name not in credit_estimators()]
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/docs_config.py from verl_credit/config/credit_trainer.yaml and the settings",
        "dataclasses; do not edit by hand: run `python scripts/docs_config.py` (tests/docs fail when it is stale). -->",
        "",
        "The trainer (`python -m verl_credit.main`, config `verl_credit/config/credit_trainer.yaml`) reads every",
        "verl-credit setting from one top-level node, `credit`. "
        + ("Every key below is already in that yaml, so a" if in_yaml else "A key already in that yaml"),
        "Hydra override needs no `+` (`credit.iapo.clip_c=0.5`). `python -m verl_credit.main` validates the",
        "whole node before Ray starts (`verl_credit.verl.settings.load_settings`): an unknown key, a value of",
        "the wrong type (`'0.5'` for a number, `'false'` or `0` for a boolean, a float for a count), a value that",
        "is not finite or one outside the range in the *Accepts* column is an error naming the key.",
        "",
        f"{count} keys in {len(found)} sections. *Type* is the settings field's type, *Default* the value the",
        "trainer yaml gives (as loaded and validated), *Accepts* the rule the field declares",
        "(`verl_credit/config_rules.py`).",
        "",
        "## Advantage estimators (`algorithm.adv_estimator`)",
        "",
        "`algorithm.adv_estimator` picks the estimator; `credit.estimator` follows it. The registered values",
        "(`verl_credit/estimators/`; a package's `verl_credit.estimators` entry points, or a module named",
        "in `VERL_CREDIT_ESTIMATORS`, can register more):",
        "",
        "| Value | Needs from a rollout | Trainer mode | What it does |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| {' | '.join(cell(part) for part in row)} |" for row in estimator_rows()]
    out += [
        "",
        f"Every estimator but {', '.join(any_trainer) or 'none'} needs `trainer.v1.trainer_mode=credit_sync` (the "
        "trainer yaml's default): its inputs travel in `extra_fields`.",
        "",
        "An estimator's settings are its own section, `credit.<section>.*` (the dataclass it declares as "
        "`Estimator.settings`; docs/design.md section 9). A plug-in's section is not in the trainer yaml: "
        "give its keys with a `+` (`+credit.recency.decay=0.5`); they are checked like every key below. "
        "`verl-credit route` has a flag for each (`--<section>-<key>`, docs/cli.md).",
        "",
        "## Keys",
        "",
        "Sections: " + ", ".join(f"[`{section.key}`](#{_anchor(section.key)})" for section in found) + ".",
    ]
    for section in found:
        out += ["", f"### `{section.key}`", ""]
        if section.about:
            out += [no_html(section.about), ""]
        if not section.keys:
            continue
        out += ["| Key | Type | Default | Accepts | Meaning |", "| --- | --- | --- | --- | --- |"]
        for key in section.keys:
            parts = (f"`{key.key}`", key.type_text, key.default_text, key.accepts_text, key.meaning)
            out.append(f"| {' | '.join(cell(part) for part in parts)} |")
    return "\n".join(out) + "\n"


def _anchor(key: str) -> str:
    """The GitHub anchor of a ``### `key``` heading."""
    return re.sub(r"[^\w\- ]", "", key.lower()).replace(" ", "-")


# --------------------------------------------------------------------------- checks


def documented_keys(doc: str) -> set[str]:
    """Every ``credit.*`` key written as a code span in a document."""
    return set(re.findall(r"`(credit(?:\.[\w-]+)*)`", doc))


def missing_keys(doc: str, keys: Iterable[str]) -> list[str]:
    """The keys of ``keys`` that ``doc`` never names (as a code span)."""
    named = documented_keys(doc)
    return [key for key in keys if key not in named]


def main(argv: list[str] | None = None) -> int:
    where = DOC_PATH.relative_to(ROOT) if DOC_PATH.is_relative_to(ROOT) else DOC_PATH
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {where} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else None
        if current != text:
            print(f"{where} is stale: run python scripts/docs_config.py", file=sys.stderr)
            return 1
        print(f"{where} is up to date")
        return 0
    DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
    DOC_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
