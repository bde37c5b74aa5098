"""The annotator interface: trajectories in, validated graphs out, asynchronously and batched.

Every annotator (``rules``, ``llm``, ``hybrid``) subclasses :class:`Annotator` and implements
:meth:`Annotator.annotate_one`. Results always carry a *valid* graph: a failure becomes a
counted fallback (``source`` says which), never an exception into the training loop.

Annotators are chosen by name from :data:`ANNOTATORS` (:func:`annotator_class`;
:func:`verl_credit.annotate.factory.build_annotator` builds one and attaches the cache), not by an
``if`` chain; a module registers its class with :func:`register_annotator`.

Annotators run inside verl's rollout worker, on the event loop that also serves every other
agent session, so synchronous work that can take milliseconds must not run on that loop. The
rule annotator hands its pass to a worker thread itself; the LLM annotator and the cache use two
small process-wide worker pools: :func:`run_blocking` (CPU work -- rendering and parsing long
prompts and replies -- on :data:`CPU_WORKERS` threads; few, since CPU-bound Python threads contend
for the GIL with the loop) and :func:`run_blocking_io` (sqlite reads and writes, which may wait
for another process's write lock, on :data:`IO_WORKERS` threads; see
:class:`verl_credit.annotate.cache.GraphCache` for the per-thread connections).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.trajectory import Trajectory

__all__ = [
    "ANNOTATORS",
    "AnnotationResult",
    "AnnotationStats",
    "Annotator",
    "annotator_class",
    "register_annotator",
    "run_blocking",
    "run_blocking_io",
]

T = TypeVar("T")
#: threads of the CPU pool (rendering long prompts, parsing long replies)
CPU_WORKERS = 2
#: threads of the I/O pool (sqlite cache reads and writes, which may wait for another process's lock)
IO_WORKERS = 4


class _WorkerPool:
    """A lazily started ``ThreadPoolExecutor`` shared by the whole process (and every event loop
    in it); a forked child starts its own, since the parent's threads do not exist there."""

    def __init__(self, name: str, workers: int):
        self.name = name
        self.workers = workers
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name)
            return self._executor

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._executor = None


_CPU_POOL = _WorkerPool("verl-credit-annotate-cpu", CPU_WORKERS)
_IO_POOL = _WorkerPool("verl-credit-annotate-io", IO_WORKERS)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: (_CPU_POOL._after_fork(), _IO_POOL._after_fork()))


async def _run_in(pool: _WorkerPool, function: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)
    return await loop.run_in_executor(pool.executor(), call)


async def run_blocking(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` on the CPU worker pool; the event loop keeps serving other
    coroutines meanwhile. Exceptions propagate; cancelling the awaiting task does not stop the
    thread (the call runs to its end, its result is dropped)."""
    return await _run_in(_CPU_POOL, function, args, kwargs)


async def run_blocking_io(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Like :func:`run_blocking`, on the I/O pool (blocking file and sqlite work)."""
    return await _run_in(_IO_POOL, function, args, kwargs)


@dataclass
class AnnotationResult:
    """One trajectory's annotation.

    ``source``: ``"rules"``, ``"llm"``, ``"given"`` (the record's own graph), or
    ``"fallback:rules"`` / ``"fallback:uniform"`` after a failure; ``cached`` when it came from
    the cache. ``uncertain`` is the rule annotator's flag that a stronger annotator should look.
    ``prompt_truncated``: the LLM annotator shortened texts of the transcript to fit the server's
    context (every action was still in the prompt; see :mod:`verl_credit.annotate.prompt`).
    """

    graph: InfluenceGraph
    validation: GraphValidation
    source: str
    cached: bool = False
    seconds: float = 0.0
    uncertain: bool = False
    error: str | None = None
    prompt_truncated: bool = False

    @property
    def fallback(self) -> bool:
        return self.validation.fallback or self.source.startswith("fallback")

    def to_record(self, trajectory_id: str, annotator: str) -> dict[str, Any]:
        """A line of the graphs JSONL (docs/design.md section 8)."""
        record: dict[str, Any] = {"id": trajectory_id, "annotator": annotator}
        if self.source == "fallback:uniform" and self.error:
            record["graph"] = None
            record["error"] = self.error
        else:
            record["graph"] = self.graph.to_json()
        record["source"] = self.source
        record["repaired_edges"] = self.validation.repaired_edges
        record["fallback"] = self.fallback
        if self.prompt_truncated:
            record["prompt_truncated"] = True
        return record


@dataclass
class AnnotationStats:
    """Counts summed over a batch; these become ``credit/*`` metrics and CLI summaries."""

    total: int = 0
    fallbacks: int = 0
    repaired_edges: int = 0
    cache_hits: int = 0
    parsed: int = 0
    seconds: float = 0.0
    by_source: dict[str, int] = field(default_factory=dict)
    truncated_prompts: int = 0
    """Results whose LLM prompt was shortened to fit the context (``AnnotationResult.prompt_truncated``)."""

    def add(self, result: AnnotationResult) -> None:
        self.total += 1
        self.truncated_prompts += int(result.prompt_truncated)
        self.fallbacks += int(result.fallback)
        self.repaired_edges += result.validation.repaired_edges
        self.cache_hits += int(result.cached)
        self.parsed += int(not result.fallback)
        self.seconds += result.seconds
        self.by_source[result.source] = self.by_source.get(result.source, 0) + 1

    @property
    def fallback_rate(self) -> float:
        return self.fallbacks / self.total if self.total else 0.0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hits / self.total if self.total else 0.0

    @property
    def parse_rate(self) -> float:
        return self.parsed / self.total if self.total else 0.0


class Annotator(ABC):
    """Base class: implement :meth:`annotate_one`; batching and timing come for free."""

    name: str = "base"
    #: limit on trajectories annotated at once by :meth:`annotate_batch`
    concurrency: int = 16

    @abstractmethod
    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        """Annotate one trajectory. Must not raise for bad content: return a fallback result."""

    async def annotate_batch(self, trajectories: Sequence[Trajectory]) -> list[AnnotationResult]:
        """Annotate many trajectories concurrently (bounded by ``concurrency``), in order."""
        semaphore = asyncio.Semaphore(max(1, self.concurrency))

        async def run(trajectory: Trajectory) -> AnnotationResult:
            async with semaphore:
                started = time.perf_counter()
                result = await self.annotate_one(trajectory)
                result.seconds = time.perf_counter() - started
                return result

        return list(await asyncio.gather(*(run(t) for t in trajectories)))

    def annotate(self, trajectories: Sequence[Trajectory]) -> list[AnnotationResult]:
        """Synchronous convenience wrapper (not for use inside a running event loop)."""
        return asyncio.run(self.annotate_batch(trajectories))

    async def aclose(self) -> None:
        """Release network clients, caches, ... (default: nothing)."""


def graph_from_record(trajectory: Trajectory) -> AnnotationResult | None:
    """The record's own ``graph`` field, validated, or ``None`` when the record has none."""
    if trajectory.graph is None:
        return None
    graph, validation = validate_graph(trajectory.graph, trajectory.num_actions)
    return AnnotationResult(graph, validation, "given")


ANNOTATORS: dict[str, Callable[..., Annotator]] = {}


def register_annotator(name: str) -> Callable[[type[Annotator]], type[Annotator]]:
    def decorator(cls: type[Annotator]) -> type[Annotator]:
        existing = ANNOTATORS.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"annotator {name!r} is already registered to {existing}")
        ANNOTATORS[name] = cls
        cls.name = name
        return cls

    return decorator


def annotator_class(name: str) -> Callable[..., Annotator]:
    """The registered annotator factory for ``name`` (built-ins imported on first use)."""
    _import_builtin_annotators()
    if name not in ANNOTATORS:
        raise ValueError(f"unknown annotator {name!r}; registered: {sorted(ANNOTATORS)}")
    return ANNOTATORS[name]


def _import_builtin_annotators() -> None:
    # Imported lazily so that `annotate.base` stays free of httpx/sqlite imports.
    import importlib

    for module in ("verl_credit.annotate.rules", "verl_credit.annotate.llm", "verl_credit.annotate.hybrid"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside the module: say so
                raise
