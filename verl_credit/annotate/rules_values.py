"""Concrete values for the rule annotator: atoms, information units and where they occur.

The rule annotator (``rules.py``) traces every *information unit* bound to a tool-call argument
back to the message it came from. This module defines what a unit is and how two spellings of
the same value are recognised, with no knowledge of actions, errors or dialogue.

Atoms
    Text is cut into *atoms*: maximal runs of ``[A-Za-z0-9_@#$.:'-]``. Each atom is normalised:
    surrounding punctuation stripped, lower-cased, a leading ``#`` or ``$`` dropped
    (``"#W12"`` -> ``"w12"``, ``"$54.20"`` -> ``"54.2"``), numbers written canonically
    (``"1,204.50"`` -> ``"1204.5"``, ``"54.00"`` -> ``"54"``), clock times canonically
    (``"3pm"``, ``"3 PM"``, ``"15:00"`` -> ``"15:00"``), a possessive ``'s`` and a plural ``s`` of a
    purely alphabetic atom longer than 3 letters dropped (``"returns"`` -> ``"return"``) and, inside
    atoms that hold a letter, ``-`` folded into ``_`` (``"store-credit"`` == ``"store_credit"``).
    A comma counts inside an atom only as a thousands separator (``"1,204"``). Matching is on
    whole atoms, so ``"card"`` never matches inside ``"credit_card_7"``.

Units
    Each leaf of a tool call's JSON arguments gives at most one unit (a string leaf of up to
    64 characters and 5 atoms is one unit as a whole, e.g. ``"123 Main St"``; a longer string
    gives one unit per entity atom inside it: atoms with a digit, ``@``, ``#`` or ``_``).
    Trivial values are not units: booleans, ``null``, integers ``-9..9``, one-character
    strings and ``yes/no/true/false/none/null/ok``. A unit matches a text when its atom
    sequence (or, for ``a_b`` enum tokens, the spaced variant ``a b``) occurs in the text's
    atom sequence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "STOPWORDS",
    "TRIVIAL_VALUES",
    "ArgUnit",
    "IndexedText",
    "atomize",
    "canonical_call_signature",
    "extract_units",
    "extract_units_from_raw",
    "is_entity_atom",
    "normalize_atom",
]

MAX_WHOLE_VALUE_CHARS = 64
MAX_WHOLE_VALUE_ATOMS = 5

TRIVIAL_VALUES = frozenset({"yes", "no", "true", "false", "none", "null", "ok", "okay", "n/a"})

# Words that never distinguish one option / reply from another.
STOPWORDS = frozenset(
    """a an the and or of to for in on at by with from into is are was were be been it its this that these those
    i me my you your we our us he she they them their his her please would like want could can will shall should
    do does did have has had just also one ones option options item items which what who how when where why there
    here some any all each per as so if but not no yes ok okay sure thanks thank hi hello hey well then than
    about up out via either both other another more most very too much many let know need get got go going
    i'd i'm i'll it's that's you're we're don't""".split()
)

_ATOM_RE = re.compile(r"(?:[A-Za-z0-9_@#$.:'\-]|,(?=\d{3}\b))+")
_STRIP_LEAD = "'.:-_"
_STRIP_TRAIL = "'.:-_"
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_TIME_RE = re.compile(r"(\d{1,2})(?::(\d{2}))?(am|pm|a\.m\.|p\.m\.)?")
_CLOCK_RE = re.compile(r"\d{1,2}:\d{2}")


def _canonical_number(text: str) -> str:
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - _NUMBER_RE guarantees a number
        return text
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _canonical_time(hour: int, minute: int, meridiem: str | None) -> str | None:
    if meridiem:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if meridiem.startswith("p") else 0)
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        return None
    return f"{hour}:{minute:02d}"


def normalize_atom(atom: str) -> str:
    """One raw atom -> its canonical form ("" when nothing is left). See the module docstring."""
    atom = atom.strip(_STRIP_LEAD).rstrip(_STRIP_TRAIL) if atom else atom
    atom = atom.lower()
    while atom[:1] in ("#", "$") and atom:
        atom = atom[1:]
    atom = atom.strip(_STRIP_LEAD).rstrip(_STRIP_TRAIL)
    if atom.endswith("'s") and len(atom) > 3:  # possessive: "Sara's" -> "sara"
        atom = atom[:-2]
    if not atom:
        return ""
    if _NUMBER_RE.fullmatch(atom):
        return _canonical_number(atom)
    time_match = _TIME_RE.fullmatch(atom)
    if time_match and (time_match.group(3) or _CLOCK_RE.fullmatch(atom)):
        canonical = _canonical_time(int(time_match.group(1)), int(time_match.group(2) or 0), time_match.group(3))
        if canonical:
            return canonical
    if atom.isalpha() and len(atom) > 3 and atom.endswith("s") and not atom.endswith("ss"):
        atom = atom[:-1]  # plural: "returns" == "return" (both sides are normalised alike)
    if any(ch.isalpha() for ch in atom):
        atom = atom.replace("-", "_")
    return atom


def atomize(text: str) -> list[str]:
    """Text -> normalised atoms, in order. ``"3 pm"`` (a number then am/pm) becomes one time atom."""
    atoms: list[str] = []
    for raw in _ATOM_RE.findall(text or ""):
        atom = normalize_atom(raw)
        if not atom:
            continue
        if atom in ("am", "pm", "a.m", "p.m") and atoms and atoms[-1].isdigit():
            canonical = _canonical_time(int(atoms[-1]), 0, atom[0] + "m")
            if canonical:
                atoms[-1] = canonical
                continue
        atoms.append(atom)
    return atoms


def is_entity_atom(atom: str, raw: str = "") -> bool:
    """An atom that names an entity on its own: it holds a digit, ``@`` or ``_`` (or was ``#``-prefixed)."""
    if raw.startswith("#"):
        return True
    if atom.lstrip("-").isdigit() and len(atom.lstrip("-")) == 1:
        return False  # small integers are everywhere
    return any(ch.isdigit() for ch in atom) or "@" in atom or "_" in atom


@dataclass(frozen=True)
class ArgUnit:
    """One information unit bound to a tool-call argument.

    ``key`` is the canonical atom sequence joined by spaces (the unit's identity); ``variants``
    are the atom sequences that count as an occurrence; ``label`` is ``"<arg path>=<value>"``
    for edge units; ``call`` is the position of the tool call inside its action.
    """

    key: str
    variants: tuple[tuple[str, ...], ...]
    label: str
    call: int


class IndexedText:
    """A message's text prepared for unit look-ups (atom set plus the space-joined sequence)."""

    __slots__ = ("atom_set", "atoms", "joined")

    def __init__(self, text: str):
        self.atoms = atomize(text)
        self.atom_set = frozenset(self.atoms)
        self.joined = " " + " ".join(self.atoms) + " "

    def contains(self, unit: ArgUnit) -> bool:
        for variant in unit.variants:
            if len(variant) == 1:
                if variant[0] in self.atom_set:
                    return True
            elif " " + " ".join(variant) + " " in self.joined:
                return True
        return False


def _unit_from_atoms(atoms: list[str], label: str, call: int) -> ArgUnit | None:
    if not atoms:
        return None
    if len(atoms) == 1:
        atom = atoms[0]
        if atom in TRIVIAL_VALUES or (len(atom) < 2 and not atom.isdigit()):
            return None
        if atom.lstrip("-").isdigit() and abs(int(atom)) < 10:
            return None
    variants = [tuple(atoms)]
    if len(atoms) == 1 and "_" in atoms[0] and any(ch.isalpha() for ch in atoms[0]):
        spaced = tuple(part for part in atoms[0].split("_") if part)
        if len(spaced) > 1:
            variants.append(spaced)
    return ArgUnit(" ".join(atoms), tuple(variants), label[:120], call)


def _leaf_units(value: Any, path: str, call: int) -> Iterator[ArgUnit]:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaf_units(item, f"{path}.{key}" if path else str(key), call)
        return
    if isinstance(value, list | tuple):
        for item in value:
            yield from _leaf_units(item, path, call)
        return
    if isinstance(value, int | float):
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return
        unit = _unit_from_atoms(
            [_canonical_number(repr(value)) if isinstance(value, float) else str(value)], f"{path}={value}", call
        )
        if unit is not None:
            yield unit
        return
    text = str(value).strip()
    atoms = atomize(text)
    if not atoms:
        return
    if len(text) <= MAX_WHOLE_VALUE_CHARS and len(atoms) <= MAX_WHOLE_VALUE_ATOMS:
        unit = _unit_from_atoms(atoms, f"{path}={text}", call)
        if unit is not None:
            yield unit
        return
    # Free text: only the entity atoms inside it are units.
    for raw in _ATOM_RE.findall(text):
        atom = normalize_atom(raw)
        if atom and is_entity_atom(atom, raw):
            unit = _unit_from_atoms([atom], f"{path}={raw.strip(_STRIP_TRAIL)}", call)
            if unit is not None:
                yield unit


def _dedupe(units: Iterator[ArgUnit]) -> list[ArgUnit]:
    seen: set[str] = set()
    out: list[ArgUnit] = []
    for unit in units:
        if unit.key not in seen:
            seen.add(unit.key)
            out.append(unit)
    return out


def extract_units(arguments: dict[str, Any], call: int = 0) -> list[ArgUnit]:
    """The information units of one tool call's parsed arguments, first occurrence of each key kept."""
    return _dedupe(_leaf_units(arguments, "", call))


def extract_units_from_raw(raw_arguments: str, call: int = 0) -> list[ArgUnit]:
    """Values of an unparseable arguments string (labelled ``<raw>=...``): only atoms with a digit
    or ``@``, or ``#``-prefixed ones (``_`` is left out here: it would pick up the argument names)."""

    def generate() -> Iterator[ArgUnit]:
        for raw in _ATOM_RE.findall(raw_arguments or ""):
            atom = normalize_atom(raw)
            if (
                atom
                and is_entity_atom(atom, raw)
                and (raw.startswith("#") or "@" in atom or any(ch.isdigit() for ch in atom))
            ):
                unit = _unit_from_atoms([atom], f"<raw>={raw.strip(_STRIP_TRAIL)}", call)
                if unit is not None:
                    yield unit

    return _dedupe(generate())


def _canonical_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical_value(v) for v in value]
    if isinstance(value, str):
        return " ".join(atomize(value))
    if isinstance(value, float) and value == int(value) and abs(value) < 1e15:
        return int(value)
    return value


def canonical_call_signature(name: str, arguments: dict[str, Any], raw_arguments: str, valid: bool) -> str:
    """Identity of a call up to spelling: tool name plus arguments with every string atom-normalised.

    Two calls with equal signatures are "the same call" for the retry rule (case, whitespace,
    ``#``/``$`` prefixes and number formatting do not make a call different).
    """
    payload: Any = _canonical_value(arguments) if valid else " ".join(atomize(raw_arguments))
    return name + "|" + json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
