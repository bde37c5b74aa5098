"""Nothing slow of the annotators runs on the event loop that serves the other agent sessions.

Each test patches one synchronous step (the rule fallback, the sqlite cache read or write, the
rendering of a long prompt, the parsing of a long reply) to block on a ``threading.Event`` and
checks that, while it is blocked, other coroutines of the same loop keep running -- a ticker and,
where it fits, a second annotation that completes meanwhile. Nothing here measures time: a step
that wrongly ran on the loop would hold the loop until its 10 s safety release, and the test then
fails on ``timed_out`` (and on the thread it ran in).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from openai_stub_server import OpenAIStubServer, Reply

import verl_credit.annotate.llm as llm_module
import verl_credit.annotate.rules as rules_module
from verl_credit.annotate.base import AnnotationResult
from verl_credit.annotate.cache import CachedAnnotator, GraphCache
from verl_credit.annotate.factory import build_annotator
from verl_credit.annotate.llm import INLINE_MAX_CHARS, LLMAnnotator
from verl_credit.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")

REFUND_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "refund order #W12 please"},
    {"role": "assistant", "content": "To card or store credit?"},
    {"role": "user", "content": "card"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "refund", "arguments": '{"order_id": "#W12"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "refund", "content": '{"status": "refunded"}'},
]
GRAPH = {
    "num_actions": 2,
    "errors": [],
    "direct_user_inputs": {},
    "edges": [{"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "method=card"}],
}


def refund(trajectory_id: str = "t1", tool_output: str = '{"status": "refunded"}') -> Trajectory:
    messages = json.loads(json.dumps(REFUND_MESSAGES))
    messages[-1]["content"] = tool_output
    return Trajectory.from_messages(messages, id=trajectory_id)


class Blocker:
    """Wraps a function so that its calls (those ``when(*args)`` selects) block until ``released``
    is set (or a 10 s safety timeout)."""

    def __init__(self, when: Callable[..., bool] = lambda *args: True) -> None:
        self.when = when
        self.entered = threading.Event()
        self.released = threading.Event()
        self.threads: list[int] = []
        self.timed_out = False

    def wrap(self, function: Callable[..., T]) -> Callable[..., T]:
        def blocked(*args: Any, **kwargs: Any) -> T:
            if not self.when(*args):
                return function(*args, **kwargs)
            self.threads.append(threading.get_ident())
            self.entered.set()
            if not self.released.wait(10):
                self.timed_out = True
            return function(*args, **kwargs)

        return blocked


async def ticker(ticks: int = 50) -> int:
    """A coroutine that needs the loop ``ticks`` times."""
    done = 0
    for _ in range(ticks):
        await asyncio.sleep(0)
        done += 1
    return done


async def run_while_blocked(
    blocker: Blocker, annotation: Awaitable[T], meanwhile: Callable[[], Awaitable[Any]] | None = None
) -> tuple[T, Any]:
    """Start ``annotation``; once its patched step is blocked, run ``meanwhile`` (default: the
    ticker) to completion on the same loop, then release the step and finish the annotation."""
    loop_thread = threading.get_ident()
    task = asyncio.ensure_future(annotation)
    assert await asyncio.to_thread(blocker.entered.wait, 20), "the patched step never ran"
    assert await ticker() == 50
    other = await (meanwhile or ticker)()
    assert not task.done()  # the annotation is still waiting for its blocked step
    blocker.released.set()
    result = await task
    assert not blocker.timed_out, "the blocked step held the event loop"
    assert loop_thread not in blocker.threads, "the blocked step ran on the event loop's thread"
    return result, other


def make_llm(server: OpenAIStubServer, **options: Any) -> LLMAnnotator:
    defaults: dict[str, Any] = {"model": "stub-model", "timeout": 5.0, "max_retries": 0, "fallback": "uniform"}
    defaults.update(options)
    return LLMAnnotator(server.base_url, **defaults)


def test_the_rule_fallback_runs_off_the_loop(stub_server: OpenAIStubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM fails for trajectory A (a final 400), A falls back to the real rule annotator,
    whose pass is blocked; trajectory B is annotated by the LLM meanwhile."""
    blocker = Blocker()
    monkeypatch.setattr(rules_module, "annotate_rules", blocker.wrap(rules_module.annotate_rules))
    stub_server.script(Reply.error(400, "bad request"), Reply.json(GRAPH))
    llm = make_llm(stub_server, fallback="rules", rules_annotator=build_annotator("rules"))

    async def scenario() -> tuple[AnnotationResult, AnnotationResult]:
        return await run_while_blocked(
            blocker, llm.annotate_one(refund("A")), lambda: llm.annotate_one(refund("B", '{"status": "ok"}'))
        )

    first, second = asyncio.run(scenario())
    assert second.source == "llm"  # B completed while A's rule pass was blocked
    assert first.source == "fallback:rules" and first.graph.num_actions == 2
    assert llm.stats.failures == {"http_4xx": 1} and llm.stats.fallbacks == 1


def test_a_blocked_cache_read_does_not_block_the_loop(stub_server: OpenAIStubServer, tmp_path: Path) -> None:
    stub_server.script(Reply.json(GRAPH))
    llm = CachedAnnotator(make_llm(stub_server), tmp_path / "c.sqlite")
    blocker = Blocker()
    llm.cache.get = blocker.wrap(llm.cache.get)  # type: ignore[method-assign]
    result, _ = asyncio.run(run_while_blocked(blocker, llm.annotate_one(refund())))
    assert result.source == "llm" and not result.cached and llm.cache.misses == 1


def test_a_blocked_cache_write_does_not_block_the_loop(stub_server: OpenAIStubServer, tmp_path: Path) -> None:
    stub_server.script(Reply.json(GRAPH))
    llm = CachedAnnotator(make_llm(stub_server), tmp_path / "c.sqlite")
    blocker = Blocker()
    llm.cache.put = blocker.wrap(llm.cache.put)  # type: ignore[method-assign]
    result, _ = asyncio.run(run_while_blocked(blocker, llm.annotate_one(refund())))
    assert result.source == "llm" and len(llm.cache) == 1


def test_the_cached_annotator_wrapper_reads_off_the_loop(tmp_path: Path) -> None:
    cached = CachedAnnotator(build_annotator("rules"), tmp_path / "rules.sqlite")
    first = cached.annotate([refund()])[0]
    blocker = Blocker()
    cached.cache.get = blocker.wrap(cached.cache.get)  # type: ignore[method-assign]
    second, _ = asyncio.run(run_while_blocked(blocker, cached.annotate_one(refund())))
    assert not first.cached and second.cached and second.graph == first.graph


def test_rendering_a_long_prompt_runs_off_the_loop(
    stub_server: OpenAIStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = Blocker(when=lambda trajectory, *rest: trajectory.id == "long")
    monkeypatch.setattr(llm_module, "build_annotation_prompt", blocker.wrap(llm_module.build_annotation_prompt))
    stub_server.script(Reply.json(GRAPH), Reply.json(GRAPH))
    llm = make_llm(stub_server)
    long = refund("long", json.dumps({"log": "x" * (INLINE_MAX_CHARS + 1)}))

    async def scenario() -> tuple[AnnotationResult, AnnotationResult]:
        return await run_while_blocked(blocker, llm.annotate_one(long), lambda: llm.annotate_one(refund("short")))

    first, second = asyncio.run(scenario())
    # the short transcript (rendered inline: cheaper than a thread hop) went through meanwhile
    assert first.source == "llm" and second.source == "llm"


def test_parsing_a_long_reply_runs_off_the_loop(stub_server: OpenAIStubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = Blocker()
    monkeypatch.setattr(llm_module, "parse_graph_completion", blocker.wrap(llm_module.parse_graph_completion))
    padded = json.dumps(GRAPH) + " " * (INLINE_MAX_CHARS + 1)  # a long body; the JSON is unchanged
    stub_server.script(Reply.completion(padded))
    llm = make_llm(stub_server)
    result, _ = asyncio.run(run_while_blocked(blocker, llm.annotate_one(refund())))
    assert result.source == "llm" and [(e.src, e.dst) for e in result.graph.edges] == [(0, 1)]


# -- the cache from many threads -----------------------------------------------------------------
def test_each_thread_has_its_own_connection_and_close_closes_them_all(tmp_path: Path) -> None:
    cache = GraphCache(tmp_path / "threads.sqlite")
    identity = ("llm", "m", "v")
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for index in range(25):
                cache.put(f"w{worker}-{index}", dict(GRAPH), "llm", identity=identity)
                assert cache.get(f"w{worker}-{index}") is not None
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and len(cache) == 150
    assert (cache.hits, cache.writes) == (150, 150)
    assert len(cache._connections) == 7  # six workers and this thread (the constructor's)
    connections = [connection for connection, _ in cache._connections]
    cache.close()
    for connection in connections:
        with pytest.raises(sqlite3.ProgrammingError):
            connection.execute("SELECT 1")
    assert cache.get("w0-0") is not None  # reopened on use


def test_a_reader_does_not_wait_behind_a_writer_in_another_thread(tmp_path: Path) -> None:
    """WAL lets a reader run while a write transaction is open; each thread's own connection
    (no process-wide lock) keeps it that way inside one process."""
    cache = GraphCache(tmp_path / "rw.sqlite")
    identity = ("llm", "m", "v")
    cache.put("old", dict(GRAPH), "llm", identity=identity)
    in_transaction, reader_done = threading.Event(), threading.Event()

    def entries() -> Iterator[tuple[str, dict[str, Any], str, bool, tuple[str, str, str]]]:
        yield "new", dict(GRAPH), "llm", False, identity
        in_transaction.set()
        assert reader_done.wait(20), "the reader waited for the writer"

    writer = threading.Thread(target=cache.put_many, args=(entries(),))
    writer.start()
    assert in_transaction.wait(20)
    assert cache.get("old") is not None and cache.get("new") is None  # the uncommitted row is invisible
    reader_done.set()
    writer.join(20)
    assert cache.get("new") is not None
