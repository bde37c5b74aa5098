"""The sqlite annotation cache: keys, hit/miss counts, many writer processes, SIGKILL mid-write, restarts."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai_stub_server import OpenAIStubServer, Reply

from verl_credit.annotate.base import AnnotationResult, AnnotationStats, Annotator
from verl_credit.annotate.cache import CachedAnnotator, GraphCache, annotator_identity, cache_key
from verl_credit.annotate.factory import build_annotator
from verl_credit.annotate.llm import LLMAnnotator
from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)
FORK = multiprocessing.get_context("fork")
IDENTITY = ("llm", "Qwen/Qwen3-32B", "iapo-v1")


def graph_for(index: int, writer: int = 0) -> dict[str, Any]:
    """A 3-action graph whose unit names the writer and entry (so a read-back can be checked)."""
    return {
        "num_actions": 3,
        "errors": [],
        "direct_user_inputs": {},
        "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input", "unit": f"w{writer}-e{index}"}],
    }


def trajectory(text: str = "refund #W12", trajectory_id: str = "t1") -> Trajectory:
    return Trajectory.from_messages(
        [
            {"role": "user", "content": text},
            {"role": "assistant", "content": "ok?"},
            {"role": "user", "content": "yes"},
            {"role": "assistant", "content": "done"},
        ],
        id=trajectory_id,
    )


# -- keys ----------------------------------------------------------------------------------------
def test_key_is_sha256_of_the_canonical_json() -> None:
    messages = [{"role": "user", "content": "hi"}]
    # canonical form written by hand: sorted keys, no spaces
    expected = hashlib.sha256(b'[[{"content":"hi","role":"user"}],"llm","m","v"]').hexdigest()
    assert cache_key(messages, "llm", "m", "v") == expected
    # key order inside messages does not matter; every other part does
    assert cache_key([{"content": "hi", "role": "user"}], "llm", "m", "v") == expected
    others = {
        cache_key(messages, "rules", "m", "v"),
        cache_key(messages, "llm", "m2", "v"),
        cache_key(messages, "llm", "m", "v2"),
        cache_key([{"role": "user", "content": "hi!"}], "llm", "m", "v"),
    }
    assert expected not in others and len(others) == 4


def test_identity_of_annotators() -> None:
    llm = LLMAnnotator("http://h:1", model="Qwen/Qwen3-32B", fallback="uniform")
    name, model, version = annotator_identity(llm)
    assert (name, model) == ("llm", "Qwen/Qwen3-32B") and version.startswith("iapo-v1")
    # a different rendering option is a different prompt, hence a different key
    other = LLMAnnotator("http://h:1", model="Qwen/Qwen3-32B", fallback="uniform", max_chars_per_message=100)
    assert annotator_identity(other)[2] != version


# -- one process ---------------------------------------------------------------------------------
def test_put_get_counts_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "cache.sqlite"
    cache = GraphCache(path)
    assert cache.get("k1") is None
    cache.put("k1", graph_for(1), "llm", uncertain=True, identity=IDENTITY)
    entry = cache.get("k1")
    assert entry is not None and entry.graph == graph_for(1) and entry.source == "llm" and entry.uncertain
    cache.put("k1", graph_for(2), "rules", identity=IDENTITY)  # INSERT OR REPLACE
    assert cache.get("k1").graph == graph_for(2)  # type: ignore[union-attr]
    assert (cache.hits, cache.misses, cache.writes) == (2, 1, 2) and cache.hit_rate == pytest.approx(2 / 3)
    cache.close()

    reopened = GraphCache(path)  # a restart
    assert len(reopened) == 1 and reopened.get("k1").graph == graph_for(2)  # type: ignore[union-attr]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_put_many_is_all_or_nothing(tmp_path: Path) -> None:
    cache = GraphCache(tmp_path / "c.sqlite")

    def entries() -> Iterator[tuple[str, dict[str, Any], str, bool, tuple[str, str, str]]]:
        yield "a", graph_for(1), "llm", False, IDENTITY
        yield "b", graph_for(2), "llm", False, IDENTITY
        raise RuntimeError("writer failed halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        cache.put_many(entries())
    assert len(cache) == 0  # rolled back: neither "a" nor "b"
    assert cache.put_many([("c", graph_for(3), "llm", False, IDENTITY)]) == 1 and cache.keys() == ["c"]


# -- many processes ------------------------------------------------------------------------------
def _writer(path: str, writer: int, barrier: Any) -> None:
    cache = GraphCache(path, busy_timeout_s=30)
    barrier.wait()
    for index in range(20):  # shared keys: every writer replaces them
        cache.put(f"shared-{index}", graph_for(index, writer), "llm", identity=IDENTITY)
    for index in range(80):
        cache.put(f"w{writer}-{index}", graph_for(index, writer), "llm", identity=IDENTITY)
    cache.close()


def test_concurrent_writer_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    writers = 4
    barrier = FORK.Barrier(writers)
    processes = [FORK.Process(target=_writer, args=(path, w, barrier)) for w in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=50)
    assert [p.exitcode for p in processes] == [0] * writers

    cache = GraphCache(path)
    # 20 shared keys + 4 writers x 80 own keys
    assert len(cache) == 20 + writers * 80
    for writer in range(writers):
        for index in range(80):
            assert cache.get(f"w{writer}-{index}").graph == graph_for(index, writer)  # type: ignore[union-attr]
    for index in range(20):  # last writer wins, but the value is one writer's complete graph
        unit = cache.get(f"shared-{index}").graph["edges"][0]["unit"]  # type: ignore[union-attr]
        assert unit in {f"w{w}-e{index}" for w in range(writers)}
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _killed_mid_transaction(path: str, in_transaction: Any) -> None:
    cache = GraphCache(path)
    for index in range(20):
        cache.put(f"committed-{index}", graph_for(index), "llm", identity=IDENTITY)

    def entries() -> Iterator[tuple[str, dict[str, Any], str, bool, tuple[str, str, str]]]:
        for index in range(10):
            yield f"pending-{index}", graph_for(index), "llm", False, IDENTITY
        in_transaction.set()  # ten rows written inside the open transaction; now wait for SIGKILL
        time.sleep(60)

    cache.put_many(entries())


def test_sigkill_mid_transaction_leaves_no_partial_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.sqlite")
    in_transaction = FORK.Event()
    process = FORK.Process(target=_killed_mid_transaction, args=(path, in_transaction))
    process.start()
    assert in_transaction.wait(30)
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    assert process.exitcode == -signal.SIGKILL

    cache = GraphCache(path, busy_timeout_s=2)  # the dead writer's lock must be gone
    assert cache.keys() == sorted(f"committed-{i}" for i in range(20))
    assert all(cache.get(f"committed-{i}").graph == graph_for(i) for i in range(20))  # type: ignore[union-attr]
    cache.put("after-crash", graph_for(0), "llm", identity=IDENTITY)  # a stale lock would fail this write
    assert len(cache) == 21
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _write_forever(path: str, started: Any) -> None:
    cache = GraphCache(path)
    big = "x" * 20_000  # large values widen the window in which a kill lands mid-write
    index = 0
    while True:
        graph = graph_for(index)
        graph["edges"][0]["unit"] = f"e{index}-{big}"
        cache.put(f"k{index:06d}", graph, "llm", identity=IDENTITY)
        index += 1
        if index == 5:
            started.set()


def test_sigkill_during_a_stream_of_writes_keeps_every_row_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "stream.sqlite")
    started = FORK.Event()
    process = FORK.Process(target=_write_forever, args=(path, started))
    process.start()
    assert started.wait(30)
    time.sleep(0.3)
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)

    cache = GraphCache(path)
    keys = cache.keys()
    assert len(keys) >= 5
    # commits are sequential, so the survivors are exactly k000000 .. k{n-1}, each complete
    assert keys == [f"k{i:06d}" for i in range(len(keys))]
    for i, key in enumerate(keys):
        unit = cache.get(key).graph["edges"][0]["unit"]  # type: ignore[union-attr]
        assert unit == f"e{i}-" + "x" * 20_000


# -- the cached annotator ------------------------------------------------------------------------
class CountingAnnotator(Annotator):
    name = "counting"
    version = "c1"

    def __init__(self, fail_on: str = "") -> None:
        self.calls = 0
        self.fail_on = fail_on

    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        self.calls += 1
        n = trajectory.num_actions
        if self.fail_on and self.fail_on in trajectory.messages[0]["content"]:
            return AnnotationResult(
                InfluenceGraph.uniform(n), GraphValidation(fallback=True), "fallback:uniform", error="boom"
            )
        graph, validation = validate_graph(
            {"num_actions": n, "edges": [{"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "yes"}]}, n
        )
        return AnnotationResult(graph, validation, "counting", uncertain=True)


def test_cached_annotator_hits_after_the_first_call_and_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    inner = CountingAnnotator()
    cached = CachedAnnotator(inner, path)
    first = cached.annotate([trajectory()])[0]
    second = cached.annotate([trajectory(trajectory_id="another id, same transcript")])[0]
    assert (first.cached, second.cached) == (False, True) and inner.calls == 1
    assert second.graph == first.graph and second.source == "counting" and second.uncertain
    stats = AnnotationStats()
    for result in (first, second):
        stats.add(result)
    assert stats.cache_hits == 1 and stats.cache_hit_rate == 0.5

    restarted_inner = CountingAnnotator()
    restarted = CachedAnnotator(restarted_inner, path)  # a new process would do the same
    assert restarted.annotate([trajectory()])[0].cached and restarted_inner.calls == 0
    assert restarted.cache.hits == 1 and restarted.cache.misses == 0


def test_fallbacks_are_not_cached(tmp_path: Path) -> None:
    inner = CountingAnnotator(fail_on="refund")
    cached = CachedAnnotator(inner, tmp_path / "c.sqlite")
    results = cached.annotate([trajectory(), trajectory()])
    assert [r.cached for r in results] == [False, False] and inner.calls == 2
    assert len(cached.cache) == 0


def test_llm_annotator_behind_the_cache_skips_the_request(tmp_path: Path) -> None:
    graph = {
        "num_actions": 2,
        "errors": [],
        "direct_user_inputs": {},
        "edges": [{"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "yes"}],
    }
    with OpenAIStubServer(lambda request: Reply.json(graph)) as server:
        path = tmp_path / "llm.sqlite"
        options = {"base_urls": server.base_url, "model": "stub-model", "fallback": "uniform", "cache_path": path}
        first = build_annotator("llm", **options).annotate([trajectory()])[0]
        second = build_annotator("llm", **options).annotate([trajectory()])[0]  # restart
        other_model = build_annotator("llm", **{**options, "model": "other"}).annotate([trajectory()])[0]
        assert (first.cached, second.cached, other_model.cached) == (False, True, False)
        assert second.source == "llm" and [(e.src, e.dst) for e in second.graph.edges] == [(0, 1)]
        assert len(server.chat_requests) == 2  # first run and the other model; the restart hit the cache


def test_a_broken_cache_is_counted_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "broken.sqlite"
    inner = CountingAnnotator()
    cached = CachedAnnotator(inner, path)
    # someone broke the file; a view, since a worker thread's new connection would recreate a
    # dropped table (CREATE TABLE IF NOT EXISTS) and heal the cache
    broken = sqlite3.connect(path, isolation_level=None)
    broken.execute("DROP TABLE graphs")
    broken.execute("CREATE VIEW graphs AS SELECT 1 AS key")
    broken.close()
    result = cached.annotate([trajectory()])[0]
    assert result.source == "counting" and not result.cached and inner.calls == 1
    assert cached.cache.errors == 2  # the failed lookup and the failed store


class GatedAnnotator(CountingAnnotator):
    """Counts calls and waits for ``gate`` (so that two annotations overlap)."""

    def __init__(self, fail_on: str = "") -> None:
        super().__init__(fail_on)
        self.gate: asyncio.Event | None = None

    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        assert self.gate is not None
        await self.gate.wait()
        return await super().annotate_one(trajectory)


def _two_at_once(cached: CachedAnnotator, inner: GatedAnnotator) -> list[AnnotationResult]:
    async def go() -> list[AnnotationResult]:
        inner.gate = asyncio.Event()
        tasks = [asyncio.ensure_future(cached.annotate_one(trajectory(trajectory_id=i))) for i in ("a", "b")]
        while cached.cache.misses < 2:  # both looked the transcript up (off the loop) and missed
            await asyncio.sleep(0.001)
        inner.gate.set()
        return list(await asyncio.gather(*tasks))

    return asyncio.run(go())


def test_the_same_transcript_in_flight_twice_is_annotated_once(tmp_path: Path) -> None:
    inner = GatedAnnotator()
    cached = CachedAnnotator(inner, tmp_path / "c.sqlite")
    first, second = _two_at_once(cached, inner)
    # whichever lookup came back first annotates; the other shares its result
    assert inner.calls == 1 and sorted([first.cached, second.cached]) == [False, True]
    assert second.graph == first.graph and first.source == second.source == "counting"
    assert cached.cache.joined == 1 and cached.cache.writes == 1


def test_a_shared_annotation_that_falls_back_is_redone(tmp_path: Path) -> None:
    inner = GatedAnnotator(fail_on="refund")
    cached = CachedAnnotator(inner, tmp_path / "c.sqlite")
    first, second = _two_at_once(cached, inner)
    assert inner.calls == 2 and first.fallback and second.fallback and not second.cached
    assert cached.cache.joined == 0 and len(cached.cache) == 0
