"""Dialogue acts and error-like tool results for the rule annotator (no model; regular expressions).

Every function here classifies one piece of text; ``rules.py`` decides what the classes mean for
the graph. The patterns are deliberately conservative: a missed act makes the rules flag the
trajectory ``uncertain`` (or miss an edge), a wrong act makes a wrong edge.

Assistant acts
    * generic offer -- a greeting or closing that asks nothing specific ("Hello! How can I help
      you today?", "Is there anything else I can help you with?"). A user turn after it is
      treated as unelicited (see ``rules.py``).
    * proposal -- asks the user to approve an action ("Shall I proceed?", "Would you like me to
      cancel it?", "Please confirm ...").
    * options -- an enumerated list (``1.`` / ``-`` / ``*`` / ``a)`` lines, two or more) or an
      inline alternative in a question ("To card or store credit?").

User acts
    * affirmation ("yes", "go ahead", "please do", ...), at the start of the turn;
    * rejection of the preceding action: an explicit phrase ("don't do that", "that's not what
      I asked", "I didn't want ...", "why did you ...", "undo"), or a turn that starts with a
      negative ("no", "nope", "don't", "stop", "cancel") answering a *proposal*. A goal revision
      ("actually, make it an exchange instead") is not a rejection, nor is declining an offer
      politely ("no thanks", "no, that's all").
    * ordinal choice ("the second one", "the first option", "number 2", "the last one", "2").
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "error_evidence",
    "is_affirmation",
    "is_generic_offer",
    "is_polite_decline",
    "is_proposal",
    "is_rejection",
    "ordinal_choice",
    "parse_options",
]

_FLAGS = re.IGNORECASE

_GENERIC_OFFER = re.compile(
    r"how (can|may|could|might) i (help|assist)|what can i (do|help)|anything else|something else i can|"
    r"have a (great|good|nice|wonderful|lovely) (day|one|evening|weekend)|\bgoodbye\b|\bbye\b|"
    r"glad (i|to) (could |was able to )?help|you'?re (very )?welcome|"
    r"let me know if (you need|there'?s|there is|i can) (anything|something|help)|feel free to (reach out|contact|ask)",
    _FLAGS,
)
_SPECIFIC_REQUEST = re.compile(
    r"\b(provide|share|specify|choose|select|tell me|send me|give me)\b|which (one|option|item|order|product)|"
    r"what is your|what'?s your|could you (give|tell|share|provide|confirm)|can you (give|tell|share|provide|confirm)|"
    r"\byour (email|name|zip|order id|order number|user id|address|phone)",
    _FLAGS,
)
_PROPOSAL = re.compile(
    r"\b(shall|should|may|can) i (go ahead|proceed|process|cancel|refund|submit|place|make|update|change|modify|"
    r"exchange|return|book|apply|issue|do that|continue)|would you like me to|do you want me to|want me to go ahead|"
    r"(do|would) you (like|want|wish) to proceed|please confirm|confirm (that|if|whether|you)|"
    r"(can|could) you confirm|is (that|this) (correct|right|ok|okay|alright)|\bproceed\s*\?|go ahead\s*\?|"
    r"\b(ok|okay) to proceed",
    _FLAGS,
)
_AFFIRMATION = re.compile(
    r"^\W*(yes|yeah|yep|yup|sure|ok|okay|correct|confirm(ed)?|i confirm|please do|please proceed|go ahead|"
    r"proceed|do it|that'?s (right|correct|fine|good)|sounds good|absolutely|definitely|right|exactly|of course)\b",
    _FLAGS,
)
_EXPLICIT_REJECTION = re.compile(
    r"\b(don'?t|do not|never|stop)\b[^.!?]{0,25}\b(do|doing|cancel|cancell?ing|refund|refunding|proceed|process|"
    r"change|changing|charge|charging|submit|that|this|it)\b|that'?s (not|wrong|incorrect)|"
    r"not what i (asked|wanted|meant|said|requested)|i (didn'?t|did not|never) (ask|want|say|request|authori[sz]e)|"
    r"why did you|\bundo\b|\bcancel that\b|\bi said no\b",
    _FLAGS,
)
_NEGATIVE_START = re.compile(r"^\W*(no|nope|nah|don'?t|do not|stop|cancel|never)\b", _FLAGS)
_POLITE_DECLINE = re.compile(
    r"^\W*no\W*(thanks?|thank you)\W*$|that'?s all|that is all|nothing else|i'?m good|all set|i'?m fine", _FLAGS
)
_ENUM_LINE = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*\u2022]|[a-h][.)])\s+(.+?)\s*$")
_ORDINALS = {
    "first": 0,
    "1st": 0,
    "second": 1,
    "2nd": 1,
    "third": 2,
    "3rd": 2,
    "fourth": 3,
    "4th": 3,
    "fifth": 4,
    "5th": 4,
    "sixth": 5,
    "6th": 5,
    "seventh": 6,
    "7th": 6,
    "eighth": 7,
    "8th": 7,
    "ninth": 8,
    "9th": 8,
    "tenth": 9,
    "10th": 9,
    "last": -1,
}
_ORDINAL_WORD = "(" + "|".join(_ORDINALS) + ")"
_ORDINAL_RE = re.compile(
    rf"\bthe {_ORDINAL_WORD}\b|\b{_ORDINAL_WORD} (one|option|choice|item|slot|order)\b|^\W*{_ORDINAL_WORD}\b", _FLAGS
)
_NUMBERED_RE = re.compile(r"\b(?:option|number|no\.|choice|#)\s*(\d{1,2})\b|^\W*(\d{1,2})\W*$", _FLAGS)

_ERROR_START = re.compile(r"^\W*(error|exception|traceback|failed|failure|fatal|invalid)\b", _FLAGS)
_ERROR_ANYWHERE = re.compile(
    r"\bnot found\b|\bdoes not exist\b|\bdoesn'?t exist\b|\binvalid\b|\bexception\b|traceback \(most recent|"
    r"\bunable to\b|\bnot allowed\b|\bpermission denied\b|\bunknown (tool|function|order|user|item|product|id)\b|"
    r"\bmissing (required )?(argument|parameter|field)\b",
    _FLAGS,
)
MAX_SCANNED_ERROR_CHARS = 500
# question stems, articles and prepositions dropped from the front of an inline option
_LEAD_WORDS = frozenset(
    "to a an the your my our via by with for into onto on in at either would you like it do does want prefer "
    "should shall can could i we me is are be go have that this them back".split()
)


def is_generic_offer(text: str) -> bool:
    """A greeting or closing that asks for nothing specific (its user reply is not elicited)."""
    return (
        bool(text)
        and bool(_GENERIC_OFFER.search(text))
        and not _SPECIFIC_REQUEST.search(text)
        and not _PROPOSAL.search(text)
    )


def is_proposal(text: str) -> bool:
    """Assistant text that asks the user to approve an action."""
    return bool(text) and bool(_PROPOSAL.search(text))


def is_affirmation(text: str) -> bool:
    """A user turn that starts by saying yes (and does not reject anything)."""
    return bool(text) and bool(_AFFIRMATION.search(text)) and not _EXPLICIT_REJECTION.search(text)


def is_polite_decline(text: str) -> bool:
    """ "No thanks", "that's all", "I'm good": declining an offer, not rejecting an action."""
    return bool(text) and bool(_POLITE_DECLINE.search(text))


def is_rejection(text: str, preceding_is_proposal: bool) -> bool:
    """A user turn that rejects the preceding action (see the module docstring for the exact rule)."""
    if not text:
        return False
    if _EXPLICIT_REJECTION.search(text):
        return True
    if preceding_is_proposal and _NEGATIVE_START.search(text) and not _POLITE_DECLINE.search(text):
        return True
    return False


def parse_options(text: str) -> list[str]:
    """Options an assistant turn lists: enumerated lines (two or more) or an inline ``A or B?``.

    Inline: in the last question that holds "or", a list ``A, B, or C`` gives its comma parts,
    otherwise the comma clause holding "or" is split on "or"; leading stopwords are dropped
    ("Would you like it on your card or store credit?" -> ``["card", "store credit"]``).
    """
    if not text:
        return []
    lines = [m.group(1) for m in (_ENUM_LINE.match(line) for line in text.splitlines()) if m]
    if len(lines) >= 2:
        return lines
    questions = [q for q in re.split(r"(?<=[?])\s+|\n", text) if q.strip().endswith("?")]
    for question in reversed(questions):
        sentence = re.split(r"(?<=[.!:;])\s+", question.strip())[-1].rstrip("?").strip()
        if not re.search(r"\bor\b", sentence, _FLAGS):
            continue
        if re.search(r",\s*or\s+", sentence, _FLAGS):
            parts = re.split(r",\s*(?:or\s+)?", sentence)
        else:
            clause = next(c for c in sentence.split(",") if re.search(r"\bor\b", c, _FLAGS))
            parts = re.split(r"\s+or\s+", clause, flags=_FLAGS)
        options = [_strip_leading_stopwords(p) for p in parts]
        options = [o for o in options if o]
        if len(options) >= 2:
            return options
    return []


def _strip_leading_stopwords(text: str) -> str:
    words = text.strip().strip("'\"").split()
    while words and words[0].lower().strip("'\",") in _LEAD_WORDS:
        words.pop(0)
    return " ".join(words).strip("'\"")


def ordinal_choice(text: str, num_options: int) -> int | None:
    """0-based option index the user picks by position ("the second one", "number 2", "2"), or None."""
    if not text or num_options < 2:
        return None
    match = _ORDINAL_RE.search(text)
    if match:
        word = next(g for g in match.groups() if g and g.lower() in _ORDINALS).lower()
        index = _ORDINALS[word]
        index = num_options - 1 if index < 0 else index
        return index if index < num_options else None
    match = _NUMBERED_RE.search(text)
    if match:
        index = int(match.group(1) or match.group(2)) - 1
        return index if 0 <= index < num_options else None
    return None


def _json_error(value: Any) -> str | None:
    if isinstance(value, dict):
        for key in ("error", "errors", "error_message", "exception"):
            if value.get(key):
                detail = value[key]
                return detail if isinstance(detail, str) else json.dumps(detail, default=str)
        if value.get("success") is False or value.get("ok") is False:
            return str(value.get("message") or value.get("detail") or "success=false")
        if str(value.get("status", "")).lower() in ("error", "failure"):
            return str(value.get("message") or value.get("detail") or "status=error")
    return None


def error_evidence(content: str, flagged: bool = False) -> str | None:
    """The error a tool result reports (a short string), or None when the result looks fine.

    A result is an error when the environment flagged it (``flagged``); when it is a JSON object
    with a truthy ``error``/``errors``/``error_message``/``exception`` key, ``success: false``,
    ``ok: false`` or ``status: "error"``; or, for plain text (or a JSON string), when it starts
    with ``Error``/``Exception``/``Traceback``/``Failed``/``Invalid`` or -- within its first
    500 characters -- says "not found", "does not exist", "invalid", "unable to", "not
    allowed", "permission denied", "unknown <entity>" or "missing argument".
    """
    text = content or ""
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        parsed = text
    if isinstance(parsed, dict | list):
        found = _json_error(parsed)
        if found is None and flagged:
            found = text
        return _short(found) if found is not None else None
    if not isinstance(parsed, str):
        parsed = text
    if flagged or _ERROR_START.search(parsed) or _ERROR_ANYWHERE.search(parsed[:MAX_SCANNED_ERROR_CHARS]):
        return _short(parsed or "error")
    return None


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
