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

import functools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "FREE_TEXT_NAMES",
    "STOPWORDS",
    "TRIVIAL_VALUES",
    "ArgUnit",
    "DateContext",
    "IndexedText",
    "OccurrenceIndex",
    "atomize",
    "canonical_call_signature",
    "extract_units",
    "extract_units_from_raw",
    "is_entity_atom",
    "is_free_text_argument",
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
_MATCH_TEXT = re.Match.group


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


@functools.lru_cache(maxsize=1 << 16)
def _normalize_cached(atom: str) -> str:
    return normalize_atom(atom)


#: texts from this length up to :data:`MAX_CACHED_CHARS` have their atoms remembered (the long
#: texts every trajectory of a task repeats: system prompt, tool list)
MIN_CACHED_CHARS = 2000
#: longer texts (a huge message) are atomised afresh each time: a cache would keep them, and their
#: atoms, alive after their trajectory is gone
MAX_CACHED_CHARS = 1 << 18


def _is_cached_size(text: str) -> bool:
    return MIN_CACHED_CHARS <= len(text) <= MAX_CACHED_CHARS


def _atomize_cached(text: str) -> Sequence[str]:
    """:func:`atomize` with the long texts every trajectory of a task repeats (system prompt, tool
    list) remembered (a tuple then: do not modify)."""
    if not _is_cached_size(text):
        return atomize(text)
    return _atomize_long(text)


@functools.lru_cache(maxsize=64)
def _atomize_long(text: str) -> tuple[str, ...]:
    return tuple(atomize(text))


def atomize(text: str) -> list[str]:
    """Text -> normalised atoms, in order. ``"3 pm"`` (a number then am/pm) becomes one time atom.

    The raw atoms are taken one at a time (not a list of them all first: on a 50 MB message that
    list alone is about 9x the text); the atoms themselves are shared strings (one per distinct
    spelling, :func:`_normalize_cached`)."""
    atoms: list[str] = []
    for raw in map(_MATCH_TEXT, _ATOM_RE.finditer(text or "")):
        atom = _normalize_cached(raw)
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


_MONTHS = {
    "jan": 1, "january": 1, "feb": 2, "february": 2, "mar": 3, "march": 3, "apr": 4, "april": 4, "may": 5,
    "jun": 6, "june": 6, "jul": 7, "july": 7, "aug": 8, "august": 8, "sep": 9, "sept": 9, "september": 9,
    "oct": 10, "october": 10, "nov": 11, "november": 11, "dec": 12, "december": 12,
}  # fmt: skip
_ORDINAL_DAY = re.compile(r"(\d{1,2})(st|nd|rd|th)?")
_SLASH_DATE = re.compile(r"(?<![\d/])(\d{1,2})/(\d{1,2})(?:/((?:19|20)?\d{2}))?(?![\d/])")
_ISO_DATE = re.compile(r"((?:19|20)\d{2})-(\d{2})-\d{2}(?:t.*)?")
_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
}  # fmt: skip
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}


def _spelled_value(words: list[str]) -> int | None:
    total, current = 0, 0
    for word in words:
        if word in _NUMBER_WORDS:
            current += _NUMBER_WORDS[word]
        else:
            current = max(current, 1) * _SCALES[word]
            if _SCALES[word] >= 1000:
                total, current = total + current, 0
    return total + current


class DateContext:
    """What the conversation so far fixes for dates in words: the latest year and month mentioned."""

    __slots__ = ("month", "year")

    def __init__(self) -> None:
        self.year: int | None = None
        self.month: int | None = None


def _day_of(atom: str) -> int | None:
    match = _ORDINAL_DAY.fullmatch(atom)
    if match is None:
        return None
    day = int(match.group(1))
    return day if 1 <= day <= 31 else None


def _year_of(atom: str) -> int | None:
    if len(atom) == 4 and atom.isdigit() and atom[:2] in ("19", "20"):
        return int(atom)
    return None


def derived_atoms(
    text: str, context: DateContext | None = None, atoms: Sequence[str] | None = None
) -> tuple[set[str], set[str]]:
    """``(added, date_days)`` for one text: ISO atoms of its dates in words and values of its spelled
    numbers; the day atoms that stand inside its dates in prose (and nowhere else in it).

    ``context`` supplies the year (and, for "the 21st", the month) a date leaves out and is updated
    with the latest ones the text mentions. Works on the text's atoms (``atoms`` when given).
    """
    added: set[str] = set()
    day_uses: dict[str, int] = {}
    if not text:
        return added, set()
    context = context if context is not None else DateContext()
    atoms = atoms if atoms is not None else atomize(text)
    count = len(atoms)
    latest_year: int | None = None
    spelled: list[str] = []

    def flush_spelled() -> None:
        if spelled:
            value = _spelled_value(spelled)
            if value is not None and value >= 10:
                added.add(str(value))
            spelled.clear()

    def date(month: int, day_atom: str, year: int | None) -> None:
        day = _day_of(day_atom)
        if day is None:
            return
        context.month = month
        day_uses[day_atom] = day_uses.get(day_atom, 0) + 1
        chosen = year if year is not None else context.year
        if chosen is not None:
            added.add(f"{chosen:04d}-{month:02d}-{day:02d}")

    for position, atom in enumerate(atoms):
        if atom.isalpha():
            if atom in _NUMBER_WORDS or atom in _SCALES:
                spelled.append(atom)
                continue
            if spelled and atom != "and":
                flush_spelled()
            month = _MONTHS.get(atom)
            if month is not None and position + 1 < count and _day_of(atoms[position + 1]) is not None:
                tail = _year_of(atoms[position + 2]) if position + 2 < count else None
                date(month, atoms[position + 1], tail)  # "May 26", "October 5th, 2024"
            continue  # a plain word
        if "_" in atom and any(ch.isalpha() for ch in atom):
            parts = atom.split("_")
            if all(part in _NUMBER_WORDS or part in _SCALES for part in parts):  # "twenty_five"
                spelled.extend(parts)
                continue
        flush_spelled()
        if not atom[0].isdigit():
            continue
        if len(atom) >= 10 and "-" in atom:
            iso = _ISO_DATE.fullmatch(atom)
            if iso is not None:
                latest_year = int(iso.group(1))
            continue
        year = _year_of(atom)
        if year is not None:
            latest_year = year
            continue
        if len(atom) > 4:
            continue
        if position + 1 < count and (atoms[position + 1] in _MONTHS or atoms[position + 1] == "of"):
            following, after = atoms[position + 1], position + 2
            if following == "of" and position + 2 < count:
                following, after = atoms[position + 2], position + 3
            month_after = _MONTHS.get(following)
            preceded_by_month = position > 0 and atoms[position - 1] in _MONTHS
            if month_after is not None and not preceded_by_month and _day_of(atom) is not None:
                tail = _year_of(atoms[after]) if after < count else None
                date(month_after, atom, tail)  # "26 May", "5th of October 2024"
                continue
        if (
            atom[-2:] in ("st", "nd", "rd", "th")
            and position > 0
            and atoms[position - 1] == "the"
            and context.month is not None
            and _day_of(atom) is not None
        ):
            date(context.month, atom, None)  # "the 21st": the month of the latest date mentioned
    flush_spelled()
    if "/" in text:
        for match in _SLASH_DATE.finditer(text):
            month, day = int(match.group(1)), int(match.group(2))
            year_text = match.group(3)
            year = int(("20" + year_text) if year_text and len(year_text) == 2 else year_text) if year_text else None
            chosen = year if year is not None else context.year
            if 1 <= month <= 12 and 1 <= day <= 31 and chosen is not None:
                added.add(f"{chosen:04d}-{month:02d}-{day:02d}")
    if latest_year is not None:
        context.year = latest_year
    occurrences: dict[str, int] = {}
    for atom in atoms:
        if atom in day_uses:
            occurrences[atom] = occurrences.get(atom, 0) + 1
    days = {atom for atom, uses in day_uses.items() if occurrences.get(atom, 0) <= uses}
    return added, days


@functools.lru_cache(maxsize=64)
def _derived_long(
    text: str, year: int | None, month: int | None
) -> tuple[frozenset[str], frozenset[str], int | None, int | None]:
    context = DateContext()
    context.year, context.month = year, month
    added, days = derived_atoms(text, context, _atomize_long(text))
    return frozenset(added), frozenset(days), context.year, context.month


class IndexedText:
    """A message's text prepared for unit look-ups (atom set plus the space-joined sequence).

    ``derived`` atoms (dates in words as ISO dates, spelled numbers; :func:`derived_atoms`) count for
    single-atom units; the day number of a date in prose does not (``"May 15"`` is not ``15``).

    Memory: the atom list is not kept (only the set of distinct atoms and the joined sequence, about
    the text's length); while it is built the peak is the list (8 bytes an atom) plus the joined
    sequence, about 2x an ASCII text.
    """

    __slots__ = ("atom_set", "joined")

    def __init__(self, text: str, context: DateContext | None = None):
        if not text:
            self.atom_set: frozenset[str] = frozenset()
            self.joined = "  "
            return
        atoms = _atomize_cached(text)
        if _is_cached_size(text):
            year, month = (context.year, context.month) if context is not None else (None, None)
            added, days, year, month = _derived_long(text, year, month)
            if context is not None:
                context.year, context.month = year, month
        else:
            added, days = derived_atoms(text, context, atoms)
        if added or days:
            atom_set = set(atoms)
            atom_set -= days
            atom_set |= added
            self.atom_set = frozenset(atom_set)
            del atom_set
        else:
            self.atom_set = frozenset(atoms)
        if not atoms:
            self.joined = "  "
        elif isinstance(atoms, list):  # ours: pad it in place rather than copy the joined text twice
            atoms.append("")
            atoms.insert(0, "")
            self.joined = " ".join(atoms)
        else:
            self.joined = " " + " ".join(atoms) + " "
        del atoms

    def contains(self, unit: ArgUnit) -> bool:
        for variant in unit.variants:
            if len(variant) == 1:
                if variant[0] in self.atom_set:
                    return True
            elif " " + " ".join(variant) + " " in self.joined:
                return True
        return False


class OccurrenceIndex:
    """Which of a list of texts contain a unit, by an inverted index atom -> text positions.

    ``find(unit)`` is the ascending list of positions whose text contains ``unit`` -- the same answer
    as testing every text, in time proportional to the texts holding the unit's rarest atom.
    """

    def __init__(self, texts: list[IndexedText], unindexed: frozenset[int] = frozenset()):
        self.texts = texts
        self.by_atom: dict[str, list[int]] = {}
        self.unindexed = sorted(unindexed)  # tested one by one (a long system prompt: cheaper than indexing)
        for position, text in enumerate(texts):
            if position in unindexed:
                continue
            for atom in text.atom_set:
                self.by_atom.setdefault(atom, []).append(position)
        self.cache: dict[str, list[int]] = {}

    def find(self, unit: ArgUnit) -> list[int]:
        cached = self.cache.get(unit.key)
        if cached is not None:
            return cached
        found: set[int] = set()
        for variant in unit.variants:
            if len(variant) == 1:
                found.update(self.by_atom.get(variant[0], ()))
                continue
            lists = [self.by_atom.get(atom, ()) for atom in variant]
            rarest = min(lists, key=len)
            for position in rarest:
                if position not in found and self.texts[position].contains(ArgUnit(unit.key, (variant,), "", 0)):
                    found.add(position)
        found.update(position for position in self.unindexed if self.texts[position].contains(unit))
        result = sorted(found)
        self.cache[unit.key] = result
        return result


#: argument names (or ``_``-separated parts of them) that hold prose for a reader, not a value
FREE_TEXT_NAMES = frozenset(
    """summary summaries reason reasons note notes description descriptions comment comments message messages
    explanation explanations thought thoughts remark remarks feedback justification rationale memo context
    narrative instructions""".split()
)
_CONSTRAINING_KEYS = ("enum", "const", "format", "pattern")


def is_free_text_argument(name: str, schema: Any = None, value: Any = None) -> bool:
    """A free-text argument: its name says prose (:data:`FREE_TEXT_NAMES`: the name, or its last
    ``_``-part, as in ``cancel_reason``) and its JSON schema (the argument's property schema) gives
    no ``enum``, ``const``, ``format`` or ``pattern``. Without a schema (``schema`` None) only a
    ``value`` that is prose (longer than a whole-value unit: over 64 characters or 5 atoms)
    counts: a short ``reason="no longer needed"`` may be an enum the schema would have named."""
    lowered = str(name).lower()
    parts = [part for part in re.split(r"[_\-\s.]+", lowered) if part]
    if not parts or not (lowered in FREE_TEXT_NAMES or parts[-1] in FREE_TEXT_NAMES):
        return False
    if isinstance(schema, dict):
        for option in [schema, *(schema.get("anyOf") or []), *(schema.get("oneOf") or [])]:
            if isinstance(option, dict) and any(option.get(key) is not None for key in _CONSTRAINING_KEYS):
                return False
        return True
    text = str(value).strip() if value is not None else ""
    return len(text) > MAX_WHOLE_VALUE_CHARS or len(atomize(text)) > MAX_WHOLE_VALUE_ATOMS


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


def extract_units(arguments: dict[str, Any], call: int = 0, properties: dict[str, Any] | None = None) -> list[ArgUnit]:
    """The information units of one tool call's parsed arguments, first occurrence of each key kept.

    A top-level free-text argument (:func:`is_free_text_argument`; ``properties`` is the tool
    schema's ``properties`` when known) gives none.
    """
    if not isinstance(arguments, dict):
        return _dedupe(_leaf_units(arguments, "", call))
    properties = properties if isinstance(properties, dict) else {}

    def generate() -> Iterator[ArgUnit]:
        for key, value in arguments.items():
            if isinstance(value, str) and is_free_text_argument(key, properties.get(key), value):
                continue
            yield from _leaf_units(value, str(key), call)

    return _dedupe(generate())


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
