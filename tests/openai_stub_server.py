"""A local OpenAI-compatible HTTP server for tests: a real socket on 127.0.0.1, scripted replies.

It speaks just enough HTTP/1.1 (keep-alive, ``Content-Length`` bodies) for ``httpx`` and the
``openai`` client, serves

* ``POST /v1/chat/completions`` -- the next scripted :class:`Reply`, else ``responder(request)``,
  else ``default``;
* ``GET /v1/models`` and ``GET /health`` -- always 200 (what ``scripts/serve_annotator.sh`` polls;
  ``models_reply`` replaces the model list, e.g. with an oversized or compressed body);

and logs every request (:attr:`OpenAIStubServer.requests`). Faults are replies too: an HTTP
error with headers (``Reply.error(429, headers={"Retry-After": "1"})``), a slow answer
(``delay=``), a garbage body (``Reply.raw``), a dropped connection (``Reply.disconnect_now()``).
A refused connection is a closed port: :func:`unused_port`.

Typical use::

    with OpenAIStubServer() as server:
        server.script(Reply.error(500), Reply.json({"answer": 1}))
        httpx.post(server.base_url + "/chat/completions", json={...})   # -> 500, then the JSON
        assert server.chat_requests[0].json["temperature"] == 0

Run standalone (the benchmark does, to keep the server off the client's core)::

    python tests/openai_stub_server.py --latency 0.05 --responder uniform-graph
    # prints "READY http://127.0.0.1:PORT/v1" and serves until SIGTERM/SIGINT
    # (--exit-on-stdin-eof: or until its stdin closes)

The server runs its own asyncio loop in a daemon thread, so it works from synchronous tests,
``asyncio`` tests and subprocesses alike. It is not a general web server: no TLS, no chunked
request bodies, no pipelining.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LoggedRequest",
    "OpenAIStubServer",
    "Reply",
    "chat_completion_body",
    "uniform_graph_responder",
    "unused_port",
]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    411: "Length Required",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Reply:
    """One scripted answer to one chat-completions request.

    ``status == 200`` with ``body is None`` answers a well-formed chat completion whose assistant
    message has ``content`` (plus ``message_extra`` fields such as ``tool_calls`` or
    ``reasoning_content``) and ``finish_reason``. ``body`` replaces the whole response body
    verbatim. ``delay`` seconds pass before answering (on top of the server's ``latency``);
    ``disconnect`` closes the connection without an answer.
    """

    status: int = 200
    content: str | None = ""
    finish_reason: str = "stop"
    message_extra: dict[str, Any] = field(default_factory=dict)
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    delay: float = 0.0
    disconnect: bool = False

    @classmethod
    def completion(
        cls, content: str | None, *, finish_reason: str = "stop", delay: float = 0.0, **message_extra: Any
    ) -> Reply:
        """A 200 chat completion whose assistant message text is ``content``."""
        return cls(content=content, finish_reason=finish_reason, delay=delay, message_extra=message_extra)

    @classmethod
    def json(cls, value: Any, *, delay: float = 0.0, finish_reason: str = "stop") -> Reply:
        """A 200 chat completion whose content is ``json.dumps(value)``."""
        return cls.completion(json.dumps(value), finish_reason=finish_reason, delay=delay)

    @classmethod
    def error(
        cls, status: int, message: str = "", *, headers: dict[str, str] | None = None, delay: float = 0.0
    ) -> Reply:
        """An HTTP error with an OpenAI-style error body, e.g. ``Reply.error(429, headers={"Retry-After": "1"})``."""
        body = json.dumps({"error": {"message": message or _REASONS.get(status, "error"), "code": status}})
        return cls(status=status, body=body.encode(), headers=dict(headers or {}), delay=delay)

    @classmethod
    def raw(
        cls,
        body: bytes | str,
        *,
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
    ) -> Reply:
        """Any body verbatim (e.g. a truncated or non-JSON HTTP body)."""
        data = body.encode() if isinstance(body, str) else body
        return cls(status=status, body=data, content_type=content_type, headers=dict(headers or {}), delay=delay)

    @classmethod
    def disconnect_now(cls, *, delay: float = 0.0) -> Reply:
        """Close the connection without sending anything (the client sees a protocol error)."""
        return cls(disconnect=True, delay=delay)


@dataclass
class LoggedRequest:
    """A request as the server saw it. ``json`` is the parsed body (``None`` if not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    received_at: float  # time.monotonic() when the request was read
    reply: Reply | None = None


def chat_completion_body(
    content: str | None,
    *,
    model: str = "stub-model",
    finish_reason: str = "stop",
    request_number: int = 0,
    **message_extra: Any,
) -> dict[str, Any]:
    """The JSON body of an OpenAI chat completion with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    message.update(message_extra)
    completion_tokens = len((content or "").split())
    return {
        "id": f"chatcmpl-stub-{request_number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": 0, "completion_tokens": completion_tokens, "total_tokens": completion_tokens},
    }


def uniform_graph_responder(request: dict[str, Any]) -> Reply:
    """Answer an influence-graph request with the uniform graph of the right size.

    The size is read from the request's constrained-output schema
    (``response_format.json_schema.schema.properties.num_actions.enum[0]``).
    """
    try:
        schema = request["response_format"]["json_schema"]["schema"]
        num_actions = int(schema["properties"]["num_actions"]["enum"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return Reply.error(400, "request carries no influence-graph schema")
    return Reply.json({"num_actions": num_actions, "errors": [], "direct_user_inputs": {}, "edges": []})


RESPONDERS: dict[str, Callable[[dict[str, Any]], Reply]] = {"uniform-graph": uniform_graph_responder}


def unused_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on (bound and released): connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class OpenAIStubServer:
    """A scripted OpenAI-compatible server on a real loopback socket.

    Args:
        responder: called with the parsed request JSON when no scripted reply is left.
        latency: seconds added before every chat-completions answer (benchmarks).
        default: the reply when neither a script nor a responder applies (default: content "ok").
        host, port: where to listen (port 0 = any free port).
        model: the model id reported by ``/v1/models`` and in completions.
    """

    def __init__(
        self,
        responder: Callable[[dict[str, Any]], Reply] | None = None,
        *,
        latency: float = 0.0,
        default: Reply | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "stub-model",
        log_requests: bool = True,
    ):
        self.responder = responder
        self.latency = latency
        self.default = default or Reply.completion("ok")
        self.host = host
        self.port = port
        self.model = model
        self.log_requests = log_requests
        self._script: collections.deque[Reply] = collections.deque()
        self._requests: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._chat_count = 0
        self.in_flight = 0
        """Chat requests received and not yet answered."""
        self.max_in_flight = 0
        """The largest ``in_flight`` seen (checks a client's concurrency bound)."""
        self.models_reply: Reply | None = None
        """The answer of ``GET /v1/models`` when set (default: the one-model list)."""

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> OpenAIStubServer:
        """Start listening (returns once the socket accepts connections)."""
        self._thread = threading.Thread(target=self._run, name="openai-stub-server", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)
        if self._startup_error is not None:
            raise RuntimeError(f"stub server failed to start: {self._startup_error}") from self._startup_error
        if not self._ready.is_set():
            raise RuntimeError("stub server did not start within 10 s")
        return self

    def stop(self) -> None:
        """Close the socket and stop the loop thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> OpenAIStubServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://host:port`` (no path)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://host:port/v1``."""
        return f"{self.url}/v1"

    # -- scripting and the log ---------------------------------------------------------------
    def script(self, *replies: Reply | Iterable[Reply]) -> None:
        """Queue replies; each chat request consumes the next one (FIFO)."""
        with self._lock:
            for reply in replies:
                if isinstance(reply, Reply):
                    self._script.append(reply)
                else:
                    self._script.extend(reply)

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[LoggedRequest]:
        """Every request received so far (a copy), in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[LoggedRequest]:
        """The ``POST .../chat/completions`` requests so far."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def clear(self) -> None:
        """Forget the request log, any unconsumed script and ``max_in_flight``."""
        with self._lock:
            self._requests.clear()
            self._script.clear()
            self.max_in_flight = self.in_flight

    # -- the server --------------------------------------------------------------------------
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.port, backlog=1024)
            )
            self.port = int(self._server.sockets[0].getsockname()[1])
        except BaseException as exc:  # reported by start()
            self._startup_error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

    def _next_reply(self, request: LoggedRequest) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self.responder is not None and isinstance(request.json, dict):
            return self.responder(request.json)
        return self.default

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_line = await reader.readline()
                if not request_line.strip():
                    break
                method, target, _version = request_line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                if "chunked" in headers.get("transfer-encoding", ""):
                    await self._send(writer, 411, b'{"error": "chunked bodies unsupported"}', {}, "application/json")
                    break
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                keep_alive = headers.get("connection", "").lower() != "close"
                if not await self._dispatch(writer, method, target, headers, body):
                    break
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            try:
                writer.close()
            except RuntimeError:  # loop already closing
                pass

    async def _dispatch(
        self, writer: asyncio.StreamWriter, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> bool:
        """Answer one request; returns False when the connection must be closed."""
        path = target.split("?", 1)[0]
        try:
            parsed = json.loads(body) if body else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = None
        request = LoggedRequest(method, path, headers, body, parsed, time.monotonic())
        if self.log_requests:
            with self._lock:
                self._requests.append(request)
        if method == "GET" and path in ("/health", "/v1/health"):
            await self._send(writer, 200, b"", {}, "text/plain")
            return True
        if method == "GET" and path == "/v1/models" and self.models_reply is not None:
            reply = self.models_reply
            await self._send(writer, reply.status, reply.body or b"", reply.headers, reply.content_type)
            return True
        if method == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "stub"}]}
            await self._send(writer, 200, json.dumps(models).encode(), {}, "application/json")
            return True
        if method != "POST" or not path.endswith("/chat/completions"):
            await self._send(writer, 404, b'{"error": {"message": "not found"}}', {}, "application/json")
            return True

        reply = self._next_reply(request)
        request.reply = reply
        with self._lock:
            self._chat_count += 1
            number = self._chat_count
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer_chat(writer, reply, parsed, number)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _answer_chat(self, writer: asyncio.StreamWriter, reply: Reply, parsed: Any, number: int) -> bool:
        wait = self.latency + reply.delay
        if wait > 0:
            await asyncio.sleep(wait)
        if reply.disconnect:
            return False
        if reply.body is not None:
            data = reply.body
        else:
            model = parsed.get("model", self.model) if isinstance(parsed, dict) else self.model
            data = json.dumps(
                chat_completion_body(
                    reply.content,
                    model=model,
                    finish_reason=reply.finish_reason,
                    request_number=number,
                    **reply.message_extra,
                )
            ).encode()
        await self._send(writer, reply.status, data, reply.headers, reply.content_type)
        return True

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter, status: int, data: bytes, headers: dict[str, str], content_type: str
    ) -> None:
        head = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(data)}",
            "Connection: keep-alive",
        ]
        head.extend(f"{name}: {value}" for name, value in headers.items())
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        await writer.drain()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local OpenAI-compatible stub server (tests, benchmarks).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before every chat answer")
    parser.add_argument("--responder", choices=sorted(RESPONDERS), default=None)
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="also stop when stdin closes (the parent process went away)"
    )
    args = parser.parse_args(argv)
    server = OpenAIStubServer(
        RESPONDERS[args.responder] if args.responder else None,
        latency=args.latency,
        host=args.host,
        port=args.port,
        log_requests=False,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.exit_on_stdin_eof:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with server:
        print(f"READY {server.base_url}", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
