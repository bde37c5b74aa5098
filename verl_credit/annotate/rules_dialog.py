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
    * refusal -- declines the user's request ("I'm sorry, but I can't ...", "unfortunately,
      that is not allowed under our policy").
    * mismatch -- reports that what a check returned does not match ("this doesn't match the line
      I retrieved", "reservation X does not match the flight you described").
    * options -- an enumerated list (``1.`` / ``-`` / ``*`` / ``a)`` lines, two or more) or an
      inline alternative in a question ("To card or store credit?").

User acts
    * affirmation ("yes", "go ahead", "please do", ...), at the start of the turn;
    * rejection of the preceding action: an explicit refusal of its proposal or its result -- an
      imperative "don't do that" / "stop" / "do not proceed", "that's not what I asked", "I
      didn't want ...", "why did you ...", "undo", "I said no", "that's wrong", or a turn that
      starts with a negative ("no", "nope", "don't", "stop") answering a *proposal*. Not one: a
      goal revision ("actually, make it an exchange instead"); a polite decline ("no thanks",
      "no, that's all"); a statement about the user ("I don't have it", "I don't want to change
      my plan" beside "I'm willing to refuel 2 GB": a partial decline that accepts the offer); an
      agreement ("Yes, that sounds correct. Please go ahead"); a report that a check found
      nothing ("Data Saver is off ... that's not the issue"); anything after a greeting or
      closing (an opening complaint rejects nothing: ``rules.py`` does not ask); declining an
      optional offer ("No, that's okay. Let me try another way"); a correction of data ("Yes, ...
      As for the address, it should be ...", "That doesn't sound right, there were three"); a
      "No" that goes on to ask for something narrower ("No, not the whole order. Could you cancel
      just the lamp?"); a simulated user's end token (``###STOP###``, ``###TRANSFER###``).
    * transfer request ("can I speak to a human / supervisor", "transfer me").
    * ordinal choice ("the second one", "the first option", "number 2", "the last one", "2").
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

__all__ = [
    "asks_for_input",
    "error_evidence",
    "is_affirmation",
    "is_generic_offer",
    "is_mismatch_report",
    "is_polite_decline",
    "is_proposal",
    "is_refusal",
    "is_rejection",
    "is_request",
    "is_transfer_request",
    "is_transfer_tool",
    "ordinal_choice",
    "parse_options",
    "strip_control_tokens",
]

_FLAGS = re.IGNORECASE


#: texts up to this length have their normalised form remembered; a longer one (a huge message) is
#: normalised afresh for each pattern, so that no cache keeps a copy of it alive
MAX_CACHED_CHARS = 1 << 16


def _normalized(text: str) -> str:
    """Lower case, curly quotes straightened: what every dialogue-act pattern is matched against."""
    if len(text) > MAX_CACHED_CHARS:
        return _normalize(text)
    return _normalized_cached(text)


@functools.lru_cache(maxsize=4096)
def _normalized_cached(text: str) -> str:
    return _normalize(text)


def _normalize(text: str) -> str:
    text = text.lower()
    if "\u2019" in text or "\u2018" in text:
        text = text.replace("\u2019", "'").replace("\u2018", "'")
    if "\u201c" in text or "\u201d" in text:
        text = text.replace("\u201c", '"').replace("\u201d", '"')
    return text


class _Pattern:
    """A dialogue-act regular expression, matched case-insensitively on :func:`_normalized` text.

    ``word_start``: every alternative of the pattern starts a word (or a quote or parenthesis),
    which lets the matcher skip the inside of words -- several times faster on long texts.
    """

    __slots__ = ("regex",)

    def __init__(self, pattern: str, word_start: bool = False):
        if word_start:
            pattern = r"(?<![a-z0-9_])(?=[a-z0-9(\"'])(?:" + pattern + ")"
        self.regex = re.compile(pattern)

    def search(self, text: str) -> re.Match[str] | None:
        return self.regex.search(_normalized(text))


_GENERIC_OFFER = _Pattern(
    r"how (can|may|could|might) i (help|assist)|what can i (do|help)|anything else|something else i can|"
    r"have a (great|good|nice|wonderful|lovely) (day|one|evening|weekend)|\bgoodbye\b|\bbye\b|"
    r"glad (i|to) (could |was able to )?help|you'?re (very )?welcome|"
    r"let me know if (you need|there'?s|there is|i can) (anything|something|help)|feel free to (reach out|contact|ask)",
    word_start=True,
)
_SPECIFIC_REQUEST = _Pattern(
    r"\b(provide|share|specify|choose|select|tell me|send me|give me)\b|which (one|option|item|order|product)|"
    r"what is your|what'?s your|could you (give|tell|share|provide|confirm)|can you (give|tell|share|provide|confirm)|"
    r"\byour (email|name|zip|order id|order number|user id|address|phone)",
    word_start=True,
)
_PROPOSAL = _Pattern(
    r"\b(shall|should|may|can) (i|we) (go ahead|proceed|process|cancel|refund|submit|place|make|update|change|modify|"
    r"exchange|return|book|apply|issue|do that|continue|add|remove|send|transfer|suspend|resume|enable|disable|"
    r"refuel|charge|upgrade|downgrade)|would you like (me|us) to|do you want (me|us) to|want me to go ahead|"
    r"(do|would) you (like|want|wish) to (proceed|go ahead|continue|confirm)|please confirm|"
    r"confirm (that|if|whether|you)|"
    r"(can|could) you (please )?confirm|is (that|this|everything) (correct|right|ok|okay|alright)|\bproceed\s*\?|"
    r"go ahead\s*\?|\b(ok|okay) to proceed|(reply|respond|answer|confirm) (with )?[\"'\u201c]?yes\b|"
    r"\bsay [\"'\u201c]?yes\b|\(yes/no\)|\byes or no\b|are you sure|do you (agree|approve|authori[sz]e|consent)|"
    r"(does|do) (that|this|these|everything) (sound|look)s? (good|right|correct|ok|okay|fine)|"
    r"let me know if (you'?d like|you want) (me )?to (proceed|go ahead|continue)|"
    r"(would|do) you (like|want) (me )?to (go ahead|proceed) with|"
    # an offered extra step: "Would you also like to return the lamp?", "Do you want to add insurance?"
    r"(would|do) you (also )?(like|want|wish) (me |us )?to (also )?(return|exchange|cancel|add|book|upgrade|downgrade|"
    r"change|modify|remove|include|use|apply|refund|purchase|buy|switch|update|keep|send|ship|order)\b",
    word_start=True,
)
_AFFIRMATION = _Pattern(
    r"^\W*(yes|yeah|yep|yup|sure|ok|okay|correct|confirm(ed)?|i confirm|please do|please proceed|go ahead|"
    r"proceed|do it|that'?s (right|correct|fine|good|perfect)|sounds good|absolutely|definitely|right|exactly|"
    r"of course|perfect|great|alright|all right)\b"
)
# affirmation after a short preamble ("Thanks! Yes, please go ahead", "That all looks correct. Please proceed.")
_AFFIRMATION_ANYWHERE = _Pattern(
    r"\b(please (go ahead|proceed|do (it|that|so)|book|cancel|add|apply|process|make|submit|update|refuel|"
    r"transfer|charge|send|confirm)|go ahead (and|with)|you can (go ahead|proceed)|let'?s (do|go with|proceed|"
    r"go ahead)|i (confirm|approve|authori[sz]e|agree)|i'?d like to (confirm|proceed|go ahead)|"
    r"(that|this|it|everything) (all )?(looks|sounds|is) (good|correct|right|perfect|great|fine)|"
    r"yes,? please|(that|this) works( for me)?)\b",
    word_start=True,
)
_PREAMBLE = _Pattern(r"^\W*(thanks|thank you|great|perfect|ok|okay|alright|all right|got it|understood)\b")
# an imperative refusal of what the agent does or proposes, at the start of a sentence
_IMPERATIVE_REJECTION = _Pattern(
    r"(^|[.!?;]\s+|\bno,?\s+|\bplease\s+|\bwait,?\s+|\bbut\s+)(don'?t|do not|never|stop|hold on,? don'?t)\s+"
    r"(do|doing|cancel|cancell?ing|refund|refunding|proceed|process|change|changing|charge|charging|submit|"
    r"book|booking|transfer|transferring|apply|applying|add|adding|remove|removing|modify|modifying|update|"
    r"updating|suspend|touch|go ahead|that|this|it)\b"
)
# "that's wrong": about what the agent did or proposed, or about a value it stated (then, with the
# corrected value or after a "yes", a correction of data rather than a rejection)
_DATA_CORRECTION = _Pattern(
    r"\bthat'?s (wrong|incorrect|not (right|correct))\b|"
    r"\b(this|that|it) (is|was) (wrong|incorrect|not (right|correct))\b|"
    r"\b(that|this|it) (doesn'?t|does not|didn'?t) (sound|look|seem) (right|correct)\b",
    word_start=True,
)
# ... with the value it should have: "it should be", "actually it's", "the correct one is", "I meant"
_CORRECTED_VALUE = _Pattern(
    r"\b(should be|should say|should read|is actually|it'?s actually|actually it'?s|the (correct|right) (one|\w+) is|"
    r"i meant|it'?s spelled|change it to|update it to|instead of|there (were|was|are|is|should be)|"
    r"i'?m (pretty |quite |fairly )?(sure|certain)|(check|look at) (that|it|this) again|double[- ]check|"
    r"(can|could) you (re-?check|check (that|it|this|again))|it'?s (only|just) (for )?(me|my))\b",
    word_start=True,
)
_EXPLICIT_REJECTION = _Pattern(
    r"not what i('?m| am| was)? (asked|wanted|want|meant|mean|said|requested|need|needed|looking for)|"
    r"\bi (didn'?t|did not|never) (ask|say|request|authori[sz]e|agree|approve|want)\b|"
    r"\bwhy did you\b|\bundo (that|this|it)\b|(^|[.!?]\s+)(no,? )?cancel that\b(?! one)|\bi said no\b|"
    r"\bi (said|told you) (not|no)\b|"
    r"\bi do not (authori[sz]e|approve|agree)\b|\bi don'?t (authori[sz]e|approve|agree to)\b|"
    r"\bi don'?t want (you to|that|this|it)\b|\bi do not want (you to|that|this|it)\b",
    word_start=True,
)
# "No," / "Nope." / "No -" (an interjection), not "No checked bags" (a determiner answering a question)
_NEGATIVE_START = _Pattern(
    r"^\W*((no|nope|nah)\b(?=\s*([,.!;:\u2014\u2013-]|$))|(nope|nah|don'?t|do not|stop|never)\b)"
)
_NOT_A_REFUSAL_START = _Pattern(
    r"^\W*no\W+(problem|worries|need to worry|rush|that'?s (right|correct|fine|perfect))\b|"
    r"^\W*no,? (it|that) (is|was) (right|correct)"
)
# the end-of-conversation tokens of simulated users (tau2: ###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###)
_CONTROL_TOKEN = re.compile(r"#{2,}\s*[A-Z][A-Z0-9_ -]*[A-Z0-9]\s*#{2,}")
# the turn, after its "No", asks for something else: a narrower or different action ("No, not the whole
# order. Could you cancel just the lamp?") -- a revision of the request, not a refusal
_COUNTER_REQUEST = _Pattern(
    r"\b((could|can|would|will) you( please)?|please|i'?d (like|prefer)|i would (like|prefer)|i (want|need) you to|"
    r"let'?s)\s+(?!keep\b|leave\b|stop\b|not\b|hold\b|wait\b|just keep\b|don'?t\b)[a-z]+|\binstead\b|"
    r"\b(just|only) (the|that|this|one|my|cancel|return|change|remove|add)\b",
    word_start=True,
)
_POLITE_DECLINE = _Pattern(
    r"^\W*no\W*(thanks?|thank you)\W*$|that'?s all|that is all|nothing else|i'?m good|all set|i'?m fine|"
    r"^\W*no\W+((that'?s|it'?s|that is) (ok|okay|alright|all right|fine)|need\b|worries)|"
    r"^\W*no\W+(i'?ll|i will|let me|i can|i'?m going to)\b|\b(not necessary|not needed|no need)\b"
)
# the turn accepts (part of) the offer: a decline in it is partial ("I'm willing to refuel 2 GB ... not the plan")
_ACCEPTS = _Pattern(
    r"\b(i'?m willing to|i'?ll (take|go with)|let'?s (do|go with|just|keep|proceed)|(can|could) you (please )?"
    r"(help me with|add|go ahead)|please (add|go ahead|proceed|book|apply)|go ahead|sounds (good|great|fine)|"
    r"(that|this) works|yes\b)",
    word_start=True,
)
# the turn asks the agent to do something else (with a "don't <verb>" that answers a question: a choice)
_ASKS_FOR = _Pattern(
    r"\b((can|could) you (please )?(cancel|book|change|apply|remove|update|process|keep|add)|"
    r"please (cancel|keep|book|change|add)|let'?s keep)\b",
    word_start=True,
)
_REFUSAL = _Pattern(
    r"\b(i'?m|i am|we'?re|we are) (sorry|afraid)\b[^.!?]{0,40}\b(can'?t|cannot|unable|not able|won'?t be able|"
    r"not allowed|"
    r"not permitted|not possible|not eligible)|\bunfortunately\b[^.!?]{0,80}\b(can'?t|cannot|unable|not able|"
    r"won'?t be able|not (allowed|permitted|possible|eligible)|isn'?t (allowed|permitted|possible|eligible)|"
    r"doesn'?t (allow|permit|qualify))|\b(i|we) (can'?t|cannot|am unable to|are unable to|am not able to|"
    r"won'?t be able to|am not allowed to|am not permitted to) (help|assist|do|process|modify|change|cancel|"
    r"refund|offer|provide|issue|make|grant|approve|add|remove|book|waive|apply|compensate|transfer|accommodate)|"
    r"\b(not|isn'?t) (allowed|permitted|eligible) (under|by|per|according to) (our|the) polic|"
    r"\b(our|the) polic(y|ies) (does not|doesn'?t|do not|don'?t) (allow|permit)|\bagainst (our|the) polic|"
    r"\b(can'?t|cannot|can not|may not) be (modified|changed|cancell?ed|refunded|upgraded|downgraded|removed|added|"
    r"booked|processed|exchanged|returned|waived|transferred)\b",
    word_start=True,
)
_MISMATCH = _Pattern(
    r"\b(does not|doesn'?t|did not|didn'?t|do not|don'?t|no longer|neither|none of [^.!?]{0,60}?)\s+"
    r"(seem to |appear to )?(match|correspond|line up|agree with)\b|\b(is|are|was|were) not a match\b|\bmismatch|"
    r"\b(there is|there'?s|i (see|notice|found)) "
    r"(a|an|some) (discrepanc|inconsisten|mismatch)|\bis (different|not the same) (from|as|than) (the|what|your)\b|"
    r"\b(is|are|was|were) not (directly )?(associated|linked|tied|registered) (with|to)\b|"
    r"\b(isn'?t|aren'?t|wasn'?t|weren'?t) (directly )?(associated|linked|tied|registered) (with|to)\b|"
    r"\b(doesn'?t|does not|didn'?t|did not) belong to\b",
    word_start=True,
)
_TRANSFER_REQUEST = _Pattern(
    r"\b(speak|talk|chat)(ing)? (to|with) (a |an |the |your )?(human|real person|person|supervisor|manager|"
    r"representative|agent|someone)|\btransfer (me|us)\b|\b(human|live) (agent|representative|person)\b|"
    r"\bescalate\b|\bsupervisor\b|\bmanager\b",
    word_start=True,
)
_TRANSFER_TOOL = re.compile(r"transfer|escalat|hand_?off|human", _FLAGS)
_EXAMPLES = re.compile(r"\((?:e\.g\.|eg\b|for example|such as|like)[^)]*\)", _FLAGS)
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
_ORDINAL_RE = _Pattern(
    rf"\bthe {_ORDINAL_WORD}\b|\b{_ORDINAL_WORD} (one|option|choice|item|slot|order)\b|^\W*{_ORDINAL_WORD}\b"
)
_NUMBERED_RE = _Pattern(r"\b(?:option|number|no\.|choice|#)\s*(\d{1,2})\b|^\W*(\d{1,2})\W*$")

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


def strip_control_tokens(text: str) -> str:
    """A user turn without simulated-user control tokens (``###STOP###`` and its family)."""
    return _CONTROL_TOKEN.sub(" ", text).strip() if text and "#" in text else (text or "")


def is_affirmation(text: str) -> bool:
    """A user turn that says yes (at its start, or after a short "thanks"/"great" preamble, or by an
    explicit "please go ahead" / "that all looks correct"), and rejects nothing."""
    text = strip_control_tokens(text)
    if not text or _EXPLICIT_REJECTION.search(text) or _IMPERATIVE_REJECTION.search(text):
        return False
    if _DATA_CORRECTION.search(text) and not (_AFFIRMATION.search(text) and not _NEGATIVE_START.search(text)):
        return False
    if _AFFIRMATION.search(text) and not _NEGATIVE_START.search(text):
        return True
    head = re.split(r"(?<=[.!?])\s+", text.strip())
    if len(head) > 1 and _PREAMBLE.search(head[0]) and _AFFIRMATION.search(head[1]):
        return True
    return bool(_AFFIRMATION_ANYWHERE.search(text)) and not _NEGATIVE_START.search(text)


def is_polite_decline(text: str) -> bool:
    """ "No thanks", "that's all", "I'm good", "No, that's okay. I'll try another way": declining an
    offer, not rejecting an action."""
    text = strip_control_tokens(text)
    return bool(text) and bool(_POLITE_DECLINE.search(text))


def is_rejection(text: str, preceding_is_proposal: bool, preceding_text: str | None = None) -> bool:
    """A user turn that rejects the preceding action (see the module docstring for the exact rule).

    An explicit refusal phrase rejects whatever preceded. An imperative "don't <verb>" rejects it
    when the verb is what the preceding action did or proposed (``preceding_text``: its text and
    tool names, when given; "don't do that" always), the turn does not start by saying yes, and --
    unless the action already did it ("transferred") -- the turn accepts nothing else ("Yes,
    cancel A -- please don't touch C", "keep B, don't cancel it; could you cancel D?" answer a
    question: a choice). A turn that starts with
    a negative rejects only a *proposal*, and not when it declines an optional offer ("No, that's
    okay, I'll try another way", "no thanks", "no problem") or, after the "No", asks for something
    narrower or different ("No, not the whole order. Could you cancel just the lamp?": a revision).
    "That's wrong" is a correction of data, not a rejection, when the turn starts with yes or gives
    the value it should have ("As for the address, it should be ..."). Control tokens of simulated
    users (``###STOP###``) are not words of the turn.
    """
    text = strip_control_tokens(text)
    if not text:
        return False
    if _EXPLICIT_REJECTION.search(text):
        return True
    starts_with_yes = bool(_AFFIRMATION.search(text)) and not _NEGATIVE_START.search(text)
    if _DATA_CORRECTION.search(text) and not starts_with_yes and not _CORRECTED_VALUE.search(text):
        return True
    if not starts_with_yes:
        before = _normalized(preceding_text) if preceding_text is not None else None
        for match in _IMPERATIVE_REJECTION.regex.finditer(_normalized(text)):
            verb = match.group(3)
            if before is None or verb in _GENERIC_OBJECTS:
                return True
            if verb[:5] not in before:
                continue  # "don't transfer me" when nobody mentioned a transfer: a wish, not a refusal
            done = re.search(
                rf"\b(being|been|have|has|i've|we've|was|were|am|is|are|i'm|we're|now|will be)\s+"
                rf"{re.escape(verb[:5])}\w*(ed|ing)\b|\b{re.escape(verb[:5])}\w*\(",
                before,
            )
            if done or not (_ACCEPTS.search(text) or _ASKS_FOR.search(text)):
                return True  # refuses what was done, or refuses the proposal and accepts nothing
            # else: "don't cancel A, cancel B" answering "which should I cancel?" -- a choice
    if not preceding_is_proposal or not _NEGATIVE_START.search(text):
        return False
    if _POLITE_DECLINE.search(text) or _NOT_A_REFUSAL_START.search(text):
        return False
    return not _COUNTER_REQUEST.search(text)


_GENERIC_OBJECTS = frozenset({"do", "doing", "that", "this", "it", "go ahead", "proceed"})


#: a wrapper some agents put around their text (``{"type": "message", "content": "..."}``)
_JSON_WRAPPER = re.compile(r'^\s*\{\s*"type"\s*:\s*"[\w-]+"\s*,\s*"content"\s*:\s*"')
#: a refusal is the main act of its message: it is said in the opening sentences
REFUSAL_LEAD_SENTENCES = 3
#: ... and the message does not go on to do what was asked
_PROCEEDS = _Pattern(
    r"\b(i'?m (glad|happy) to (proceed|help|process)|i'?ll (go ahead|proceed)|let me (go ahead|proceed)|"
    r"i (have|'ve) (processed|updated|cancelled|canceled|booked|issued))\b",
    word_start=True,
)


def _opening_sentences(text: str, count: int) -> str:
    text = _JSON_WRAPPER.sub("", text or "")
    return " ".join(re.split(r"(?<=[.!?])\s+|\n+", text.strip())[:count])


def is_refusal(text: str) -> bool:
    """Assistant text whose main act declines the user's request ("I'm sorry, but I can't ...",
    "Unfortunately, basic economy cannot be modified"): the decline is said in its opening
    sentences, and the text does not go on to do what was asked ("I'm glad to proceed ...")."""
    if not text:
        return False
    opening = _opening_sentences(text, REFUSAL_LEAD_SENTENCES)
    return bool(_REFUSAL.search(opening)) and not _PROCEEDS.search(text)


#: a user turn that asks for something (the request a refusal can answer)
_REQUESTS = _Pattern(
    r"\?|\b(can|could|would|will) you\b|\bplease\b|\bi'?d like\b|\bi would like\b|\bi (want|need|wish)\b|"
    r"\bi'?m (looking|hoping|trying) (for|to)\b|\b(is|are) there (any|a)\b|\bhow about\b|\bwhat about\b|\blet'?s\b",
    word_start=True,
)
# ... or an imperative: a turn (or sentence) that starts with a verb of an action
_IMPERATIVE = _Pattern(
    r"(^|[.!?]\s+)\W*((ok|okay|yes|no|then|well|so|alright|thanks|thank you|hi|hello|just|now)\W+)*"
    r"(move|change|cancel|book|refund|add|remove|upgrade|downgrade|switch|modify|transfer|update|return|exchange|"
    r"send|give|make|help|check|find|look|rebook|reschedule|waive|apply|issue|compensate|get|put|process|use|"
    r"charge|credit|reverse|reinstate|restore|reactivate|activate|enable|disable|suspend|resume|fix|reset|"
    r"replace|ship|deliver|extend|renew|split|combine|keep|drop)\b"
)


def is_request(text: str) -> bool:
    """A user turn that asks the agent for something (a question or a request)."""
    text = strip_control_tokens(text)
    return bool(text) and bool(_REQUESTS.search(text) or _IMPERATIVE.search(text))


#: an agent's request for input worded without a question mark or the trajectory model's "please
#: provide"-family verbs: "I'll need a few details: your user ID ...", "Please enter the code here."
_INPUT_REQUEST = _Pattern(
    r"(i|we) ?('ll|will|would|'d)? (also )?need (your|you to|a few|a valid|the following|some|more|a couple)\b|"
    r"please (enter|type|give|input|reply with|write|spell)\b|(enter|type) (it|the code|your [a-z]+) here",
    word_start=True,
)


def asks_for_input(text: str) -> bool:
    """Assistant text that requests input from the user in words the trajectory model's question
    test does not know (see ``Trajectory.from_messages``); its user reply is elicited."""
    return bool(text) and bool(_INPUT_REQUEST.search(text)) and not is_generic_offer(text)


def is_mismatch_report(text: str) -> bool:
    """Assistant text that reports an observed mismatch ("this doesn't match the line I retrieved")."""
    return bool(text) and bool(_MISMATCH.search(text))


def is_transfer_request(text: str) -> bool:
    """A user turn that asks for a human agent, a supervisor or a transfer."""
    return bool(text) and bool(_TRANSFER_REQUEST.search(text))


def is_transfer_tool(name: str) -> bool:
    """A tool that hands the conversation over (``transfer_to_human_agents``, ``escalate``, ...)."""
    return bool(name) and bool(_TRANSFER_TOOL.search(name))


def parse_options(text: str) -> list[str]:
    """Options an assistant turn lists: enumerated lines (two or more) or an inline ``A or B?``.

    Inline: in the last question that holds "or", a list ``A, B, or C`` gives its comma parts,
    otherwise the comma clause holding "or" is split on "or"; leading stopwords are dropped
    ("Would you like it on your card or store credit?" -> ``["card", "store credit"]``).
    Examples in parentheses ("the reason (e.g., change of plans, or other)?") are not options.
    """
    if not text:
        return []
    lines = [m.group(1) for m in (_ENUM_LINE.match(line) for line in text.splitlines()) if m]
    if len(lines) >= 2:
        return lines
    text = _EXAMPLES.sub("", text)
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


_WORD = re.compile(r"\S+")


def _short(text: str, limit: int = 120) -> str:
    """``text`` with its white space collapsed, cut to ``limit`` characters (``...`` marking a cut);
    reads only as many words as that takes (an error result may be a huge message)."""
    words: list[str] = []
    length = -1
    for match in _WORD.finditer(str(text)):
        words.append(match.group())
        length += 1 + len(words[-1])
        if length > limit:
            break
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3] + "..."
