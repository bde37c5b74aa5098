"""The project's one OpenAI-compatible client layer: clients, the retry table, the retry schedule.

Every client of an OpenAI-compatible ``/chat/completions`` endpoint in the project goes through this
module: the LLM annotator (:mod:`verl_credit.annotate.llm`, which adds several endpoints with
health tracking and a request deadline on top), the simulated users (``verl_credit.verl.users``,
``verl_credit.envs.tau2.user_sim``), the tau2 evaluation policy client
(``verl_credit.envs.tau2.runner``) and the optional LLM role classifier
(``verl_credit.annotate.roles``). They share

* :func:`make_async_client` / :func:`make_client`: how an ``httpx`` client is made;
* :data:`RETRY_TABLE`: what a failed attempt is called (:func:`status_failure`,
  :func:`transport_failure`), whether it is retried and whether it says the endpoint is unwell;
* :class:`RetryPolicy`: how many retries and how long to wait before each.

The retry table (attempt ``k`` = 1, 2, ... of ``max_retries`` retries):

=================  =========  =================================================================
kind               retried    what happened
=================  =========  =================================================================
``timeout``        yes        no answer within the client's timeout
``connect``        yes        connection refused / unreachable host
``transport``      yes        connection dropped, a broken or undecodable body
``http_408``       yes        HTTP 408
``http_429``       yes        HTTP 429 (rate limited)
``http_5xx``       yes        HTTP 500-599
``bad_response``   yes        a 2xx whose body is no JSON object (a truncated body)
``http_4xx``       no         any other non-2xx answer (400, 401, 404, 422, ...)
``no_message``     no         a JSON answer without ``choices[0].message``
=================  =========  =================================================================

Bodies are read with a size cap: at most :data:`MAX_BODY_BYTES`, counted on the wire and again
after decoding (:func:`read_body`, :func:`decode_body`; only ``gzip`` and ``deflate`` are asked
for, since their decoded size can be bounded while decoding), so neither an endless body nor a
gzip bomb can grow memory past it; an oversized or undecodable body is a ``transport`` failure.

The wait before retry ``k`` is the answer's ``Retry-After`` (seconds or an HTTP date) capped at
``retry_after_max_s`` when given, else the exponential backoff ``min(backoff_s * 2**(k-1),
backoff_max_s)`` (with ``jitter``, drawn from its upper half). After the last attempt, or on a final
answer, :class:`ChatCompletionError` is raised; its message starts with the URL.

Proxies: the endpoints these clients talk to (vLLM servers, the simulated user's model) are
cluster-local, while a cluster job's environment often carries ``HTTP_PROXY``/``HTTPS_PROXY`` for
the outside world; an ``httpx`` client made with its default ``trust_env=True`` would send every
request to that proxy. :func:`make_async_client` and :func:`make_client` make clients with
``trust_env=False`` unless asked (``trust_env=True`` also honours ``NO_PROXY``, ``ALL_PROXY`` and
``SSL_CERT_FILE``); callers that pass their own client to :func:`post_chat_completion` should make
it with them.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import logging
import math
import random
import re
import time
import zlib
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "ACCEPT_ENCODING",
    "DEFAULT_RETRY",
    "MAX_BODY_BYTES",
    "RETRY_TABLE",
    "ChatCompletionError",
    "EndpointHealth",
    "EndpointPool",
    "ReplyText",
    "RetryPolicy",
    "decode_body",
    "finite_retry_after",
    "first_message",
    "log_reasoning_fallback",
    "make_async_client",
    "make_client",
    "message_content",
    "parse_retry_after",
    "post_chat_completion",
    "post_chat_completion_sync",
    "read_body",
    "read_body_sync",
    "reply_text",
    "status_failure",
    "strip_thinking",
    "transport_failure",
]

#: the most bytes of one response body read, on the wire and after decoding (a chat completion or a
#: model list is kilobytes): a larger body -- a broken or hostile server, a gzip bomb -- is a
#: ``transport`` failure, never held in memory
MAX_BODY_BYTES = 32 * 2**20
#: the encodings the clients ask for: those whose decoded size :func:`decode_body` can bound
ACCEPT_ENCODING = "gzip, deflate"
_INFLATE_STEP = 2**20  # bytes inflated per step

#: kind of a failed attempt -> (retried, says that the endpoint is unwell). The endpoint half is read by
#: clients with several endpoints (the LLM annotator cools such an endpoint down); a final answer
#: (``http_4xx``) came from a live server.
RETRY_TABLE: Mapping[str, tuple[bool, bool]] = {
    "timeout": (True, True),
    "connect": (True, True),
    "transport": (True, True),
    "http_408": (True, True),
    "http_429": (True, True),
    "http_5xx": (True, True),
    "bad_response": (True, True),
    "http_4xx": (False, False),
    "no_message": (False, False),
}


def status_failure(status: int) -> str | None:
    """The :data:`RETRY_TABLE` kind of an HTTP status; ``None`` for a 2xx."""
    if 200 <= status < 300:
        return None
    if status in (408, 429):
        return f"http_{status}"
    return "http_5xx" if status >= 500 else "http_4xx"


def transport_failure(error: BaseException) -> str:
    """The :data:`RETRY_TABLE` kind of an exception raised while no answer came."""
    if isinstance(error, httpx.TimeoutException | TimeoutError):
        return "timeout"
    if isinstance(error, httpx.ConnectError):
        return "connect"
    return "transport"


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failed attempt is retried and how long each retry waits (module docstring).

    Attributes:
        max_retries: retries after the first attempt (``max_retries + 1`` attempts at most).
        backoff_s, backoff_max_s: the wait before retry ``k`` without ``Retry-After`` is
            ``min(backoff_s * 2**(k-1), backoff_max_s)``.
        retry_after_max_s: the longest ``Retry-After`` honoured.
        jitter: draw each backoff from ``[d/2, d]`` (clients that retry in bulk: many sessions
            hitting one server should not retry in lockstep).
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 60.0
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        numbers = {"backoff_s": self.backoff_s, "backoff_max_s": self.backoff_max_s}
        numbers["retry_after_max_s"] = self.retry_after_max_s
        for name, value in numbers.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    @staticmethod
    def retried(kind: str) -> bool:
        """Whether a failed attempt of this kind is retried (:data:`RETRY_TABLE`; unknown: no)."""
        return RETRY_TABLE.get(kind, (False, False))[0]

    @staticmethod
    def endpoint_unwell(kind: str) -> bool:
        """Whether a failed attempt of this kind says its endpoint is unwell (:data:`RETRY_TABLE`;
        unknown kinds -- the annotator's content failures -- say nothing about the endpoint)."""
        return RETRY_TABLE.get(kind, (False, False))[1]

    def delay(self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds before retry ``attempt`` (1-based): ``Retry-After`` (capped) if given, else the
        capped exponential backoff (jittered with ``rng`` when :attr:`jitter`)."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_max_s)
        ceiling = min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s)
        if not self.jitter:
            return ceiling
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


#: the retries of the small clients (simulated users, the tau2 policy client, the role classifier)
DEFAULT_RETRY = RetryPolicy()


class ChatCompletionError(RuntimeError):
    """A chat-completions request failed for good.

    Attributes:
        kind: the last attempt's :data:`RETRY_TABLE` kind (``"timeout"``, ``"connect"``,
            ``"transport"``, ``"http_408"``, ``"http_429"``, ``"http_5xx"``, ``"bad_response"``,
            ``"http_4xx"``, ``"no_message"``).
        status: the last HTTP status, ``None`` when no answer came.
    """

    def __init__(self, message: str, kind: str, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status


def make_async_client(
    *,
    timeout: float | httpx.Timeout | None = 60.0,
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    trust_env: bool = False,
    **options: Any,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for a cluster-local OpenAI-compatible endpoint: proxy variables of
    the environment are ignored unless ``trust_env`` (module docstring). ``options`` go to httpx."""
    return httpx.AsyncClient(
        timeout=timeout, headers=dict(headers or {}), transport=transport, trust_env=trust_env, **options
    )


def make_client(
    *,
    timeout: float | httpx.Timeout | None = 60.0,
    headers: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
    trust_env: bool = False,
    **options: Any,
) -> httpx.Client:
    """The blocking twin of :func:`make_async_client`."""
    return httpx.Client(
        timeout=timeout, headers=dict(headers or {}), transport=transport, trust_env=trust_env, **options
    )


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date; else ``None``."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass
class EndpointHealth:
    """One endpoint's health: consecutive failures, and until when it is skipped."""

    failures: int = 0  # consecutive failures
    down_until: float = 0.0  # time.monotonic() before which the endpoint is skipped


class EndpointPool:
    """Round-robin over several OpenAI-compatible endpoints with per-endpoint health.

    An endpoint that failed (no answer, 5xx, 429, a 200 that is no chat completion) is skipped for
    ``cooldown`` seconds, doubled per further consecutive failure up to ``cooldown_max`` (at least
    a ``Retry-After`` it sent, at most ``retry_after_max``); an answer clears it. When every
    endpoint is cooling down, the one that recovers first is used.
    """

    def __init__(self, urls: list[str], cooldown: float, cooldown_max: float, retry_after_max: float) -> None:
        if not urls:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self.urls = list(urls)
        self.cooldown, self.cooldown_max, self.retry_after_max = cooldown, cooldown_max, retry_after_max
        self._health = [EndpointHealth() for _ in self.urls]
        self._round_robin = itertools.count()

    def pick(self, avoid: int | None = None) -> int:
        """The next endpoint in round-robin order that is not cooling down (and not ``avoid``
        when another one is available); when all are cooling down, the one that recovers first."""
        now = time.monotonic()
        count = len(self.urls)
        first = next(self._round_robin) % count
        order = [(first + k) % count for k in range(count)]
        healthy = [i for i in order if self._health[i].down_until <= now]
        preferred = [i for i in healthy if i != avoid] or healthy
        if preferred:
            return preferred[0]
        return min(order, key=lambda i: self._health[i].down_until)

    def healthy_other(self, endpoint: int) -> bool:
        """Whether an endpoint other than ``endpoint`` is usable now."""
        now = time.monotonic()
        return any(h.down_until <= now for i, h in enumerate(self._health) if i != endpoint)

    def mark_failed(self, endpoint: int, retry_after: float | None) -> None:
        health = self._health[endpoint]
        health.failures += 1
        cooldown = min(self.cooldown_max, self.cooldown * 2 ** min(health.failures - 1, 30))
        if retry_after is not None:
            cooldown = max(cooldown, min(retry_after, self.retry_after_max))
        health.down_until = max(health.down_until, time.monotonic() + cooldown)

    def mark_alive(self, endpoint: int) -> None:
        health = self._health[endpoint]
        health.failures = 0
        health.down_until = 0.0

    def health(self) -> list[dict[str, Any]]:
        """Per endpoint: its URL, consecutive failures and seconds until it is used again."""
        now = time.monotonic()
        return [
            {"url": url, "failures": h.failures, "cooldown_s": max(0.0, h.down_until - now)}
            for url, h in zip(self.urls, self._health, strict=True)
        ]


def finite_retry_after(value: str | None) -> float | None:
    """:func:`parse_retry_after` in seconds, ``None`` when absent, unreadable or not finite."""
    try:
        seconds = parse_retry_after(value)
    except (OverflowError, ValueError, TypeError):
        return None
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _too_large(response: httpx.Response, limit: int, what: str) -> httpx.DecodingError:
    return httpx.DecodingError(f"response body over {limit} bytes ({what})", request=response.request)


def _inflate(raw: bytes, wbits: int, limit: int) -> bytes:
    """``raw`` inflated, at most ``limit`` bytes produced (``ValueError`` past it). Inflated a
    megabyte at a time: a bomb is dropped holding ``limit`` bytes, not twice that."""
    inflater = zlib.decompressobj(wbits)
    pieces: list[bytes] = []
    size = 0
    pending = raw
    while not inflater.eof:
        piece = inflater.decompress(pending, _INFLATE_STEP)
        pending = inflater.unconsumed_tail
        size += len(piece)
        if size > limit:
            raise ValueError(f"decoded body over {limit} bytes")
        pieces.append(piece)
        if not piece and not pending:
            raise zlib.error("incomplete compressed body")
    return b"".join(pieces)


def decode_body(
    raw: bytes, encoding: str | None, limit: int = MAX_BODY_BYTES, *, keep_undecodable: bool = False
) -> bytes:
    """``raw`` undone from its ``Content-Encoding`` (``identity``, ``gzip``, ``deflate``; several in
    order), producing at most ``limit`` bytes.

    ``keep_undecodable``: a body that does not decode as its header says (a header that lies, an
    encoding other than those, a decoded body over ``limit``) comes back as sent instead of raising;
    the caller judges the bytes (the LLM annotator: not a JSON document, a counted bad response).

    Raises:
        httpx.DecodingError: an encoding other than those, a body that does not decode, or a
            decoded body over ``limit`` bytes (a gzip bomb stops there); not with ``keep_undecodable``.
    """
    try:
        return _decode_body(raw, encoding, limit)
    except httpx.DecodingError:
        if keep_undecodable:
            return raw
        raise


def _decode_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    data = raw
    names = [part.strip().lower() for part in (encoding or "").split(",") if part.strip()]
    for name in reversed(names):
        try:
            if name == "identity":
                continue
            if name in ("gzip", "x-gzip"):
                data = _inflate(data, 16 + zlib.MAX_WBITS, limit)
            elif name == "deflate":
                try:
                    data = _inflate(data, zlib.MAX_WBITS, limit)
                except zlib.error:
                    data = _inflate(data, -zlib.MAX_WBITS, limit)  # raw deflate, as some servers send it
            else:
                raise httpx.DecodingError(f"unsupported Content-Encoding {name!r} (asked for {ACCEPT_ENCODING})")
        except (zlib.error, ValueError) as exc:
            raise httpx.DecodingError(f"cannot decode the {name} body: {exc}") from None
    if len(data) > limit:
        raise httpx.DecodingError(f"response body over {limit} bytes")
    return data


async def read_body(response: httpx.Response, limit: int = MAX_BODY_BYTES) -> bytes:
    """The decoded body of a response sent with ``stream=True``, read a chunk at a time and
    refused (``httpx.DecodingError``) as soon as it passes ``limit`` bytes on the wire or after
    decoding (:func:`decode_body`). A response already in memory (a mock transport) is checked."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > limit:
                raise _too_large(response, limit, "on the wire")
            chunks.append(chunk)
    except httpx.StreamConsumed:  # built in memory, already decoded
        if len(response.content) > limit:
            raise _too_large(response, limit, "in memory") from None
        return response.content
    return decode_body(b"".join(chunks), response.headers.get("content-encoding"), limit)


def read_body_sync(response: httpx.Response, limit: int = MAX_BODY_BYTES) -> bytes:
    """The blocking twin of :func:`read_body`."""
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_raw():
            size += len(chunk)
            if size > limit:
                raise _too_large(response, limit, "on the wire")
            chunks.append(chunk)
    except httpx.StreamConsumed:
        if len(response.content) > limit:
            raise _too_large(response, limit, "in memory") from None
        return response.content
    return decode_body(b"".join(chunks), response.headers.get("content-encoding"), limit)


def _body_text(body: bytes, limit: int) -> str:
    return body[: limit * 4].decode("utf-8", "replace")[:limit]


def _error_text(status: int, body: bytes, limit: int = 200) -> str:
    text = _body_text(body, limit)
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def _outcome(url: str, status: int, body: bytes) -> tuple[dict[str, Any] | None, ChatCompletionError | None]:
    """``(json, None)`` for a usable answer, else ``(None, error)`` (retried per :data:`RETRY_TABLE`)."""
    kind = status_failure(status)
    if kind is None:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return None, ChatCompletionError(f"invalid JSON body: {_body_text(body, 200)}", "bad_response", status)
        if not isinstance(data, dict):
            message = f"{url} answered non-object JSON: {_body_text(body, 200)}"
            return None, ChatCompletionError(message, "no_message", status)
        return data, None
    if RetryPolicy.retried(kind):
        return None, ChatCompletionError(_error_text(status, body), kind, status)
    return None, ChatCompletionError(f"{url} answered {_error_text(status, body, 300)}", kind, status)


def _request_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The request's own headers, asking for bounded encodings only unless the caller chose."""
    merged = dict(headers or {})
    if not any(name.lower() == "accept-encoding" for name in merged):
        merged["Accept-Encoding"] = ACCEPT_ENCODING
    return merged


async def _exchange(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], headers: dict[str, str], extra: dict[str, Any]
) -> tuple[int, httpx.Headers, bytes]:
    """One POST: ``(status, headers, decoded body)``, the body read with the size cap."""
    request = client.build_request("POST", url, json=dict(body), headers=headers, **extra)
    response = await client.send(request, stream=True)
    try:
        return response.status_code, response.headers, await read_body(response)
    finally:
        await response.aclose()


def _exchange_sync(
    client: httpx.Client, url: str, body: Mapping[str, Any], headers: dict[str, str], extra: dict[str, Any]
) -> tuple[int, httpx.Headers, bytes]:
    request = client.build_request("POST", url, json=dict(body), headers=headers, **extra)
    response = client.send(request, stream=True)
    try:
        return response.status_code, response.headers, read_body_sync(response)
    finally:
        response.close()


def _transport_error(error: httpx.HTTPError) -> ChatCompletionError:
    return ChatCompletionError(f"{type(error).__name__}: {error}", transport_failure(error))


def _final(url: str, attempts: int, last: ChatCompletionError) -> ChatCompletionError:
    return ChatCompletionError(f"{url} failed after {attempts} attempts ({last})", last.kind, last.status)


def _attempts(
    url: str, retry: RetryPolicy
) -> Generator[float | None, tuple[int, httpx.Headers, bytes] | httpx.HTTPError, dict[str, Any]]:
    """The retries of one request, whatever sends it (the one loop behind :func:`post_chat_completion`
    and :func:`post_chat_completion_sync`).

    Yields what to wait before each attempt (``None`` before the first), is sent that attempt's
    answer -- ``(status, headers, decoded body)`` -- or its transport error, and returns the parsed
    JSON answer.

    Raises:
        ChatCompletionError: a non-retryable answer at once, or the last error once retries are spent.
    """
    last: ChatCompletionError | None = None
    retry_after: float | None = None
    for attempt in range(retry.max_retries + 1):
        answer = yield (retry.delay(attempt, retry_after) if attempt else None)
        retry_after = None
        if isinstance(answer, httpx.HTTPError):
            last = _transport_error(answer)
            continue
        status, answer_headers, body = answer
        data, last = _outcome(url, status, body)
        if data is not None:
            return data
        assert last is not None
        if not RetryPolicy.retried(last.kind):
            raise last
        retry_after = parse_retry_after(answer_headers.get("retry-after"))
    assert last is not None
    raise _final(url, retry.max_retries + 1, last)


async def post_chat_completion(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """POST ``body`` to ``url`` (the full ``.../chat/completions`` URL) and return the parsed JSON answer.

    Makes at most ``retry.max_retries + 1`` attempts (module docstring: what is retried and how long it waits).
    ``timeout_s`` overrides the client's timeout for this request; ``headers`` are added to the client's.

    Raises:
        ChatCompletionError: ``"<url> failed after N attempts (<last error>)"`` once retries are spent, or
            ``"<url> answered HTTP <status>: <body>"`` at once for a non-retryable answer.
    """
    extra: dict[str, Any] = {"timeout": timeout_s} if timeout_s is not None else {}
    sent_headers = _request_headers(headers)
    plan = _attempts(url, retry)
    wait = next(plan)
    while True:
        if wait is not None:
            await asyncio.sleep(wait)
        try:
            answer: tuple[int, httpx.Headers, bytes] | httpx.HTTPError = await _exchange(
                client, url, body, sent_headers, extra
            )
        except httpx.HTTPError as error:
            answer = error
        try:
            wait = plan.send(answer)
        except StopIteration as done:
            return done.value


def post_chat_completion_sync(
    client: httpx.Client,
    url: str,
    body: Mapping[str, Any],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The blocking twin of :func:`post_chat_completion`: the same attempts (:func:`_attempts`), sent
    with a blocking client."""
    extra: dict[str, Any] = {"timeout": timeout_s} if timeout_s is not None else {}
    sent_headers = _request_headers(headers)
    plan = _attempts(url, retry)
    wait = next(plan)
    while True:
        if wait is not None:
            time.sleep(wait)
        try:
            answer: tuple[int, httpx.Headers, bytes] | httpx.HTTPError = _exchange_sync(
                client, url, body, sent_headers, extra
            )
        except httpx.HTTPError as error:
            answer = error
        try:
            wait = plan.send(answer)
        except StopIteration as done:
            return done.value


def first_message(response: Mapping[str, Any]) -> dict[str, Any]:
    """``choices[0].message`` of a chat completion; :class:`ChatCompletionError` (``no_message``) if absent."""
    try:
        message = response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        message = None
    if not isinstance(message, Mapping):
        raise ChatCompletionError(f"reply has no choices[0].message: {str(response)[:300]}", "no_message")
    return dict(message)


def message_content(response: Mapping[str, Any]) -> str:
    """The text of ``choices[0].message.content`` (``""`` when null); ``no_message`` error if missing or not text."""
    message = first_message(response)
    if "content" not in message:
        raise ChatCompletionError(f"reply message has no content: {str(message)[:300]}", "no_message")
    content = message["content"]
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ChatCompletionError(f"reply content is not text: {str(content)[:300]}", "no_message")
    return content


logger = logging.getLogger(__name__)

# -- the visible text of a reply (thinking models) ---------------------------------------------------

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_REASONING_FALLBACKS = itertools.count(1)


def strip_thinking(text: str) -> str:
    """``text`` without thinking: ``<think>...</think>`` blocks, everything before a lone ``</think>``
    (the chat template opened the block in the prompt) and an unclosed ``<think>`` to the end."""
    text = _THINK_BLOCK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text.strip()


@dataclass(frozen=True)
class ReplyText:
    """The visible text of a chat-completions assistant message and where it came from."""

    text: str
    from_reasoning: bool = False


def reply_text(message: Mapping[str, Any]) -> ReplyText:
    """``content`` if it has text (thinking removed), else the text of ``reasoning_content`` /
    ``reasoning`` (thinking tags removed), else ``""``."""
    content = message.get("content")
    text = strip_thinking(content) if isinstance(content, str) else ""
    if text:
        return ReplyText(text)
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and (reasoning := strip_thinking(value)):
            return ReplyText(reasoning, from_reasoning=True)
    return ReplyText("")


def log_reasoning_fallback(source: str) -> int:
    """Count one reply taken from the reasoning field (process-wide) and log it at 1, 10, 100, ...
    occurrences, so a misconfigured endpoint is visible without one line per reply."""
    count = next(_REASONING_FALLBACKS)
    if math.log10(count).is_integer():
        logger.warning(
            "%s: reply had no content; used its reasoning text instead (%d such replies in this process). "
            "Is the endpoint's reasoning parser on while thinking is off?",
            source,
            count,
        )
    return count
