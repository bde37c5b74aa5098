"""LLM annotator: a frozen model behind an OpenAI-compatible endpoint (DESIGN.md section 5).

One request per trajectory to ``POST {base_url}/chat/completions`` (vLLM's ``vllm serve``), with

* ``temperature = 0`` and JSON-schema constrained output: ``response_format = {"type":
  "json_schema", "json_schema": {"name": "influence_graph", "schema": graph_json_schema(T),
  "strict": true}}`` (vLLM structured outputs; the schema pins ``num_actions`` and bounds every
  index to ``0..T-1``);
* the versioned prompt of :mod:`verl_credit.annotate.prompt`;
* several endpoints used round-robin (each attempt, retries included, goes to the next one);
* at most ``concurrency`` requests in flight (an ``asyncio.Semaphore``, held only while a
  request is on the wire, not while a retry waits);
* a per-request deadline ``timeout`` seconds (the whole exchange, not just one socket read);
* retries with exponential backoff and jitter on 408/429/5xx, timeouts, refused or reset
  connections and unreadable response bodies; a ``Retry-After`` header (seconds or an HTTP date)
  is honoured, capped at ``retry_after_cap``; other 4xx answers are final;
* ``parse_retries`` more attempts when the model's answer is unusable (empty, truncated, not
  JSON, or failing validation beyond repair);
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
cache (:mod:`.cache`) and the rule fallback (the rule annotator's own worker thread) run in
worker threads (:func:`verl_credit.annotate.base.run_blocking`). The HTTP clients ignore
``HTTP(S)_PROXY`` (``trust_env=False``: the endpoints are cluster-local) unless ``trust_env``.

The answer is cleaned (Qwen3 ``<think>...</think>`` blocks and code fences stripped), parsed and
validated with :func:`verl_credit.graph.validate_graph` (offending edges dropped and counted).
On final failure the trajectory falls back to the rule annotator (``fallback="rules"``) or the
uniform graph (``fallback="uniform"``); the failure is counted in :class:`LLMStats` and the
result's ``source`` says ``fallback:...``. :meth:`LLMAnnotator.annotate_one` never raises for a
network or content failure.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import random
import re
import ssl
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from verl_credit.annotate.base import AnnotationResult, Annotator, build_annotator, register_annotator, run_blocking
from verl_credit.annotate.cache import GraphCache, annotate_with_cache, annotator_identity
from verl_credit.annotate.prompt import PROMPT_VERSION, AnnotationPrompt, build_annotation_prompt
from verl_credit.graph import GraphValidation, InfluenceGraph, graph_json_schema, validate_graph
from verl_credit.openai_chat import parse_retry_after
from verl_credit.trajectory import Trajectory

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "FALLBACKS",
    "FALLBACK_MAX_MODEL_LEN",
    "INLINE_MAX_CHARS",
    "PROMPT_TOKEN_MARGIN",
    "AnnotationFailure",
    "LLMAnnotator",
    "LLMStats",
    "chat_completions_url",
    "is_context_length_error",
    "models_url",
    "parse_graph_completion",
    "parse_retry_after",
    "strip_reasoning",
]

_LOG = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "Qwen/Qwen3-32B"
FALLBACKS: tuple[str, ...] = ("rules", "uniform")
API_KEY_ENV = "VERL_CREDIT_ANNOTATOR_API_KEY"
#: connections per httpx client; the pool is split into ceil(concurrency / POOL_SHARD_SIZE) clients
POOL_SHARD_SIZE = 4
_RETRYABLE_STATUS = frozenset({408, 429})
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

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
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
    ``internal``. ``fallbacks``: trajectories that fell back. ``truncated_prompts``: prompts
    whose texts were shortened to fit the budget. ``max_model_len``: the context length the last
    budget was computed from (0: no budget).
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
        }


def chat_completions_url(base_url: str) -> str:
    """``http://h:8000`` / ``http://h:8000/v1`` / a full ``.../chat/completions`` URL -> the endpoint."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"annotator base URL must start with http:// or https://, got {base_url!r}")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return f"{url}/chat/completions"
    return f"{url}/v1/chat/completions"


def models_url(endpoint: str) -> str:
    """The ``/models`` URL beside a ``.../chat/completions`` endpoint."""
    return endpoint[: -len("/chat/completions")] + "/models"


def is_context_length_error(status: int, text: str) -> bool:
    """A 4xx answer saying the prompt (plus the reply budget) exceeds the model's context."""
    return 400 <= status < 500 and _CONTEXT_LENGTH.search(text) is not None


def strip_reasoning(content: str) -> str:
    """Remove ``<think>...</think>`` blocks and surrounding whitespace; unwrap a fenced block."""
    text = _THINK_BLOCK.sub("", content).strip()
    fenced = _FENCED.search(text)
    if fenced is not None:
        text = fenced.group(1).strip()
    return text


def parse_graph_completion(
    content: str | None, finish_reason: str | None, num_actions: int
) -> tuple[InfluenceGraph, GraphValidation]:
    """The model's answer -> a validated graph; raises :class:`AnnotationFailure` when unusable.

    Failure kinds: ``empty``, ``truncated`` (``finish_reason == "length"`` and no complete JSON
    object), ``malformed_json``, ``schema`` (JSON that :func:`validate_graph` cannot repair).
    Repairable problems (an edge to a missing action, ``src >= dst``, a sign/type mismatch) are
    repaired by the validator and counted in the returned validation.
    """
    truncated = finish_reason == "length"
    if content is None or not content.strip():
        raise AnnotationFailure("truncated" if truncated else "empty", "the model returned no content")
    text = strip_reasoning(content)
    if re.search(r"<think>", text, re.IGNORECASE):
        raise AnnotationFailure("truncated" if truncated else "malformed_json", "unterminated <think> block")
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError:
        raw = _first_json_object(text)
        if raw is None:
            kind = "truncated" if truncated else "malformed_json"
            raise AnnotationFailure(kind, f"answer is not a JSON object: {text[:120]!r}") from None
    graph, validation = validate_graph(raw, num_actions)
    if validation.fallback:
        raise AnnotationFailure("schema", "; ".join(validation.problems) or "graph failed validation")
    return graph, validation


@functools.lru_cache(maxsize=256)
def _schema_for(num_actions: int) -> dict[str, Any]:
    """``graph_json_schema(num_actions)``, built once per size (read-only: it is only serialized)."""
    return graph_json_schema(num_actions)


async def _with_deadline(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable`` cancelled after ``seconds`` (``asyncio.TimeoutError``). Uses
    ``asyncio.timeout`` (3.11+, no extra task per request) where it exists, else ``wait_for``."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with timeout(seconds):
        return await awaitable


def _first_json_object(text: str) -> Any:
    """The first complete JSON object in ``text`` (prose around it tolerated), else ``None``."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


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
            ``build_annotator("rules", **rules_options)``).
        cache_path: sqlite cache file; hits skip the request (see :mod:`.cache`).
        jitter_seed: seed of the backoff jitter (reproducible tests).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str] = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        *,
        concurrency: int = 64,
        timeout: float = 120.0,
        max_retries: int = 4,
        parse_retries: int = 1,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_cap: float = 60.0,
        fallback: str = "rules",
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
        cache_path: str | Path | None = None,
        jitter_seed: int | None = None,
    ):
        urls = [u for u in base_urls.split(",") if u.strip()] if isinstance(base_urls, str) else list(base_urls)
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
        self.max_retries = max_retries
        self.parse_retries = parse_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_cap = retry_after_cap
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
        self._round_robin = itertools.count()
        self._random = random.Random(jitter_seed)
        self._rules = rules_annotator
        if fallback == "rules" and self._rules is None:
            self._rules = build_annotator("rules", **(rules_options or {}))
        self.cache = GraphCache(cache_path) if cache_path is not None else None

    @property
    def prompt_version(self) -> str:
        """The prompt version plus every rendering option that changes the prompt (cache key part)."""
        thinking = "default" if self.enable_thinking is None else int(self.enable_thinking)
        return f"{PROMPT_VERSION}/clip={self.max_chars_per_message}/think={thinking}"

    # -- the Annotator interface -------------------------------------------------------------
    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        if self.cache is not None:
            return await annotate_with_cache(self.cache, annotator_identity(self), trajectory, self.annotate_uncached)
        return await self.annotate_uncached(trajectory)

    async def annotate_uncached(
        self, trajectory: Trajectory, rules_result: AnnotationResult | None = None
    ) -> AnnotationResult:
        """Annotate without the cache. ``rules_result`` (the hybrid annotator's) is reused as the
        ``rules`` fallback instead of running the rules again."""
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
        if self.cache is not None:
            self.cache.close()
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
        transport_failures = content_failures = 0
        while True:
            try:
                response = await self._post(body)
                if len(response.content) <= INLINE_MAX_CHARS:
                    usage, outcome = _read_completion(response, trajectory.num_actions)
                else:  # json.loads + validation of a long reply: not on the loop
                    usage, outcome = await run_blocking(_read_completion, response, trajectory.num_actions)
                self.stats.prompt_tokens += usage[0]
                self.stats.completion_tokens += usage[1]
                if isinstance(outcome, AnnotationFailure):
                    raise outcome
                return outcome
            except AnnotationFailure as failure:
                self.stats.count_failure(failure.kind)
                content_failure = failure.kind in ("empty", "truncated", "malformed_json", "schema")
                if content_failure:
                    if content_failures >= self.parse_retries:
                        raise
                    content_failures += 1
                    delay = 0.0
                else:
                    if not failure.retryable or transport_failures >= self.max_retries:
                        raise
                    transport_failures += 1
                    delay = self._backoff(transport_failures, failure.retry_after)
                self.stats.retries += 1
                if delay > 0:
                    await asyncio.sleep(delay)

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

        async def ask(url: str) -> int | None:
            """The reported length, 0 if the answer has none; ``None`` when there is no answer."""
            try:
                response = await _with_deadline(client.get(url, headers=self._headers), deadline)
                if response.status_code != 200:
                    return None
                entries = response.json().get("data") or []
            except Exception:  # no answer, a transport mocked for chat only, a non-JSON body
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
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap)
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return ceiling / 2 + self._random.uniform(0, ceiling / 2)

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
                    httpx.AsyncClient(
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

    async def _post(self, body: bytes) -> httpx.Response:
        """One HTTP attempt -> the 200 response; raises :class:`AnnotationFailure`."""
        semaphore = self._ensure_clients()
        url = self._urls[next(self._round_robin) % len(self._urls)]
        async with semaphore:
            # the least-loaded shard always has a free connection: in-flight < concurrency <= capacity
            shard = min(range(len(self._clients)), key=self._shard_load.__getitem__)
            client = self._clients[shard]
            self._shard_load[shard] += 1
            self.stats.requests += 1
            try:
                response = await _with_deadline(client.post(url, content=body, headers=self._headers), self.timeout)
            except (asyncio.TimeoutError, httpx.TimeoutException):
                raise AnnotationFailure("timeout", f"{url}: no answer within {self.timeout:g} s") from None
            except httpx.ConnectError as exc:
                raise AnnotationFailure("connect", f"{url}: {exc}") from None
            except httpx.TransportError as exc:
                raise AnnotationFailure("transport", f"{url}: {type(exc).__name__}: {exc}") from None
            finally:
                if self._shard_load:
                    self._shard_load[shard] -= 1
        status = response.status_code
        if status == 429 or status in _RETRYABLE_STATUS or status >= 500:
            kind = "http_429" if status == 429 else "http_5xx" if status >= 500 else f"http_{status}"
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            raise AnnotationFailure(kind, f"{url}: HTTP {status}: {response.text[:200]}", retry_after=retry_after)
        if status != 200:
            text = response.text[:1000]
            if is_context_length_error(status, text):
                self._learn_context_length(text)
                raise AnnotationFailure("context_length", f"{url}: HTTP {status}: {text[:300]}", retryable=False)
            raise AnnotationFailure("http_4xx", f"{url}: HTTP {status}: {text[:200]}", retryable=False)
        return response

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


def _read_completion(
    response: httpx.Response, num_actions: int
) -> tuple[tuple[int, int], tuple[InfluenceGraph, GraphValidation] | AnnotationFailure]:
    """A 200 chat completion -> ``((prompt_tokens, completion_tokens), graph or failure)``:
    decoded, parsed and validated (the failure is returned, not raised, so that the usage of an
    unusable answer is still counted)."""
    try:
        url = str(response.request.url)
    except RuntimeError:  # a response built without a request (tests)
        url = "?"
    try:
        data = response.json()
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
        if not (isinstance(content, str) and content.strip()):
            # some vLLM reasoning parsers put the whole answer into the reasoning field
            content = message.get("reasoning_content") or message.get("reasoning") or content
        finish_reason = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        failure = AnnotationFailure("bad_response", f"{url}: 200 without a chat completion: {response.text[:120]!r}")
        return (0, 0), failure
    usage = data.get("usage") if isinstance(data, dict) else None
    tokens = (0, 0)
    if isinstance(usage, dict):
        tokens = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    try:
        return tokens, parse_graph_completion(content if isinstance(content, str) else None, finish_reason, num_actions)
    except AnnotationFailure as failure:
        return tokens, failure
