"""The annotator interface: trajectories in, validated graphs out, asynchronously and batched.

Every annotator (``rules``, ``llm``, ``hybrid``) subclasses :class:`Annotator` and implements
:meth:`Annotator.annotate_one`. Results always carry a *valid* graph: a failure becomes a
counted fallback (``source`` says which), never an exception into the training loop.

Annotators are chosen by name from :data:`ANNOTATORS` (``build_annotator``), not by an ``if``
chain; a module registers its class with :func:`register_annotator`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.trajectory import Trajectory

__all__ = [
    "ANNOTATORS",
    "AnnotationResult",
    "AnnotationStats",
    "Annotator",
    "annotator_class",
    "build_annotator",
    "register_annotator",
]


@dataclass
class AnnotationResult:
    """One trajectory's annotation.

    ``source``: ``"rules"``, ``"llm"``, ``"given"`` (the record's own graph), or
    ``"fallback:rules"`` / ``"fallback:uniform"`` after a failure; ``cached`` when it came from
    the cache. ``uncertain`` is the rule annotator's flag that a stronger annotator should look.
    """

    graph: InfluenceGraph
    validation: GraphValidation
    source: str
    cached: bool = False
    seconds: float = 0.0
    uncertain: bool = False
    error: str | None = None

    @property
    def fallback(self) -> bool:
        return self.validation.fallback or self.source.startswith("fallback")

    def to_record(self, trajectory_id: str, annotator: str) -> dict[str, Any]:
        """A line of the graphs JSONL (DESIGN.md section 8)."""
        record: dict[str, Any] = {"id": trajectory_id, "annotator": annotator}
        if self.source == "fallback:uniform" and self.error:
            record["graph"] = None
            record["error"] = self.error
        else:
            record["graph"] = self.graph.to_json()
        record["source"] = self.source
        record["repaired_edges"] = self.validation.repaired_edges
        record["fallback"] = self.fallback
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

    def add(self, result: AnnotationResult) -> None:
        self.total += 1
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


def build_annotator(name: str, **options: Any) -> Annotator:
    """Instantiate a registered annotator; unknown names list the registered ones.

    ``cache_path`` wraps annotators that do not cache themselves in a ``CachedAnnotator``.
    """
    factory = annotator_class(name)
    cache_path = options.pop("cache_path", None)
    if cache_path is not None and "cache_path" in inspect.signature(factory).parameters:
        return factory(cache_path=cache_path, **options)
    annotator = factory(**options)
    if cache_path is not None:
        from verl_credit.annotate.cache import CachedAnnotator

        return CachedAnnotator(annotator, cache_path)
    return annotator


def _import_builtin_annotators() -> None:
    # Imported lazily so that `annotate.base` stays free of httpx/sqlite imports.
    import importlib

    for module in ("verl_credit.annotate.rules", "verl_credit.annotate.llm", "verl_credit.annotate.hybrid"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside the module: say so
                raise
