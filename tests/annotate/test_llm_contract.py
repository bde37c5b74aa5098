"""The LLM annotator's answer contract and endpoint handling, on real sockets.

Every case runs against the local OpenAI-compatible stub server (tests/openai_stub_server.py) with
the fault injected there, and every server is stopped by its fixture / ``with`` block:

* an answer missing a required key, with indices as strings, with unbounded counts... is invalid:
  retried, then the fallback, counted, never cached;
* only the answer is taken: not an object quoted earlier in the reasoning or prose;
* a good graph is kept whatever ``usage`` says and whatever ``Content-Encoding`` / ``Content-Type``
  claim;
* a failing endpoint is skipped for a cool-down instead of being asked again round-robin;
  ``Retry-After`` is never waited for past the request deadline;
* a malformed base URL is an error naming it when the annotator is built (and in the CLI).
"""

from __future__ import annotations

import copy
import gzip
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from openai_stub_server import OpenAIStubServer, Reply, chat_completion_body, unused_port
from test_llm_annotator import (
    REFUND_GRAPH,
    REFUND_MESSAGES,
    FakeRules,
    annotate,
    edge_keys,
    make_llm,
    refund_trajectory,
)

from verl_credit.annotate.cache import CachedAnnotator
from verl_credit.annotate.llm import (
    MAX_DIRECT_INPUTS,
    AnnotationFailure,
    LLMAnnotator,
    answer_problems,
    extract_answer,
    parse_graph_completion,
)
from verl_credit.cli.main import main

pytestmark = pytest.mark.timeout(60)

GOOD = [(0, 2, "+"), (1, 2, "+")]


def graph_with(**changes: Any) -> dict[str, Any]:
    graph = copy.deepcopy(REFUND_GRAPH)
    graph.update(changes)
    return graph


def edge(src: Any = 0, dst: Any = 2, **extra: Any) -> dict[str, Any]:
    return {"src": src, "dst": dst, "sign": "+", "type": "input", "unit": "method=card", **extra}


# -- invalid answers: retried, then the fallback, counted, never cached -------------------------
INVALID_ANSWERS = {
    "num_actions alone": {"num_actions": 3},
    "no edges key": {"num_actions": 3, "errors": [], "direct_user_inputs": {}},
    "no errors key": {"num_actions": 3, "direct_user_inputs": {}, "edges": []},
    "no direct_user_inputs key": {"num_actions": 3, "errors": [], "edges": []},
    "indices as strings": graph_with(edges=[edge("0", "2")]),
    "an error mark's action as a string": graph_with(errors=[{"action": "1", "kind": "tool_error", "evidence": "x"}]),
    "an index as a float": graph_with(edges=[edge(0, 2.0)]),
    "an index as a boolean": graph_with(edges=[edge(False, 2)]),
    "an index out of range": graph_with(edges=[edge(0, 3)]),
    "a count as a string": graph_with(direct_user_inputs={"1": "1"}),
    "an unbounded count": graph_with(direct_user_inputs={"1": 10**12}),
    "a count past the bound": graph_with(direct_user_inputs={"1": MAX_DIRECT_INPUTS + 1}),
    "a negative count": graph_with(direct_user_inputs={"1": -1}),
    "a count keyed by a label": graph_with(direct_user_inputs={"A1": 1}),
    "a count keyed by a padded index": graph_with(direct_user_inputs={"01": 1}),
    "a count of a missing action": graph_with(direct_user_inputs={"3": 1}),
    "an edge without its unit": graph_with(edges=[{"src": 0, "dst": 2, "sign": "+", "type": "input"}]),
    "an unknown edge type": graph_with(edges=[edge(type="uses")]),
    "an unknown sign": graph_with(edges=[edge(sign="plus")]),
    "an error mark without evidence": graph_with(errors=[{"action": 1, "kind": "tool_error"}]),
    "edges as an object": graph_with(edges={"0": 2}),
}


@pytest.mark.parametrize("answer", INVALID_ANSWERS.values(), ids=INVALID_ANSWERS.keys())
def test_an_answer_breaking_the_contract_is_retried_then_falls_back_uncached(
    stub_server: OpenAIStubServer, tmp_path: Path, answer: dict[str, Any]
) -> None:
    assert answer_problems(answer, 3), "the case must break the contract"
    cache = tmp_path / "graphs.sqlite"
    stub_server.script(Reply.json(answer), Reply.json(answer))
    llm = make_llm(stub_server, parse_retries=1)
    result = annotate(CachedAnnotator(llm, cache))
    # both attempts answered the invalid graph: the rules' chain graph, counted as a fallback
    assert result.source == "fallback:rules" and edge_keys(result.graph) == [(0, 1, "+"), (1, 2, "+")]
    assert llm.stats.failures == {"schema": 2} and llm.stats.fallbacks == 1 and llm.stats.annotated == 0
    assert len(stub_server.chat_requests) == 2
    # nothing was cached: the next run asks again and keeps the good answer (then that one is cached)
    stub_server.script(Reply.json(REFUND_GRAPH))
    again = CachedAnnotator(make_llm(stub_server), cache)
    assert annotate(again).source == "llm" and len(stub_server.chat_requests) == 3
    third = CachedAnnotator(make_llm(stub_server), cache)
    cached = annotate(third)
    assert cached.cached and edge_keys(cached.graph) == GOOD and len(stub_server.chat_requests) == 3


def test_an_invalid_answer_then_a_valid_one_is_annotated(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.json({"num_actions": 3}), Reply.json(REFUND_GRAPH))
    llm = make_llm(stub_server)
    result = annotate(llm)
    assert result.source == "llm" and edge_keys(result.graph) == GOOD
    assert llm.stats.failures == {"schema": 1} and llm.stats.retries == 1


def test_contract_problems_name_the_offence() -> None:
    assert answer_problems(REFUND_GRAPH, 3) == []
    assert answer_problems({"num_actions": 3}, 3) == ["missing required key(s) errors, direct_user_inputs, edges"]
    assert answer_problems(graph_with(edges=[edge("0", 2)]), 3) == ["edges[0].src is '0', not an integer"]
    assert answer_problems(graph_with(direct_user_inputs={"1": 10**12}), 3) == [
        f"direct_user_inputs['1'] = 1000000000000 is outside 0..{MAX_DIRECT_INPUTS}"
    ]
    # extra keys are ignored; what the schema cannot say is the validator's to repair
    assert answer_problems(graph_with(reasoning="because", edges=[edge(2, 1)]), 3) == []


# -- only the answer is taken ------------------------------------------------------------------
DECOY = {"num_actions": 3, "errors": [], "direct_user_inputs": {}, "edges": [edge(0, 1, unit="decoy")]}
ANSWER = json.dumps(REFUND_GRAPH)
DECOY_TEXT = json.dumps(DECOY)
ANSWERS_AFTER_DECOYS = {
    "prose quotes a graph, then the answer": f"A graph like {DECOY_TEXT} would be wrong: A0 elicited card.\n{ANSWER}",
    "two drafts, the answer last": f"Draft: {DECOY_TEXT}\nRevised after checking A1:\n{ANSWER}",
    "a decoy in prose, the answer fenced": f"Not {DECOY_TEXT}.\nFinal:\n```json\n{ANSWER}\n```",
    "a fenced decoy, then the fenced answer": f"```json\n{DECOY_TEXT}\n```\nNo, A0 gave card:\n```\n{ANSWER}\n```",
    "the answer fenced, an edge quoted after it": f"```json\n{ANSWER}\n```\nI left out {json.dumps(edge(0, 1))}.",
    "the decoy inside a think block": f"<think>maybe {DECOY_TEXT}</think>\n{ANSWER}",
    "reasoning, then the answer, then a sign-off": f"Tracing units. {DECOY_TEXT} is tempting.\n{ANSWER}\nDone.",
    "an example of the format, then the answer": (
        'The format is {"num_actions": N, "errors": [], "direct_user_inputs": {}, "edges": []}. '
        f"With every unit traced: {ANSWER}"
    ),
    "a nested decoy inside prose braces": f"(see {{ {DECOY_TEXT} }})\n{ANSWER}",
    "the whole message is the answer": ANSWER,
}


@pytest.mark.parametrize("content", ANSWERS_AFTER_DECOYS.values(), ids=ANSWERS_AFTER_DECOYS.keys())
def test_the_answer_not_an_object_quoted_before_it(stub_server: OpenAIStubServer, content: str) -> None:
    stub_server.script(Reply.completion(content))
    llm = make_llm(stub_server)
    result = annotate(llm)
    assert result.source == "llm" and edge_keys(result.graph) == GOOD
    assert llm.stats.failures == {}


def test_the_answer_from_the_reasoning_field_when_content_is_empty(stub_server: OpenAIStubServer) -> None:
    reasoning = f"A0 asks; a draft {DECOY_TEXT}; checking A1's lookup... final: {ANSWER}"
    stub_server.script(Reply.completion("", reasoning_content=reasoning))
    result = annotate(make_llm(stub_server))
    assert result.source == "llm" and edge_keys(result.graph) == GOOD


def test_an_invalid_answer_is_not_replaced_by_an_earlier_valid_object() -> None:
    # the last object is the answer; it breaks the contract, so the message has no usable answer
    content = f"Draft: {DECOY_TEXT}\nFinal: " + json.dumps({"num_actions": 3})
    with pytest.raises(AnnotationFailure) as caught:
        parse_graph_completion(content, "stop", 3)
    assert caught.value.kind == "schema" and "missing required key" in caught.value.message
    # a cut answer after a complete draft is a truncated answer, not the draft
    cut = f"Draft: {DECOY_TEXT}\n```json\n{ANSWER[:50]}"
    for finish in ("length", "stop"):
        with pytest.raises(AnnotationFailure) as caught:
            parse_graph_completion(cut, finish, 3)
        assert caught.value.kind == ("truncated" if finish == "length" else "malformed_json")
    with pytest.raises(AnnotationFailure) as caught:
        parse_graph_completion(f"Draft: {DECOY_TEXT}\n{ANSWER[:50]}", "length", 3)
    assert caught.value.kind == "truncated"


def test_extract_answer_rule() -> None:
    assert extract_answer(ANSWER) == REFUND_GRAPH
    assert extract_answer(f"x {DECOY_TEXT} y {ANSWER} z") == REFUND_GRAPH
    assert extract_answer(f"```json\n{ANSWER}\n```\ntrailing {DECOY_TEXT}") == REFUND_GRAPH
    assert extract_answer("[1, 2]") == [1, 2]  # one JSON value: the answer (then no object: invalid)
    with pytest.raises(AnnotationFailure, match="unterminated <think>"):
        extract_answer(f"<think>{ANSWER}", "stop")


# -- usage and headers do not cost a good graph ------------------------------------------------
def completion_bytes(usage: Any) -> bytes:
    body = chat_completion_body(ANSWER)
    body["usage"] = usage
    return json.dumps(body).encode()


ODD_USAGE = {
    "null": None,
    "a string": "lots",
    "string counts": {"prompt_tokens": "12", "completion_tokens": "x"},
    "negative and fractional": {"prompt_tokens": -5, "completion_tokens": 3.5},
    "lists": {"prompt_tokens": [1], "completion_tokens": {"n": 2}},
    "huge": {"prompt_tokens": 10**40, "completion_tokens": 1e300},
    "booleans": {"prompt_tokens": True, "completion_tokens": False},
}


@pytest.mark.parametrize("usage", ODD_USAGE.values(), ids=ODD_USAGE.keys())
def test_odd_usage_keeps_the_graph(stub_server: OpenAIStubServer, usage: Any) -> None:
    stub_server.script(Reply.raw(completion_bytes(usage)))
    llm = make_llm(stub_server)
    result = annotate(llm)
    assert result.source == "llm" and edge_keys(result.graph) == GOOD
    assert llm.stats.failures == {} and llm.stats.prompt_tokens == 0 and llm.stats.completion_tokens == 0


def test_usage_is_counted_when_sane(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.raw(completion_bytes({"prompt_tokens": 120, "completion_tokens": 30.0})))
    llm = make_llm(stub_server)
    assert annotate(llm).source == "llm"
    assert (llm.stats.prompt_tokens, llm.stats.completion_tokens) == (120, 30)


LYING_HEADERS = {
    "gzip claimed, plain body": {"Content-Encoding": "gzip"},
    "deflate claimed, plain body": {"Content-Encoding": "deflate"},
    "brotli claimed, plain body": {"Content-Encoding": "br"},
    "an unknown encoding": {"Content-Encoding": "x-custom"},
}


@pytest.mark.parametrize("headers", LYING_HEADERS.values(), ids=LYING_HEADERS.keys())
def test_a_lying_content_encoding_keeps_the_graph(stub_server: OpenAIStubServer, headers: dict[str, str]) -> None:
    stub_server.script(Reply.raw(completion_bytes({"prompt_tokens": 1}), headers=headers))
    llm = make_llm(stub_server)
    result = annotate(llm)
    assert result.source == "llm" and edge_keys(result.graph) == GOOD and llm.stats.failures == {}


def test_an_honest_gzip_body_and_a_lying_content_type(stub_server: OpenAIStubServer) -> None:
    answer = graph_with(edges=[edge(unit="método=tarjeta ✓")])
    body = chat_completion_body(json.dumps(answer, ensure_ascii=False))
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    stub_server.script(
        Reply.raw(gzip.compress(data), headers={"Content-Encoding": "gzip"}),
        Reply.raw(data, content_type="text/html; charset=iso-8859-1"),
    )
    llm = make_llm(stub_server)
    first, second = llm.annotate([refund_trajectory("a"), refund_trajectory("b")])
    for result in (first, second):
        assert result.source == "llm" and [e.unit for e in result.graph.edges] == ["método=tarjeta ✓"]


class RawReplyServer:
    """A loopback server that answers every request with fixed raw bytes, then closes the
    connection (for replies the stub server cannot send: a Content-Length that lies)."""

    def __init__(self, raw: bytes):
        self.raw = raw
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"

    def __enter__(self) -> RawReplyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                if head.startswith(b"POST"):
                    self.requests += 1
                    conn.sendall(self.raw)
                else:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def test_a_content_length_that_promises_more_than_arrives_keeps_the_graph() -> None:
    body = completion_bytes({"prompt_tokens": 5})
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (len(body) + 500)
    with RawReplyServer(raw + body) as server:
        llm = make_llm([server.base_url], max_model_len=32768)
        result = annotate(llm)
        assert result.source == "llm" and edge_keys(result.graph) == GOOD
        assert llm.stats.failures == {} and server.requests == 1


def test_a_cut_body_behind_a_lying_content_length_is_retried() -> None:
    body = completion_bytes({"prompt_tokens": 5})[:-20]  # the connection closes mid-document
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (len(body) + 500)
    with RawReplyServer(raw + body) as server:
        llm = make_llm([server.base_url], max_model_len=32768, max_retries=1)
        result = annotate(llm)
        assert result.source == "fallback:rules" and llm.stats.failures == {"transport": 2}


def test_finish_reason_length_on_a_complete_answer_keeps_it(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.json(REFUND_GRAPH, finish_reason="length"))
    result = annotate(make_llm(stub_server))
    assert result.source == "llm" and edge_keys(result.graph) == GOOD


# -- endpoint health ---------------------------------------------------------------------------
def test_a_dead_endpoint_is_skipped_after_it_failed() -> None:
    with OpenAIStubServer(lambda request: Reply.json(REFUND_GRAPH)) as alive:
        dead = f"http://127.0.0.1:{unused_port()}/v1"
        llm = make_llm([dead, alive.base_url], concurrency=1, endpoint_cooldown=30.0)
        results = llm.annotate([refund_trajectory(f"t{i}") for i in range(6)])
        assert all(r.source == "llm" for r in results)
        # round-robin would have tried the dead endpoint for every other trajectory (3 times)
        assert llm.stats.failures == {"connect": 1} and len(alive.chat_requests) == 6
        dead_health, alive_health = llm.endpoint_health()
        assert dead_health["failures"] == 1 and dead_health["cooldown_s"] > 20
        assert alive_health == {"url": alive.base_url + "/chat/completions", "failures": 0, "cooldown_s": 0.0}


def test_a_failing_server_is_skipped_then_probed_again_after_its_cooldown() -> None:
    with (
        OpenAIStubServer(lambda request: Reply.json(REFUND_GRAPH)) as sick,
        OpenAIStubServer(lambda request: Reply.json(REFUND_GRAPH)) as well,
    ):
        sick.script(Reply.error(503), Reply.error(503))
        llm = make_llm([sick.base_url, well.base_url], concurrency=1, endpoint_cooldown=0.3)
        assert all(r.source == "llm" for r in llm.annotate([refund_trajectory(f"a{i}") for i in range(4)]))
        assert len(sick.chat_requests) == 1 and len(well.chat_requests) == 4  # skipped while cooling down
        time.sleep(0.35)
        # the cool-down is over: asked again, fails again (cool-down doubled), then skipped again
        assert all(r.source == "llm" for r in llm.annotate([refund_trajectory(f"b{i}") for i in range(4)]))
        assert len(sick.chat_requests) == 2 and llm.endpoint_health()[0]["failures"] == 2
        time.sleep(0.65)
        # recovered: a success clears its record and round-robin resumes
        assert all(r.source == "llm" for r in llm.annotate([refund_trajectory(f"c{i}") for i in range(4)]))
        assert len(sick.chat_requests) == 4 and llm.endpoint_health()[0]["failures"] == 0
        assert llm.stats.failures == {"http_5xx": 2}


def test_a_client_error_does_not_mark_the_endpoint_dead(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(400, "bad request"), Reply.json(REFUND_GRAPH))
    llm = make_llm(stub_server)
    assert annotate(llm, refund_trajectory("a")).source == "fallback:rules"
    assert llm.endpoint_health()[0]["failures"] == 0
    assert annotate(llm, refund_trajectory("b")).source == "llm"


# -- Retry-After and the request deadline -----------------------------------------------------
@pytest.mark.parametrize("retry_after", ["3600", "Wed, 21 Oct 2099 07:28:00 GMT", "1e9"])
def test_retry_after_is_never_waited_for_past_the_deadline(stub_server: OpenAIStubServer, retry_after: str) -> None:
    stub_server.script(Reply.error(429, headers={"Retry-After": retry_after}), Reply.json(REFUND_GRAPH))
    llm = make_llm(stub_server, deadline=2.0, retry_after_cap=600.0)
    result = annotate(llm)  # the test's timeout guards against a sleep past the deadline
    assert len(stub_server.chat_requests) == 1  # gave up instead of waiting for the retry
    assert result.source == "fallback:rules" and "request deadline" in (result.error or "")
    assert llm.stats.failures == {"http_429": 1} and llm.stats.fallbacks == 1


def test_retry_after_within_the_deadline_is_honoured(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(429, headers={"Retry-After": "0.5"}), Reply.json(REFUND_GRAPH))
    llm = make_llm(stub_server, deadline=5.0)
    assert annotate(llm).source == "llm"
    first, second = stub_server.chat_requests
    assert second.received_at - first.received_at >= 0.45


def test_retry_after_sends_the_retry_to_another_endpoint_at_once() -> None:
    with OpenAIStubServer() as busy, OpenAIStubServer(lambda request: Reply.json(REFUND_GRAPH)) as free:
        busy.script(Reply.error(429, headers={"Retry-After": "3600"}))
        llm = make_llm([busy.base_url, free.base_url], deadline=5.0, retry_after_cap=600.0)
        assert annotate(llm).source == "llm"  # waiting out the Retry-After would have passed the deadline
        assert len(free.chat_requests) == 1
        assert llm.endpoint_health()[0]["cooldown_s"] > 500  # the busy one keeps its Retry-After


def test_the_deadline_bounds_a_slow_attempt(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.json(REFUND_GRAPH, delay=3.0), Reply.json(REFUND_GRAPH, delay=3.0))
    llm = make_llm(stub_server, timeout=10.0, deadline=0.5)
    result = annotate(llm)  # without the deadline the 3 s answer would have been taken (timeout 10 s)
    assert result.source == "fallback:rules" and llm.stats.failures["timeout"] >= 1


# -- malformed base URLs -----------------------------------------------------------------------
MALFORMED_URLS = [
    "http://",
    "http://:8000/v1",
    "http://host:abc/v1",
    "http://host:99999/v1",
    "http://host:0",
    "http://ho st:8000",
    "http://host:8000/v1?key=1",
    "http://[::1:8000",
    "http://host:8000/v1/models",
    "htp://host:8000",
    "host:8000",
]


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_malformed_base_url_is_a_startup_error_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match="base URL") as caught:
        LLMAnnotator(["http://127.0.0.1:8000/v1", url], fallback="uniform")
    assert repr(url) in str(caught.value)


def test_comma_separated_urls_in_one_flag_are_several_endpoints() -> None:
    llm = LLMAnnotator(["http://a:1/v1,http://b:2"], fallback="uniform", rules_annotator=FakeRules())
    assert llm.endpoints == ["http://a:1/v1/chat/completions", "http://b:2/v1/chat/completions"]


def test_the_cli_names_a_malformed_base_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text(json.dumps({"id": "t", "uid": "u", "reward": 1.0, "messages": REFUND_MESSAGES}) + "\n")
    out = tmp_path / "g.jsonl"
    for url in ("http://host:abc/v1", "http://:8000"):
        argv = ["annotate", "--input", str(rollouts), "--out", str(out), "--annotator", "llm", "--base-url", url]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert url in err and "base URL" in err and "Traceback" not in err
    assert not out.exists()
