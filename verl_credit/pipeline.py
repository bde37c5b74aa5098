"""Offline credit pipeline: trajectories -> graphs (given or annotated) -> batch credit.

The same steps the trainer runs per step, for files: used by ``verl-credit route`` and the demo.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_credit.annotate.base import AnnotationResult, AnnotationStats, Annotator, build_annotator, graph_from_record
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.routing import BatchCredit, compute_batch_credit, trajectory_scores
from verl_credit.trajectory import Trajectory

__all__ = ["RoutedBatch", "annotate_trajectories", "build_call_graphs", "route_trajectories"]


@dataclass
class RoutedBatch:
    trajectories: list[Trajectory]
    credit: BatchCredit
    annotations: list[AnnotationResult] | None
    call_graphs: list[CallGraph] | None
    stats: AnnotationStats


async def _annotate_missing(
    trajectories: Sequence[Trajectory], annotator: Annotator, progress: Callable[[int], Any] | None
) -> list[AnnotationResult]:
    results: list[AnnotationResult | None] = [graph_from_record(t) for t in trajectories]
    missing = [i for i, result in enumerate(results) if result is None]
    if progress is not None:
        progress(len(trajectories) - len(missing))
    semaphore = asyncio.Semaphore(max(1, annotator.concurrency))

    async def one(i: int) -> None:
        async with semaphore:
            batch = await annotator.annotate_batch([trajectories[i]])
        results[i] = batch[0]
        if progress is not None:
            progress(1)

    await asyncio.gather(*(one(i) for i in missing))
    return [result for result in results if result is not None]


def annotate_trajectories(
    trajectories: Sequence[Trajectory],
    annotator: Annotator | str = "rules",
    annotator_options: dict[str, Any] | None = None,
    progress: Callable[[int], Any] | None = None,
) -> tuple[list[AnnotationResult], AnnotationStats]:
    """Influence graphs for every trajectory: a record's own ``graph`` (validated) when present,
    otherwise the annotator's. ``progress(n)`` is called as trajectories complete."""
    if isinstance(annotator, str):
        annotator = build_annotator(annotator, **(annotator_options or {}))

    async def run() -> list[AnnotationResult]:
        try:
            return await _annotate_missing(trajectories, annotator, progress)
        finally:
            await annotator.aclose()

    results = asyncio.run(run())
    stats = AnnotationStats()
    for result in results:
        stats.add(result)
    return results, stats


def build_call_graphs(trajectories: Sequence[Trajectory]) -> list[CallGraph]:
    """CALL-CREDIT role + causal graphs (rule classifier) for every trajectory."""
    from verl_credit.annotate.roles import build_call_graph

    return [build_call_graph(trajectory) for trajectory in trajectories]


def route_trajectories(
    trajectories: list[Trajectory],
    config: CreditConfig,
    annotator: Annotator | str = "rules",
    annotator_options: dict[str, Any] | None = None,
    progress: Callable[[int], Any] | None = None,
) -> RoutedBatch:
    """Group-normalize rewards by ``uid`` over the whole list and route credit per ``config``."""
    # non-finite rewards are refused (naming the trajectory) before any annotation work; huge
    # finite ones are kept in float64 so their group's advantages stay finite
    scores = trajectory_scores([t.reward for t in trajectories], names=[t.id for t in trajectories])
    annotations: list[AnnotationResult] | None = None
    call_graphs: list[CallGraph] | None = None
    stats = AnnotationStats()
    if config.estimator == "iapo":
        annotations, stats = annotate_trajectories(trajectories, annotator, annotator_options, progress)
    elif config.estimator == "call_credit":
        call_graphs = build_call_graphs(trajectories)
        if progress is not None:
            progress(len(trajectories))
    elif progress is not None:
        progress(len(trajectories))
    credit = compute_batch_credit(
        scores,
        [t.uid for t in trajectories],
        [t.action_lengths for t in trajectories],
        config,
        graphs=[a.graph for a in annotations] if annotations is not None else None,
        call_graphs=call_graphs,
    )
    return RoutedBatch(trajectories, credit, annotations, call_graphs, stats)
