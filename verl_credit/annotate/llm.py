"""LLM annotator: a frozen model behind an OpenAI-compatible endpoint (docs/design.md section 5).

One request per trajectory to ``POST {base_url}/chat/completions`` (vLLM's ``vllm serve``), with

* ``temperature = 0`` and JSON-schema constrained output: ``response_format = {"type":
  "json_schema", "json_schema": {"name": "influence_graph", "schema": answer_schema(T),
  "strict": true}}`` (vLLM structured outputs; the schema pins ``num_actions``, bounds every
  index to ``0..T-1`` and every direct-input count to ``0..``:data:`MAX_DIRECT_INPUTS`);
* the versioned prompt of :mod:`verl_credit.annotate.prompt`;
* several endpoints used round-robin with health tracking: an endpoint that failed (no answer,
  5xx, 429, a 200 that is no chat completion) is skipped for a cool-down (``endpoint_cooldown``
  seconds, doubled per consecutive failure, at least its ``Retry-After``) and the retry of a
  failed attempt goes to another endpoint when one is healthy;
* at most ``concurrency`` requests in flight (an ``asyncio.Semaphore``, held only while a
  request is on the wire, not while a retry waits);
* a per-attempt limit ``timeout`` seconds (the whole exchange, not just one socket read) and a
  request deadline ``deadline`` for the trajectory (all attempts and waits);
* retries per the project's one retry table and schedule (:data:`verl_credit.openai_chat.RETRY_TABLE`,
  :class:`~verl_credit.openai_chat.RetryPolicy`, jittered): 408/429/5xx, timeouts, refused or reset
  connections and unreadable response bodies are retried; a ``Retry-After`` header (seconds or an HTTP date)
  is honoured, capped at ``retry_after_cap``, and never waited for past the request deadline
  (nor when another endpoint is healthy); other 4xx answers are final;
* ``parse_retries`` more attempts when the model's answer is unusable (empty, truncated, not
  JSON, or breaking the answer contract);
* the answer read from the body alone: the body is decoded here (a ``Content-Encoding`` that
  does not fit it is ignored), ``Content-Type`` is not consulted, an odd ``usage`` counts as no
  tokens -- none of them costs a good graph;
* a malformed base URL is a ``ValueError`` naming it when the annotator is built;
* a prompt that fits the server's context: the budget is ``max_model_len - max_tokens -``
  :data:`PROMPT_TOKEN_MARGIN` (and at most ``max_prompt_tokens``), ``max_model_len`` read once
  from the server's ``GET /v1/models`` (vLLM reports it) unless given, else
  :data:`FALLBACK_MAX_MODEL_LEN`; longer prompts have texts cut in the middle, every action kept
  (:func:`verl_credit.annotate.prompt.build_annotation_prompt`), counted in
  ``LLMStats.truncated_prompts`` and ``AnnotationResult.prompt_truncated``. A prompt that cannot
  fit (``prompt_too_long``) and a context-length error of the server (``context_length``, HTTP
  400 "maximum context length ...") are final failures: counted, then the fallback; the length
  the server names in such an error lowers the budget of later requests.

Nothing slow runs on the event loop that serves the other agent sessions: rendering a long
transcript (more than :data:`INLINE_MAX_CHARS` characters), parsing a long reply, the sqlite
cache (:mod:`.cache`, attached from outside by :class:`~verl_credit.annotate.cache.CachedAnnotator`)
and the rule fallback (the rule annotator's own worker thread) run in worker threads
(:func:`verl_credit.annotate.base.run_blocking`). The HTTP clients ignore
``HTTP(S)_PROXY`` (``trust_env=False``: the endpoints are cluster-local) unless ``trust_env``.

The answer is the answer alone (:func:`extract_answer`): reasoning (``<think>`` blocks) is
dropped, then the whole message if it is one JSON value, else the last fenced block, else the last
top-level JSON object -- never an object quoted earlier in the prose. It must keep the contract
(:func:`answer_problems`: every required key, integer indices in range, bounded counts, enum
signs and types); an answer that breaks it is invalid (``schema``): retried, then the fallback,
and never cached. A valid answer is validated with :func:`verl_credit.graph.validate_graph`
(what the schema cannot exclude -- ``src >= dst``, a sign/type mismatch, duplicates -- dropped
and counted), then checked against the transcript by the rules' binding checks
(:mod:`verl_credit.annotate.edge_checks`): an edge whose unit names values that ``a_i`` did not
supply or ``a_j`` does not use is dropped and counted (``LLMStats.unbound_edges``), so that an
instruction planted in the transcript cannot add edges.
On final failure the trajectory falls back to the rule annotator (``fallback="rules"``) or the
uniform graph (``fallback="uniform"``); the failure is counted in :class:`LLMStats` and the
result's ``source`` says ``fallback:...``. :meth:`LLMAnnotator.annotate_one` never raises for a
network or content failure.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import math
import os
import random
import re
import ssl
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from verl_credit.annotate import defaults
from verl_credit.annotate.base import AnnotationResult, Annotator, annotator_class, register_annotator, run_blocking
from verl_credit.annotate.edge_checks import drop_unbound_edges
from verl_credit.annotate.prompt import PROMPT_VERSION, AnnotationPrompt, build_annotation_prompt
from verl_credit.graph import EDGE_TYPES, SIGNS, GraphValidation, InfluenceGraph, graph_json_schema, validate_graph
from verl_credit.openai_chat import (
    ACCEPT_ENCODING,
    EndpointPool,
    RetryPolicy,
    decode_body,
    finite_retry_after,
    make_async_client,
    read_body,
    status_failure,
    transport_failure,
)
from verl_credit.trajectory import Trajectory

__all__ = [
    "ANSWER_CONTRACT",
    "ANSWER_KEYS",
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "FALLBACKS",
    "FALLBACK_MAX_MODEL_LEN",
    "INLINE_MAX_CHARS",
    "MAX_DIRECT_INPUTS",
    "PROMPT_TOKEN_MARGIN",
    "AnnotationFailure",
    "LLMAnnotator",
    "LLMStats",
    "answer_problems",
    "answer_schema",
    "chat_completions_url",
    "extract_answer",
    "is_context_length_error",
    "models_url",
    "parse_graph_completion",
    "strip_reasoning",
]

_LOG = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "Qwen/Qwen3-32B"
FALLBACKS: tuple[str, ...] = ("rules", "uniform")
API_KEY_ENV = "VERL_CREDIT_ANNOTATOR_API_KEY"
#: connections per httpx client; the pool is split into ceil(concurrency / POOL_SHARD_SIZE) clients
POOL_SHARD_SIZE = 4
#: failure kinds that say the endpoint itself is unwell (it is then skipped for a while)
#: the context length assumed when it is neither given nor reported by ``GET /v1/models``
#: (``scripts/serve_annotator.sh`` serves ``--max-model-len 32768``)
FALLBACK_MAX_MODEL_LEN = 32768
#: tokens of the context kept free besides the reply budget (estimation slack)
PROMPT_TOKEN_MARGIN = 64
#: transcripts (characters of message texts and arguments) and reply bodies (bytes) up to this
#: size are rendered / parsed on the event loop: cheaper there than a hop to a worker thread
INLINE_MAX_CHARS = 16384
#: seconds before asking ``/v1/models`` again after no endpoint answered
MODEL_LEN_PROBE_RETRY_S = 30.0
T = TypeVar("T")

#: the version of the answer contract (:func:`answer_problems`, :func:`extract_answer`), part of the cache key
ANSWER_CONTRACT = "answer-v3"  # v3: edges checked against the transcript (edge_checks)
#: the keys every answer must have (the constrained-output schema's ``required``)
ANSWER_KEYS: tuple[str, ...] = ("num_actions", "errors", "direct_user_inputs", "edges")
#: the largest direct-user-input count of one action an answer may give (in the schema and checked):
#: information units of unelicited user turns consumed by one action, each counted once
MAX_DIRECT_INPUTS = 16
#: seconds an endpoint is skipped after its first failure, doubled per further consecutive
#: failure up to :data:`ENDPOINT_COOLDOWN_MAX_S`; a success clears it
ENDPOINT_COOLDOWN_S = 1.0
ENDPOINT_COOLDOWN_MAX_S = 30.0
#: the largest response body read (bytes, also after decompression); a longer one is ``bad_response``
MAX_RESPONSE_BYTES = 32 * 1024 * 1024

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?")
_CANONICAL_INDEX = re.compile(r"0|[1-9][0-9]{0,9}")
_HOST = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?)*\.?"
)
# vLLM: "This model's maximum context length is 32768 tokens. However, you requested ...",
# "... is longer than the maximum model length of 32768", "Input prompt (N tokens) is too long and
# exceeds limit of M"; OpenAI: "context_length_exceeded"
_CONTEXT_LENGTH = re.compile(
    r"context.length|maximum model length|max_model_len|too long and exceeds|"
    r"(?:prompt|input|messages?) (?:is )?too long|too many (?:input |prompt )?tokens",
    re.IGNORECASE,
)
_CONTEXT_LIMIT = re.compile(
    r"(?:maximum context length is|maximum model length (?:of|is)|exceeds limit of)\s*(\d+)", re.IGNORECASE
)


class AnnotationFailure(Exception):
    """One failed attempt or a final failure; ``kind`` is the :class:`LLMStats` failure key."""

    def __init__(self, kind: str, message: str, *, retryable: bool = True, retry_after: float | None = None):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass
class LLMStats:
    """Counts over the annotator's lifetime.

    ``requests``: HTTP requests sent (attempts). ``retries``: attempts after the first, per
    trajectory. ``failures``: failed attempts by kind -- ``http_429``, ``http_5xx``, ``http_4xx``,
    ``timeout``, ``connect``, ``transport``, ``bad_response`` (a 200 whose body is not a chat
    completion), ``empty``, ``truncated``, ``malformed_json``, ``schema`` (valid JSON that cannot be
    repaired into a graph), ``context_length`` (the server refused the prompt as too long),
    ``prompt_too_long`` (not sent: over the budget even with every text cut to its floor),
    ``deadline`` (not sent: the request deadline had passed), ``internal``. ``schema`` also
    counts answers that break the answer contract (:func:`answer_problems`). ``fallbacks``:
    trajectories that fell back. ``truncated_prompts``: prompts
    whose texts were shortened to fit the budget. ``max_model_len``: the context length the last
    budget was computed from (0: no budget). ``unbound_edges``: edges of valid answers dropped by
    the rules' binding checks (:mod:`verl_credit.annotate.edge_checks`; also in ``repaired_edges``).
    """

    requests: int = 0
    retries: int = 0
    annotated: int = 0
    fallbacks: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated_prompts: int = 0
    max_model_len: int = 0
    unbound_edges: int = 0

    def count_failure(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "annotated": self.annotated,
            "fallbacks": self.fallbacks,
            "failures": dict(sorted(self.failures.items())),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "truncated_prompts": self.truncated_prompts,
            "max_model_len": self.max_model_len,
            "unbound_edges": self.unbound_edges,
        }


def chat_completions_url(base_url: str) -> str:
    """``http://h:8000`` / ``http://h:8000/v1`` / a full ``.../chat/completions`` URL -> the endpoint.

    Raises ``ValueError`` naming the URL when it is malformed: not ``http(s)://``, no host or an
    invalid one, a port outside 1..65535, whitespace, a query or fragment, or a path that names
    another API (``.../models``, ``.../completions``).
    """
    text = base_url.strip() if isinstance(base_url, str) else ""
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"annotator base URL must start with http:// or https://, got {base_url!r}")
    url = text.rstrip("/")
    problem = _url_problem(url)
    if problem is not None:
        raise ValueError(f"annotator base URL {base_url!r} is malformed: {problem}")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return f"{url}/chat/completions"
    return f"{url}/v1/chat/completions"


def _url_problem(url: str) -> str | None:
    """Why ``url`` (``http(s)://...``, stripped) cannot be an endpoint base, else ``None``."""
    if any(c.isspace() for c in url) or any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "it contains whitespace or control characters"
    if "," in url:
        return "it contains a comma (give several endpoints as separate URLs)"
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        return str(exc)
    host = parsed.host
    if not host:
        return "it has no host"
    if ":" not in host and not _HOST.fullmatch(host):  # IPv6 literals arrive without brackets
        return f"invalid host {host!r}"
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return f"port {parsed.port} is outside 1..65535"
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        return "it has a query or fragment"
    path = parsed.path.rstrip("/")
    if "/chat/completions" in path and not path.endswith("/chat/completions"):
        return f"path {parsed.path!r} continues after /chat/completions"
    if path.endswith(("/models", "/completions", "/embeddings")) and not path.endswith("/chat/completions"):
        return f"path {parsed.path!r} names another API, not the chat-completions base"
    return None


def models_url(endpoint: str) -> str:
    """The ``/models`` URL beside a ``.../chat/completions`` endpoint."""
    return endpoint[: -len("/chat/completions")] + "/models"


def is_context_length_error(status: int, text: str) -> bool:
    """A 4xx answer saying the prompt (plus the reply budget) exceeds the model's context."""
    return 400 <= status < 500 and _CONTEXT_LENGTH.search(text) is not None


def strip_reasoning(content: str) -> str:
    """Remove ``<think>...</think>`` blocks and surrounding whitespace; unwrap the last fenced block
    (the answer rule of :func:`extract_answer`)."""
    text = _THINK_BLOCK.sub("", content).strip()
    fenced = _fenced_blocks(text)
    if fenced:
        text = fenced[-1].strip()
    return text


def _fenced_blocks(text: str) -> list[str]:
    """Bodies of the fenced code blocks of ``text``, in order; an opening fence without its closing
    one (a cut answer) yields everything after it."""
    blocks = [match.group(1) for match in _FENCED.finditer(text)]
    rest = _FENCED.sub("", text)
    opening = _OPEN_FENCE.search(rest)
    if opening is not None:
        blocks.append(rest[opening.end() :])
    return blocks


def _top_level_objects(text: str) -> list[tuple[int, int, Any]]:
    """``(start, end, value)`` of every complete JSON object of ``text`` that is not inside another
    one, in order (prose between them is skipped)."""
    decoder = json.JSONDecoder()
    found: list[tuple[int, int, Any]] = []
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found.append((start, end, value))
            start = text.find("{", end)
        else:  # pragma: no cover - raw_decode at "{" only yields objects
            start = text.find("{", start + 1)
    return found


def extract_answer(content: str, finish_reason: str | None = None) -> Any:
    """The model's answer in ``content`` -- and only the answer -- as a JSON value.

    The rule (in this order):

    1. reasoning is never the answer: ``<think>...</think>`` blocks are removed (an unterminated
       ``<think>`` means the answer never came);
    2. the whole remaining message, when it is one JSON value (the constrained-decoding case);
    3. else, when the message has fenced code blocks, the **last** fenced block, which must be one
       JSON value in full (earlier blocks and the prose around are explanation);
    4. else the **last** top-level JSON object of the message (reasoning prose comes before the
       answer, so an object quoted in it -- a decoy -- is superseded); when the completion was cut
       (``finish_reason == "length"``) that object must end the message, else the answer is
       the cut one.

    The chosen value is the answer even when it is unusable: no other object of the message is
    tried instead. Raises :class:`AnnotationFailure` (``truncated`` / ``malformed_json``) when
    there is no answer.
    """
    truncated = finish_reason == "length"
    cut_kind = "truncated" if truncated else "malformed_json"
    text = _THINK_BLOCK.sub("", content).strip()
    if re.search(r"<think>", text, re.IGNORECASE):
        raise AnnotationFailure(cut_kind, "unterminated <think> block")
    whole = _loads(text)
    if whole is not _NOTHING:
        return whole
    fenced = _fenced_blocks(text)
    if fenced:
        answer = _loads(fenced[-1].strip())
        if answer is _NOTHING:
            raise AnnotationFailure(cut_kind, f"the last fenced block is not one JSON value: {fenced[-1][:120]!r}")
        return answer
    objects = _top_level_objects(text)
    if not objects:
        raise AnnotationFailure(cut_kind, f"answer is not a JSON object: {text[:120]!r}")
    _, end, answer = objects[-1]
    if truncated and text[end:].strip():
        raise AnnotationFailure("truncated", "the completion was cut after the last complete JSON object")
    return answer


_NOTHING = object()


def _loads(text: str) -> Any:
    """``json.loads(text)``, or :data:`_NOTHING` when ``text`` is not exactly one JSON value."""
    if not text:
        return _NOTHING
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return _NOTHING


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def answer_problems(raw: Any, num_actions: int) -> list[str]:
    """Where ``raw`` breaks the answer contract (the schema of :func:`answer_schema`); ``[]`` when
    it keeps it.

    The contract is the constrained-output schema, checked by type: an object with every
    required key (``num_actions``, ``errors``, ``direct_user_inputs``, ``edges``); every index a
    JSON integer (not a string, a float or a boolean) in ``0..num_actions-1``; every
    ``direct_user_inputs`` key a canonical decimal index and every count an integer in
    ``0..MAX_DIRECT_INPUTS``; every error mark and edge an object with all of its keys, signs and
    types from their enums, texts as strings. Unknown extra keys are ignored. What a schema
    cannot say (``src < dst``, a sign that does not fit its type, duplicates) is left to
    :func:`verl_credit.graph.validate_graph`, which repairs and counts it.
    """
    if not isinstance(raw, dict):
        return [f"the answer is not a JSON object ({type(raw).__name__})"]
    problems: list[str] = []
    missing = [key for key in ANSWER_KEYS if key not in raw]
    if missing:
        problems.append(f"missing required key(s) {', '.join(missing)}")
    declared = raw.get("num_actions")
    if "num_actions" in raw and not (_is_int(declared) and declared == num_actions):
        problems.append(f"num_actions is {_short(declared)}, not {num_actions}")

    def index_problem(where: str, value: Any) -> None:
        if not _is_int(value):
            problems.append(f"{where} is {_short(value)}, not an integer")
        elif not 0 <= value < num_actions:
            problems.append(f"{where} = {value} is not an action (0..{num_actions - 1})")

    def text_problem(where: str, item: dict[str, Any], key: str) -> None:
        if key not in item:
            problems.append(f"{where} has no {key!r}")
        elif not isinstance(item[key], str):
            problems.append(f"{where}.{key} is {_short(item[key])}, not a string")

    errors = raw.get("errors", [])
    if not isinstance(errors, list):
        problems.append("errors is not a list")
        errors = []
    for position, mark in enumerate(errors):
        where = f"errors[{position}]"
        if not isinstance(mark, dict):
            problems.append(f"{where} is not an object")
            continue
        if "action" not in mark:
            problems.append(f"{where} has no 'action'")
        else:
            index_problem(f"{where}.action", mark["action"])
        text_problem(where, mark, "kind")
        text_problem(where, mark, "evidence")
    direct = raw.get("direct_user_inputs", {})
    if not isinstance(direct, dict):
        problems.append("direct_user_inputs is not an object")
        direct = {}
    for key, count in direct.items():
        where = f"direct_user_inputs[{key!r}]"
        if not (_CANONICAL_INDEX.fullmatch(key) and int(key) < num_actions):
            problems.append(f"{where}: the key is not an action index (0..{num_actions - 1})")
        if not _is_int(count):
            problems.append(f"{where} = {_short(count)} is not an integer")
        elif not 0 <= count <= MAX_DIRECT_INPUTS:
            problems.append(f"{where} = {_short(count)} is outside 0..{MAX_DIRECT_INPUTS}")
    edges = raw.get("edges", [])
    if not isinstance(edges, list):
        problems.append("edges is not a list")
        edges = []
    for position, edge in enumerate(edges):
        where = f"edges[{position}]"
        if not isinstance(edge, dict):
            problems.append(f"{where} is not an object")
            continue
        for key in ("src", "dst"):
            if key not in edge:
                problems.append(f"{where} has no {key!r}")
            else:
                index_problem(f"{where}.{key}", edge[key])
        if edge.get("sign") not in SIGNS:
            problems.append(f"{where}.sign is {_short(edge.get('sign'))}, not one of {list(SIGNS)}")
        if edge.get("type") not in EDGE_TYPES:
            problems.append(f"{where}.type is {_short(edge.get('type'))}, not one of {list(EDGE_TYPES)}")
        text_problem(where, edge, "unit")
    return problems


def _short(value: Any) -> str:
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def answer_schema(num_actions: int) -> dict[str, Any]:
    """The constrained-output schema sent with each request: :func:`verl_credit.graph.graph_json_schema`
    with every ``direct_user_inputs`` count bounded by :data:`MAX_DIRECT_INPUTS` (the contract
    :func:`answer_problems` checks)."""
    schema = copy.deepcopy(graph_json_schema(num_actions))
    counts = schema["properties"]["direct_user_inputs"]["additionalProperties"]
    counts["maximum"] = MAX_DIRECT_INPUTS
    return schema


def parse_graph_completion(
    content: str | None, finish_reason: str | None, num_actions: int
) -> tuple[InfluenceGraph, GraphValidation]:
    """The model's answer -> a validated graph; raises :class:`AnnotationFailure` when unusable.

    The answer is found by :func:`extract_answer` and must keep the contract of
    :func:`answer_problems`; otherwise it is invalid (``schema``): retried, then the fallback,
    never cached. Failure kinds: ``empty``, ``truncated`` (``finish_reason == "length"`` and no
    complete answer), ``malformed_json``, ``schema``. What the schema cannot express (an edge
    with ``src >= dst``, a sign/type mismatch, a duplicate) is repaired by the validator and
    counted in the returned validation.
    """
    truncated = finish_reason == "length"
    if content is None or not content.strip():
        raise AnnotationFailure("truncated" if truncated else "empty", "the model returned no content")
    raw = extract_answer(content, finish_reason)
    problems = answer_problems(raw, num_actions)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise AnnotationFailure("schema", "; ".join(problems[:3]) + more)
    graph, validation = validate_graph(raw, num_actions)
    if validation.fallback:
        raise AnnotationFailure("schema", "; ".join(validation.problems) or "graph failed validation")
    return graph, validation


@functools.lru_cache(maxsize=256)
def _schema_for(num_actions: int) -> dict[str, Any]:
    """``answer_schema(num_actions)``, built once per size (read-only: it is only serialized)."""
    return answer_schema(num_actions)


async def _with_deadline(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable`` cancelled after ``seconds`` (``asyncio.TimeoutError``). Uses
    ``asyncio.timeout`` (3.11+, no extra task per request) where it exists, else ``wait_for``."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with timeout(seconds):
        return await awaitable


@register_annotator("llm")
class LLMAnnotator(Annotator):
    """Influence graphs from a frozen LLM served over the OpenAI chat-completions API.

    Args:
        base_urls: one URL or several (a list, or a comma-separated string), used round-robin;
            ``http://host:8000``, ``http://host:8000/v1`` and the full endpoint are all accepted.
        model: served model name (``vllm serve ... --served-model-name``); part of the cache key.
        concurrency: requests in flight at most (also the batch concurrency).
        timeout: seconds per request (whole exchange).
        max_retries: extra attempts after transport/HTTP failures.
        parse_retries: extra attempts after an unusable answer (empty, truncated, invalid).
        backoff_base, backoff_max: backoff before retry ``k`` is drawn from
            ``[d/2, d]`` with ``d = min(backoff_max, backoff_base * 2**(k-1))``.
        retry_after_cap: longest ``Retry-After`` wait honoured, in seconds.
        deadline: seconds for one trajectory's whole annotation (every attempt and every wait);
            ``None``: ``timeout * (max_retries + 1)``. No attempt runs past it and no wait
            (backoff or ``Retry-After``) ends past it: such a retry is not made (the failure is
            final, then the fallback).
        endpoint_cooldown, endpoint_cooldown_max: an endpoint that failed (no answer, 5xx, 429, a
            200 that is no chat completion) is skipped for ``endpoint_cooldown`` seconds, doubled
            per further consecutive failure up to ``endpoint_cooldown_max`` (at least its
            ``Retry-After``); a success clears it. When every endpoint is cooling down, the one
            that recovers first is used.
        fallback: ``rules`` or ``uniform``, used after the last failed attempt.
        max_tokens: completion budget; a graph answer is small, thinking needs more.
        enable_thinking: sent as ``chat_template_kwargs.enable_thinking`` (Qwen3; ``None`` sends
            nothing, for servers that reject unknown fields).
        max_chars_per_message: transcript texts longer than this are clipped in the prompt.
        max_model_len: the server's context length in tokens; ``None`` asks ``GET /v1/models``
            of every endpoint once (the smallest ``max_model_len`` reported; vLLM reports it) and
            assumes :data:`FALLBACK_MAX_MODEL_LEN` when none does; ``0`` sets no context budget.
        max_prompt_tokens: a cap on the prompt's estimated tokens (``None``: none); the budget
            is the smaller of this and ``max_model_len - max_tokens - PROMPT_TOKEN_MARGIN``.
        api_key: ``Authorization: Bearer`` token (``vllm serve --api-key``); default from the
            ``VERL_CREDIT_ANNOTATOR_API_KEY`` environment variable.
        extra_body: more request fields merged into every payload.
        trust_env: let httpx read ``HTTP(S)_PROXY``/``ALL_PROXY``/``NO_PROXY`` and
            ``SSL_CERT_FILE`` from the environment (off: the annotator talks to cluster-local
            endpoints, and a proxy set for the outside world must not reroute them).
        transport, client: inject an ``httpx.AsyncBaseTransport`` (e.g. ``httpx.MockTransport``)
            or a whole ``httpx.AsyncClient`` (not closed by :meth:`aclose`).
        rules_annotator, rules_options: the fallback rule annotator (default
            the registered ``rules`` annotator built with ``rules_options``).
        jitter_seed: seed of the backoff jitter (reproducible tests).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str] = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        *,
        concurrency: int = defaults.CONCURRENCY,
        timeout: float = defaults.TIMEOUT_S,
        max_retries: int = defaults.MAX_RETRIES,
        parse_retries: int = defaults.PARSE_RETRIES,
        backoff_base: float = defaults.BACKOFF_S,
        backoff_max: float = defaults.BACKOFF_MAX_S,
        retry_after_cap: float = defaults.RETRY_AFTER_MAX_S,
        fallback: str = defaults.FALLBACK,
        max_tokens: int = 4096,
        enable_thinking: bool | None = False,
        max_chars_per_message: int | None = 4000,
        max_model_len: int | None = None,
        max_prompt_tokens: int | None = None,
        api_key: str | None = None,
        extra_body: dict[str, Any] | None = None,
        trust_env: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        client: httpx.AsyncClient | None = None,
        rules_annotator: Annotator | None = None,
        rules_options: dict[str, Any] | None = None,
        jitter_seed: int | None = None,
        deadline: float | None = None,
        endpoint_cooldown: float = ENDPOINT_COOLDOWN_S,
        endpoint_cooldown_max: float = ENDPOINT_COOLDOWN_MAX_S,
    ):
        given = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        # "a,b" (one string or one list item, e.g. one --base-url flag) means two endpoints
        urls = [u for item in given for u in (item.split(",") if isinstance(item, str) else [item]) if str(u).strip()]
        if not urls:
            raise ValueError("annotator base_urls is empty: give at least one OpenAI-compatible endpoint")
        if fallback not in FALLBACKS:
            raise ValueError(f"annotator fallback must be one of {FALLBACKS}, got {fallback!r}")
        if concurrency < 1:
            raise ValueError(f"annotator concurrency must be >= 1, got {concurrency}")
        if not timeout > 0:
            raise ValueError(f"annotator timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0 or parse_retries < 0:
            raise ValueError(f"annotator max_retries/parse_retries must be >= 0, got {max_retries}/{parse_retries}")
        if max_tokens < 1:
            raise ValueError(f"annotator max_tokens must be >= 1, got {max_tokens}")
        if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"annotator deadline must be > 0 seconds or None, got {deadline}")
        if not (0 <= endpoint_cooldown <= endpoint_cooldown_max and math.isfinite(endpoint_cooldown_max)):
            raise ValueError(
                "annotator endpoint_cooldown must be >= 0 and <= endpoint_cooldown_max (finite), "
                f"got {endpoint_cooldown}/{endpoint_cooldown_max}"
            )
        if max_model_len is not None and max_model_len != 0 and max_model_len <= max_tokens + PROMPT_TOKEN_MARGIN:
            raise ValueError(
                f"annotator max_model_len must exceed max_tokens + {PROMPT_TOKEN_MARGIN} = "
                f"{max_tokens + PROMPT_TOKEN_MARGIN}, or be 0 (no context budget) or None (ask the server), "
                f"got {max_model_len}"
            )
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"annotator max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
        self.endpoints = [chat_completions_url(u) for u in urls]
        self._urls = [httpx.URL(u) for u in self.endpoints]  # parsed once, not per request
        self.model = model
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.parse_retries = parse_retries
        # the shared retry table and schedule (verl_credit.openai_chat), jittered: many sessions of
        # a rollout worker share the servers and must not retry in lockstep
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max, retry_after_cap, jitter=True)
        self.fallback = fallback
        self.max_tokens = max_tokens
        self.enable_thinking = enable_thinking
        self.max_chars_per_message = max_chars_per_message
        self.max_model_len = max_model_len
        self.max_prompt_tokens = max_prompt_tokens
        self._served_model_len: int | None = None  # from /v1/models: >0 reported, 0 answered without it
        self._learned_model_len: int | None = None  # from a context-length error
        self._probe_retry_at = 0.0
        self._probe_lock: asyncio.Lock | None = None
        self.extra_body = dict(extra_body or {})
        self.trust_env = trust_env
        self.stats = LLMStats()
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self._headers = {"Content-Type": "application/json"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._transport = transport
        self._injected_client = client
        self._clients: list[httpx.AsyncClient] = []
        self._shard_load: list[int] = []
        self._ssl_context: ssl.SSLContext | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.deadline = float(deadline) if deadline is not None else self.timeout * (max_retries + 1)
        self.endpoint_cooldown = float(endpoint_cooldown)
        self.endpoint_cooldown_max = float(endpoint_cooldown_max)
        self._pool = EndpointPool(
            self.endpoints, self.endpoint_cooldown, self.endpoint_cooldown_max, self.retry.retry_after_max_s
        )
        self._random = random.Random(jitter_seed)
        self._rules = rules_annotator
        if fallback == "rules" and self._rules is None:
            self._rules = annotator_class("rules")(**(rules_options or {}))

    @property
    def prompt_version(self) -> str:
        """The prompt version, the answer contract's version and every rendering option that
        changes the prompt (cache key part: graphs accepted under an older contract are not reused)."""
        thinking = "default" if self.enable_thinking is None else int(self.enable_thinking)
        return f"{PROMPT_VERSION}/{ANSWER_CONTRACT}/clip={self.max_chars_per_message}/think={thinking}"

    # -- the Annotator interface -------------------------------------------------------------
    async def annotate_one(
        self, trajectory: Trajectory, rules_result: AnnotationResult | None = None
    ) -> AnnotationResult:
        """Annotate one trajectory (a cache is attached from outside:
        :class:`verl_credit.annotate.cache.CachedAnnotator`). ``rules_result`` (the hybrid
        annotator's) is reused as the ``rules`` fallback instead of running the rules again."""
        if trajectory.num_actions == 0:
            return AnnotationResult(InfluenceGraph.uniform(0), GraphValidation(), "llm")
        prompt: list[AnnotationPrompt] = []  # set once the prompt is built (also for a failure)
        try:
            graph, validation = await self._request_graph(trajectory, prompt)
        except AnnotationFailure as failure:
            result = await self._fall_back(trajectory, failure, rules_result)
        except Exception as exc:  # a bug must not stop training: count it and fall back
            self.stats.count_failure("internal")
            result = await self._fall_back(trajectory, AnnotationFailure("internal", repr(exc)), rules_result)
        else:
            self.stats.annotated += 1
            result = AnnotationResult(graph, validation, "llm")
        result.prompt_truncated = bool(prompt) and prompt[0].truncated
        return result

    async def aclose(self) -> None:
        clients, same_loop = self._clients, self._loop is asyncio.get_running_loop()
        self._clients, self._shard_load, self._loop, self._semaphore = [], [], None, None
        if same_loop:  # clients of a finished loop cannot be closed from another one; they are dropped
            for client in clients:
                await client.aclose()
        self._probe_lock = None
        if self._rules is not None:
            await self._rules.aclose()

    # -- one trajectory ----------------------------------------------------------------------
    def build_payload(self, trajectory: Trajectory, max_prompt_tokens: int | None = None) -> dict[str, Any]:
        """The chat-completions request body for one trajectory (its prompt fitted to
        ``max_prompt_tokens`` estimated tokens when given)."""
        return self._payload(trajectory, self._prompt(trajectory, max_prompt_tokens))

    def _prompt(self, trajectory: Trajectory, budget: int | None) -> AnnotationPrompt:
        return build_annotation_prompt(trajectory, self.max_chars_per_message, budget)

    def _payload(self, trajectory: Trajectory, prompt: AnnotationPrompt) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages,
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "influence_graph",
                    "schema": _schema_for(trajectory.num_actions),
                    "strict": True,
                },
            },
        }
        if self.enable_thinking is not None:
            payload["chat_template_kwargs"] = {"enable_thinking": self.enable_thinking}
        payload.update(self.extra_body)
        return payload

    def _encode(self, trajectory: Trajectory, budget: int | None) -> tuple[bytes, AnnotationPrompt]:
        """The request body as bytes (serialized once: retries resend them) and its prompt."""
        prompt = self._prompt(trajectory, budget)
        payload = self._payload(trajectory, prompt)
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8"), prompt

    async def _request_graph(
        self, trajectory: Trajectory, built: list[AnnotationPrompt]
    ) -> tuple[InfluenceGraph, GraphValidation]:
        budget = await self.prompt_budget()
        if _transcript_chars(trajectory) <= INLINE_MAX_CHARS:
            body, prompt = self._encode(trajectory, budget)
        else:  # rendering (and fitting) a long transcript takes milliseconds: not on the loop
            body, prompt = await run_blocking(self._encode, trajectory, budget)
        built.append(prompt)
        if prompt.truncated:
            self.stats.truncated_prompts += 1
        if not prompt.fits:
            self.stats.count_failure("prompt_too_long")
            raise AnnotationFailure(
                "prompt_too_long",
                f"~{prompt.tokens} prompt tokens over the budget of {budget} even with every text cut "
                f"({trajectory.num_actions} actions)",
                retryable=False,
            )
        clock = _Deadline(self.deadline)  # starts when the first attempt goes on the wire
        transport_failures = content_failures = 0
        avoid: int | None = None  # the endpoint that just failed: the retry goes elsewhere if it can
        while True:
            endpoint = self._pool.pick(avoid)
            try:
                reply = await self._post(body, endpoint, clock)
                if len(reply.body) <= INLINE_MAX_CHARS:
                    usage, outcome = _read_completion(reply, trajectory.num_actions)
                else:  # json.loads + validation of a long reply: not on the loop
                    usage, outcome = await run_blocking(_read_completion, reply, trajectory.num_actions)
                self.stats.prompt_tokens += usage[0]
                self.stats.completion_tokens += usage[1]
                if isinstance(outcome, AnnotationFailure):
                    raise outcome
                return await self._checked(trajectory, *outcome)
            except AnnotationFailure as failure:
                self.stats.count_failure(failure.kind)
                content_failure = failure.kind in ("empty", "truncated", "malformed_json", "schema")
                if content_failure:
                    if content_failures >= self.parse_retries:
                        raise
                    content_failures += 1
                    delay = 0.0
                else:
                    if RetryPolicy.endpoint_unwell(failure.kind):
                        self._pool.mark_failed(endpoint, failure.retry_after)
                    if not failure.retryable or transport_failures >= self.retry.max_retries:
                        raise
                    transport_failures += 1
                    avoid = endpoint
                    # a Retry-After speaks for its endpoint: another healthy one is tried after the backoff
                    retry_after = None if self._pool.healthy_other(endpoint) else failure.retry_after
                    delay = self._backoff(transport_failures, retry_after)
                if delay >= clock.remaining():
                    failure.retryable = False
                    failure.message += (
                        f"; no retry: waiting {delay:.3g} s would pass the request deadline of {self.deadline:g} s"
                    )
                    raise
                self.stats.retries += 1
                if delay > 0:
                    await asyncio.sleep(delay)

    async def _checked(
        self, trajectory: Trajectory, graph: InfluenceGraph, validation: GraphValidation
    ) -> tuple[InfluenceGraph, GraphValidation]:
        """The answer without the edges the rules' binding checks reject (a unit naming values
        that neither ``a_i`` supplied nor ``a_j`` uses: a hallucination, or an instruction planted
        in the transcript obeyed), counted in ``LLMStats.unbound_edges`` and ``repaired_edges``."""
        if _transcript_chars(trajectory) <= INLINE_MAX_CHARS:
            graph, validation, dropped = drop_unbound_edges(trajectory, graph, validation)
        else:
            graph, validation, dropped = await run_blocking(drop_unbound_edges, trajectory, graph, validation)
        self.stats.unbound_edges += dropped
        return graph, validation

    # -- endpoint health ---------------------------------------------------------------------
    def endpoint_health(self) -> list[dict[str, Any]]:
        """Per endpoint: its URL, consecutive failures and seconds until it is used again."""
        return self._pool.health()

    # -- the context budget ------------------------------------------------------------------
    async def prompt_budget(self) -> int | None:
        """Estimated prompt tokens allowed per request (``None``: no limit); see ``max_model_len``."""
        model_len = await self.context_length()
        self.stats.max_model_len = model_len or 0
        budgets = [] if self.max_prompt_tokens is None else [self.max_prompt_tokens]
        if model_len:
            budgets.append(model_len - self.max_tokens - PROMPT_TOKEN_MARGIN)
        return max(1, min(budgets)) if budgets else None

    async def context_length(self) -> int | None:
        """The context length in tokens the budget uses: ``max_model_len`` if given, else the
        server's (asked once), else :data:`FALLBACK_MAX_MODEL_LEN`; never more than a length a
        context-length error named. ``None`` when ``max_model_len == 0`` and no error named one."""
        if self.max_model_len is None and self._served_model_len is None and time.monotonic() >= self._probe_retry_at:
            self._ensure_clients()
            assert self._probe_lock is not None
            async with self._probe_lock:
                if self._served_model_len is None and time.monotonic() >= self._probe_retry_at:
                    await self._probe_model_len()
        if self.max_model_len is not None:
            known = self.max_model_len or None
        else:
            known = self._served_model_len or FALLBACK_MAX_MODEL_LEN
        if self._learned_model_len is not None:
            known = min(known, self._learned_model_len) if known else self._learned_model_len
        return known

    async def _probe_model_len(self) -> None:
        """Ask every endpoint's ``GET /v1/models`` for ``max_model_len`` (the smallest wins)."""
        client = self._clients[0]
        deadline = min(self.timeout, 10.0)
        urls = sorted({models_url(endpoint) for endpoint in self.endpoints})

        async def get_models(url: str) -> Any:
            """The JSON of ``GET url``, its body read with the size cap (a gzip bomb stops there)."""
            headers = {**self._headers, "Accept-Encoding": ACCEPT_ENCODING}
            response = await client.send(client.build_request("GET", url, headers=headers), stream=True)
            try:
                if response.status_code != 200:
                    return None
                return json.loads(await read_body(response, MAX_RESPONSE_BYTES))
            finally:
                await response.aclose()

        async def ask(url: str) -> int | None:
            """The reported length, 0 if the answer has none; ``None`` when there is no answer."""
            try:
                answer = await _with_deadline(get_models(url), deadline)
                if not isinstance(answer, dict):
                    return None
                entries = answer.get("data") or []
            except Exception:  # no answer, a transport mocked for chat only, a non-JSON or oversized body
                return None
            if not isinstance(entries, list):
                return None
            mine = [e for e in entries if isinstance(e, dict) and e.get("id") == self.model] or entries
            lengths = [e.get("max_model_len") for e in mine if isinstance(e, dict)]
            valid = [int(n) for n in lengths if isinstance(n, int) and not isinstance(n, bool) and n > 0]
            return min(valid) if valid else 0

        answers = [a for a in await asyncio.gather(*(ask(url) for url in urls)) if a is not None]
        if not answers:
            self._probe_retry_at = time.monotonic() + MODEL_LEN_PROBE_RETRY_S
            _LOG.warning(
                "annotator: no endpoint answered GET /v1/models; assuming max_model_len=%d for now",
                FALLBACK_MAX_MODEL_LEN,
            )
            return
        reported = [a for a in answers if a > 0]
        self._served_model_len = min(reported) if reported else 0
        if not reported:
            _LOG.info("annotator: /v1/models reports no max_model_len; assuming %d", FALLBACK_MAX_MODEL_LEN)

    def _learn_context_length(self, text: str) -> None:
        """Lower the budget of later requests to the context length a server error names."""
        limits = [int(n) for n in _CONTEXT_LIMIT.findall(text)]
        if limits:
            limit = min(limits)
            if self._learned_model_len is None or limit < self._learned_model_len:
                self._learned_model_len = limit

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before retry ``attempt`` (1-based): ``Retry-After`` if given, else jittered
        exponential backoff."""
        return self.retry.delay(attempt, retry_after, self._random)

    def _ensure_clients(self) -> asyncio.Semaphore:
        """The request semaphore and the client shards of the running event loop.

        httpx clients and semaphores belong to one event loop, and ``annotate()`` (``asyncio.run``)
        makes a new loop per call, so both are made per loop. The connection pool is split into
        shards of :data:`POOL_SHARD_SIZE` connections, one ``httpx.AsyncClient`` each: httpcore's
        pool does work quadratic in its size on every request, which at 64 connections costs
        more CPU than the requests themselves (see scripts/bench_annotator.py).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._semaphore is None:
            self._loop = loop
            self._semaphore = asyncio.Semaphore(self.concurrency)
            self._probe_lock = asyncio.Lock()
            if self._injected_client is not None:
                self._clients = [self._injected_client]
            else:
                if self._ssl_context is None:  # loading the CA bundle costs ~20 ms: once, shared by the shards
                    self._ssl_context = httpx.create_ssl_context(trust_env=self.trust_env)
                shards = -(-self.concurrency // POOL_SHARD_SIZE)
                size = min(self.concurrency, POOL_SHARD_SIZE)
                self._clients = [
                    make_async_client(
                        transport=self._transport,
                        timeout=httpx.Timeout(self.timeout),
                        limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                        trust_env=self.trust_env,
                        verify=self._ssl_context,
                    )
                    for _ in range(shards)
                ]
            self._shard_load = [0] * len(self._clients)
        return self._semaphore

    async def _post(self, body: bytes, endpoint: int, clock: _Deadline) -> _Reply:
        """One HTTP attempt to endpoint ``endpoint`` -> the 200 reply; raises :class:`AnnotationFailure`.

        The body is read raw and decoded here (:func:`~verl_credit.openai_chat.decode_body`): a ``Content-Encoding``
        header that does not fit the body, or an odd ``Content-Type``, does not cost the answer.
        """
        semaphore = self._ensure_clients()
        url = self._urls[endpoint]
        async with semaphore:
            seconds = min(self.timeout, clock.remaining(start=True))
            if seconds <= 0:
                raise AnnotationFailure(
                    "deadline", f"{url}: the request deadline of {self.deadline:g} s passed", retryable=False
                )
            # the least-loaded shard always has a free connection: in-flight < concurrency <= capacity
            shard = min(range(len(self._clients)), key=self._shard_load.__getitem__)
            client = self._clients[shard]
            self._shard_load[shard] += 1
            self.stats.requests += 1
            try:
                reply = await _with_deadline(self._exchange(client, url, body), seconds)
            except (TimeoutError, httpx.TransportError, httpx.DecodingError) as exc:
                kind = transport_failure(exc)
                detail = {"timeout": f"no answer within {seconds:.3g} s", "connect": str(exc)}
                raise AnnotationFailure(kind, f"{url}: {detail.get(kind, f'{type(exc).__name__}: {exc}')}") from None
            finally:
                if self._shard_load:
                    self._shard_load[shard] -= 1
        status = reply.status
        kind = status_failure(status)
        if kind is not None and RetryPolicy.retried(kind):
            retry_after = finite_retry_after(reply.headers.get("retry-after"))
            raise AnnotationFailure(kind, f"{url}: HTTP {status}: {reply.text(200)}", retry_after=retry_after)
        self._pool.mark_alive(endpoint)  # it answered: whatever the answer says, the endpoint is up
        if status != 200:
            text = reply.text(1000)
            if is_context_length_error(status, text):
                self._learn_context_length(text)
                raise AnnotationFailure("context_length", f"{url}: HTTP {status}: {text[:300]}", retryable=False)
            raise AnnotationFailure("http_4xx", f"{url}: HTTP {status}: {text[:200]}", retryable=False)
        return reply

    async def _exchange(self, client: httpx.AsyncClient, url: httpx.URL, body: bytes) -> _Reply:
        request = client.build_request("POST", url, content=body, headers=self._headers)
        response = await client.send(request, stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise httpx.DecodingError(f"response body over {MAX_RESPONSE_BYTES} bytes", request=request)
                chunks.append(chunk)
        except httpx.StreamConsumed:  # a response built in memory (a mock transport): already read
            return _Reply(response.status_code, response.headers, response.content, str(url))
        except httpx.RemoteProtocolError:
            # the connection closed before the Content-Length the header promised: when what did
            # arrive is a whole JSON document, the header lied and the answer is kept
            body = decode_body(
                b"".join(chunks), response.headers.get("content-encoding"), MAX_RESPONSE_BYTES, keep_undecodable=True
            )
            if response.status_code != 200 or not _is_json_document(body):
                raise
            return _Reply(response.status_code, response.headers, body, str(url))
        finally:
            await response.aclose()
        decoded = decode_body(
            b"".join(chunks), response.headers.get("content-encoding"), MAX_RESPONSE_BYTES, keep_undecodable=True
        )
        return _Reply(response.status_code, response.headers, decoded, str(url))

    async def _fall_back(
        self, trajectory: Trajectory, failure: AnnotationFailure, rules_result: AnnotationResult | None
    ) -> AnnotationResult:
        self.stats.fallbacks += 1
        message = f"llm annotation failed ({failure.kind}): {failure.message}"
        if self.fallback == "rules" and self._rules is not None:
            try:
                base = rules_result if rules_result is not None else await self._rules.annotate_one(trajectory)
                return AnnotationResult(
                    base.graph, base.validation, "fallback:rules", uncertain=base.uncertain, error=message
                )
            except Exception as exc:  # the rules failing too: the uniform graph is always available
                message = f"{message}; rules fallback failed: {exc!r}"
        validation = GraphValidation(fallback=True)
        validation.note(message)
        return AnnotationResult(
            InfluenceGraph.uniform(trajectory.num_actions), validation, "fallback:uniform", error=message
        )


def _transcript_chars(trajectory: Trajectory) -> int:
    """Characters of the transcript's texts and raw tool-call arguments (what rendering touches)."""
    total = sum(len(observation.content) for observation in trajectory.observations)
    for action in trajectory.actions:
        total += len(action.content) + sum(len(call.raw_arguments) for call in action.tool_calls)
    return total


class _Deadline:
    """One trajectory's request deadline: ``seconds`` from its first attempt on the wire (time
    queued behind the concurrency bound does not count)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at: float | None = None

    def remaining(self, start: bool = False) -> float:
        now = time.monotonic()
        if self.at is None:
            if not start:
                return self.seconds
            self.at = now + self.seconds
        return self.at - now


@dataclass
class _Reply:
    """An HTTP answer, its body read raw and decoded by :func:`~verl_credit.openai_chat.decode_body`."""

    status: int
    headers: httpx.Headers
    body: bytes
    url: str

    def text(self, limit: int) -> str:
        return self.body[: limit * 4].decode("utf-8", "replace")[:limit]


def _is_json_document(body: bytes) -> bool:
    try:
        json.loads(body)
    except (ValueError, RecursionError):
        return False
    return True


def _decoded(chunks: Sequence[bytes], response: httpx.Response) -> bytes:
    """The body's bytes undone from their ``Content-Encoding``, at most :data:`MAX_RESPONSE_BYTES`;
    as sent when they do not decode (a header that lies): the caller judges them."""
    encoding = response.headers.get("content-encoding")
    return decode_body(b"".join(chunks), encoding, MAX_RESPONSE_BYTES, keep_undecodable=True)


def _token_count(value: Any) -> int:
    """One ``usage`` figure as a count: a non-negative integer (or integral float) below 2**53,
    else 0 -- an odd ``usage`` is bookkeeping, never a reason to lose the answer."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if 0 <= value < 2**53 else 0
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and 0 <= value < 2**53:
        return int(value)
    return 0


def _usage_tokens(data: Any) -> tuple[int, int]:
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    return _token_count(usage.get("prompt_tokens")), _token_count(usage.get("completion_tokens"))


def _read_completion(
    reply: _Reply, num_actions: int
) -> tuple[tuple[int, int], tuple[InfluenceGraph, GraphValidation] | AnnotationFailure]:
    """A 200 chat completion -> ``((prompt_tokens, completion_tokens), graph or failure)``:
    decoded, parsed and validated (the failure is returned, not raised, so that the usage of an
    unusable answer is still counted). Only the body decides: ``Content-Type`` is not consulted
    (JSON is detected from the bytes), an odd ``usage`` counts as no tokens."""
    url = reply.url
    try:
        data = json.loads(reply.body)
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
        if not (isinstance(content, str) and content.strip()):
            # some vLLM reasoning parsers put the whole answer into the reasoning field
            for key in ("reasoning_content", "reasoning"):
                candidate = message.get(key)
                if isinstance(candidate, str) and candidate.strip():
                    content = candidate
                    break
        finish_reason = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        failure = AnnotationFailure("bad_response", f"{url}: 200 without a chat completion: {reply.text(120)!r}")
        return (0, 0), failure
    tokens = _usage_tokens(data)
    finish = finish_reason if isinstance(finish_reason, str) else None
    try:
        return tokens, parse_graph_completion(content if isinstance(content, str) else None, finish, num_actions)
    except AnnotationFailure as failure:
        return tokens, failure
