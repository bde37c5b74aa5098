"""Offline credit pipeline: trajectories -> graphs (given or annotated) -> batch credit.

The same steps the trainer runs per step, for files: used by ``verl-credit route`` and the demo.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from verl_credit.annotate.base import AnnotationResult, AnnotationStats, Annotator, graph_from_record
from verl_credit.annotate.factory import build_annotator
from verl_credit.batch_credit import BatchCredit, credit_from_inputs, credit_with_token_hook, trajectory_scores
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.estimators.needs import anchor_states_of, gather_needs, information_gains_of, turn_rewards_of
from verl_credit.estimators.registry import EstimatorInputs
from verl_credit.graph import InfluenceGraph
from verl_credit.trajectory import Trajectory

__all__ = [
    "RoutedBatch",
    "annotate_trajectories",
    "build_call_graphs",
    "call_graphs_and_outcomes",
    "close_loop",
    "route_group",
    "route_stream",
    "route_trajectories",
]


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
    return [graph for graph, _ in call_graphs_and_outcomes(trajectories)]


def call_graphs_and_outcomes(trajectories: Sequence[Trajectory]) -> list[tuple[CallGraph, list[str | None]]]:
    """Call graphs and each call's verification outcome (the RV reward's input), one classifier pass."""
    from verl_credit.annotate.roles import call_graph_and_outcomes

    return [call_graph_and_outcomes(trajectory) for trajectory in trajectories]


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
    estimator = config.registered_estimator
    annotations: list[AnnotationResult] | None = None
    stats = AnnotationStats()
    call_graphs: list[tuple[CallGraph, list[str | None]]] = []

    def influence_graphs() -> list[InfluenceGraph]:
        nonlocal annotations, stats
        annotations, stats = annotate_trajectories(trajectories, annotator, annotator_options, progress)
        return [a.graph for a in annotations]

    def classified_calls() -> list[CallGraph]:
        call_graphs.extend(call_graphs_and_outcomes(trajectories))
        return [graph for graph, _ in call_graphs]

    gathered = gather_needs(
        estimator.needs,
        {
            "influence_graphs": influence_graphs,
            "call_graphs": classified_calls,
            # from the same classifier pass as the call graphs (gathered first)
            "rv_statuses": lambda: [outcomes for _, outcomes in call_graphs],
            "anchor_states": lambda: anchor_states_of(trajectories, config),
            "turn_rewards": lambda: turn_rewards_of(trajectories),
            "information_gains": lambda: information_gains_of(trajectories),
        },
        estimator=config.estimator,
        where="the offline pipeline",
    )
    if not estimator.needs_annotator and progress is not None:
        progress(len(trajectories))
    inputs = EstimatorInputs(uids=[t.uid for t in trajectories], scores=scores, **gathered)
    credit = credit_from_inputs(inputs, [t.action_lengths for t in trajectories], config)
    credit, _ = credit_with_token_hook(credit, inputs, config)
    return RoutedBatch(trajectories, credit, annotations, gathered.get("call_graphs"), stats)


# Streaming (``verl-credit route`` on a file grouped by uid): one group at a time.

#: group key of the width row of :func:`route_group`; never a record's (``io.group_key`` is a
#: ``json.dumps``, which escapes control characters)
_WIDTH_ROW_UID = "\x00width-row"


def route_group(
    trajectories: list[Trajectory],
    config: CreditConfig,
    annotations: list[AnnotationResult] | None = None,
    *,
    width: int = 0,
) -> RoutedBatch:
    """Route whole GRPO groups (``uid`` = group key) bit for bit as :func:`route_trajectories`
    routes them inside a whole file whose widest trajectory has ``width`` actions, provided every
    reward of that file is below ``grpo.WIDE_SCORE`` in magnitude (float32 scores).

    Groups are independent (GRPO statistics, anchor groups) and rows independent in the
    per-action math, but the padded width is batch-wide and changes bits (it sets the order in
    which torch sums a row). When the group's own width is smaller, one zero-length row of
    ``width`` actions, in a group of its own, is routed along and dropped from the result.
    (Float64 scores -- a file with a wide reward -- are not covered: torch's float64 ``std`` of a
    row depends on how many groups of that size are stacked with it.) ``annotations``: each
    trajectory's graph result, already made (estimators that need influence graphs); no
    annotator runs here.
    """
    from verl_credit.credit_math.grpo import WIDE_SCORE

    needs_graphs = config.registered_estimator.needs_annotator
    if needs_graphs and (annotations is None or len(annotations) != len(trajectories)):
        raise ValueError("route_group needs one annotation per trajectory for this estimator")
    batch = list(trajectories)
    if needs_graphs and annotations is not None:
        batch = [dataclasses.replace(t, graph=a.graph) for t, a in zip(trajectories, annotations, strict=True)]
    if any(abs(t.reward) >= WIDE_SCORE for t in trajectories):
        raise ValueError(f"route_group routes float32 scores only (every |reward| < {WIDE_SCORE:g})")
    own_width = max([t.num_actions for t in trajectories] + [1])
    padded = max(width, 1) > own_width
    if padded:
        count = max(width, own_width)
        batch.append(
            Trajectory.from_messages(
                [{"role": "assistant", "content": ""} for _ in range(count)],
                id="",
                uid=_WIDTH_ROW_UID,
                reward=0.0,
                action_token_lengths=[0] * count,
                graph=InfluenceGraph.uniform(count),
            )
        )
    routed = route_trajectories(batch, config, "rules")
    credit, call_graphs = routed.credit, routed.call_graphs
    if padded:
        credit = _first_rows(credit, len(trajectories))
        call_graphs = call_graphs[: len(trajectories)] if call_graphs is not None else None
    stats = AnnotationStats()
    for result in annotations or []:
        stats.add(result)
    return RoutedBatch(list(trajectories), credit, annotations if needs_graphs else None, call_graphs, stats)


def _first_rows(credit: BatchCredit, rows: int) -> BatchCredit:
    """``credit`` restricted to its first ``rows`` trajectories (every batch-shaped tensor)."""
    import torch

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return value[:rows]
        if isinstance(value, dict):
            return {name: cut(item) for name, item in value.items()}
        return value

    return dataclasses.replace(credit, **{f.name: cut(getattr(credit, f.name)) for f in dataclasses.fields(credit)})


@dataclass
class _OpenGroup:
    key: str
    trajectories: list[Trajectory] = dataclasses.field(default_factory=list)
    results: list[Any] = dataclasses.field(default_factory=list)  # AnnotationResult or its task

    def done(self) -> bool:
        return all(not isinstance(r, asyncio.Future) or r.done() for r in self.results)


def route_stream(
    items: Iterable[tuple[str, Trajectory]],
    config: CreditConfig,
    annotator: Annotator | str = "rules",
    annotator_options: dict[str, Any] | None = None,
    *,
    width: int = 0,
    window: int | None = None,
    progress: Callable[[int], Any] | None = None,
) -> Iterator[RoutedBatch]:
    """Route ``(group_key, trajectory)`` pairs of a file grouped by key (each group's pairs
    consecutive), yielding one :class:`RoutedBatch` per group, in order, as each completes.

    The result is the one :func:`route_trajectories` gives for the whole file (``width``: the
    file's most actions; every reward below ``grpo.WIDE_SCORE``; see :func:`route_group`); the
    batches' ``trajectories`` are the pairs' own (their ``uid`` kept).
    Memory: the group being read, plus, while the annotator works on them, up to ``window``
    trajectories of the groups after it (default: the annotator's ``concurrency``; estimators
    without influence graphs hold one group). The annotator runs on one event loop for the
    whole stream and is closed when the stream ends or is closed.
    """
    needs_graphs = config.registered_estimator.needs_annotator
    if needs_graphs and isinstance(annotator, str):
        annotator = build_annotator(annotator, **(annotator_options or {}))
    assert not needs_graphs or isinstance(annotator, Annotator)
    limit = max(1, window if window is not None else (annotator.concurrency if needs_graphs else 1))  # type: ignore[union-attr]
    loop = asyncio.new_event_loop()
    semaphore = asyncio.Semaphore(max(1, getattr(annotator, "concurrency", 1)))

    async def annotate(trajectory: Trajectory) -> AnnotationResult:
        async with semaphore:
            return (await annotator.annotate_batch([trajectory]))[0]  # type: ignore[union-attr]

    def finish(group: _OpenGroup) -> RoutedBatch:
        results = [loop.run_until_complete(r) if isinstance(r, asyncio.Future) else r for r in group.results]
        keyed = [dataclasses.replace(t, uid=group.key) for t in group.trajectories]
        routed = route_group(keyed, config, results if needs_graphs else None, width=width)
        routed.trajectories = group.trajectories
        if progress is not None:
            progress(len(group.trajectories))
        return routed

    groups: deque[_OpenGroup] = deque()
    held = 0
    try:
        for key, trajectory in items:
            if not groups or groups[-1].key != key:
                groups.append(_OpenGroup(key))
            groups[-1].trajectories.append(trajectory)
            held += 1
            if needs_graphs:
                given = graph_from_record(trajectory)
                groups[-1].results.append(given if given is not None else loop.create_task(annotate(trajectory)))
                loop.run_until_complete(asyncio.sleep(0))  # let the new annotation start
            while len(groups) > 1 and (held > limit or groups[0].done()):
                held -= len(groups[0].trajectories)
                yield finish(groups.popleft())  # no reference to the group is kept here
        while groups:
            yield finish(groups.popleft())
    finally:
        close_loop(loop, annotator if needs_graphs else None)  # type: ignore[arg-type]


def close_loop(loop: asyncio.AbstractEventLoop, annotator: Annotator | None) -> None:
    """What ``asyncio.run`` does at its end: cancel what is left, close the annotator, stop the
    loop's executor (annotation threads) and close the loop."""
    try:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        if annotator is not None:
            loop.run_until_complete(annotator.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
