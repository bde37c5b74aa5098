"""Annotation off the trainer's critical path.

The agent loop annotates each trajectory as soon as its episode ends
(:func:`annotate_finished_trajectory`, awaited inside the rollout worker's event loop, so it
overlaps with the other sessions still generating) and stores the result in the final row's
``extra_fields["credit"]``:

    {"graph": <section 2.1 JSON>, "annotation": {source, cached, seconds, fallback, repaired_edges, ...}}
    {"call_graph": <CallGraph JSON>, "rv_status": [...], "annotation": {...}}       (call_credit)

Everything CPU-bound here (the call classifier, the rule annotator) runs in a worker thread:
the rollout worker's event loop serves every other session (about 64) meanwhile.

The trainer only *reads* these (:func:`result_from_payload`) and annotates synchronously just the
sessions that arrive without one (:func:`annotate_now`; counted as ``credit/annotated_in_trainer``),
all of them together within ``credit.annotator.deadline`` (every GPU waits meanwhile): the ones
not done by then get ``credit.annotator.fallback`` at once (counted in ``credit/fallback_rate`` and
``credit/trainer_annotation_timeouts``).

Every annotator reads :func:`annotation_view` of a trajectory: the assistant messages without
their reasoning (a thinking model's ``<think>...</think>`` block, which verl's tool parser leaves in
the content). The graph is about what the agent did and said; a long reasoning block would also
fill the annotator's prompt budget and push the answer out of it. The actions, their order and
their token lengths are unchanged, so the graph's indices and the trained spans still line up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from verl_credit.annotate.base import AnnotationResult, Annotator, annotator_class
from verl_credit.annotate.factory import build_annotator
from verl_credit.call_graph import CallGraph
from verl_credit.estimators.needs import gather_needs
from verl_credit.estimators.registry import get_estimator
from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.openai_chat import strip_thinking
from verl_credit.trajectory import Trajectory
from verl_credit.verl.settings import AnnotatorSettings

__all__ = [
    "TRAINER_DEADLINE_ERROR",
    "annotate_finished_trajectory",
    "annotate_now",
    "annotate_within_deadline",
    "annotation_view",
    "build_call_graph",
    "make_annotator",
    "result_from_payload",
    "result_summary",
    "rollout_annotator",
]

logger = logging.getLogger(__name__)

#: ``error`` of the fallback a session gets when the trainer's own annotation passed ``credit.annotator.deadline``
TRAINER_DEADLINE_ERROR = "the trainer's annotation passed credit.annotator.deadline"

# One annotator per (process, settings): shares its concurrency limit, HTTP client and cache
# across all sessions of a rollout worker. Keyed by the event loop too, since async clients are
# bound to the loop that created them.
_ROLLOUT_ANNOTATORS: dict[tuple[AnnotatorSettings, int], Annotator] = {}


def make_annotator(settings: AnnotatorSettings) -> Annotator:
    """Build the configured annotator, passing only the options its constructor accepts, behind
    ``credit.annotator.cache_path`` when set (:func:`verl_credit.annotate.factory.build_annotator`)."""
    try:
        cls = annotator_class(settings.name)
    except ValueError as exc:
        raise ValueError(f"credit.annotator.name: {exc}") from None
    options = settings.annotator_options()
    accepted = _accepted_options(cls)
    if accepted is not None:
        options = {key: value for key, value in options.items() if key in accepted}
    annotator = build_annotator(settings.name, cache_path=settings.cache_path or None, **options)
    annotator.concurrency = settings.concurrency
    return annotator


def rollout_annotator(settings: AnnotatorSettings) -> Annotator:
    """The process-wide annotator of the running event loop (built on first use)."""
    key = (settings, id(asyncio.get_running_loop()))
    annotator = _ROLLOUT_ANNOTATORS.get(key)
    if annotator is None:
        annotator = _ROLLOUT_ANNOTATORS[key] = make_annotator(settings)
    return annotator


def build_call_graph(trajectory: Trajectory) -> tuple[CallGraph, list[str | None]]:
    """CALL-CREDIT roles + causal edges of a trajectory (rule classifier, one call per action) and
    each call's verification outcome (``"pass"``/``"fail"``/``None``, for the RV reward)."""
    try:
        from verl_credit.annotate.roles import call_graph_and_outcomes
    except ModuleNotFoundError as exc:
        if exc.name != "verl_credit.annotate.roles":
            raise
        raise RuntimeError("the call_credit estimator needs verl_credit.annotate.roles (call classifier)") from exc
    graph, outcomes = call_graph_and_outcomes(trajectory)
    if graph.num_calls != trajectory.num_actions:
        raise ValueError(f"call graph has {graph.num_calls} calls for {trajectory.num_actions} actions")
    return graph, outcomes


def result_summary(result: AnnotationResult) -> dict[str, Any]:
    """The JSON-safe bookkeeping of one annotation (stored beside the graph)."""
    return {
        "source": result.source,
        "cached": bool(result.cached),
        "seconds": float(result.seconds),
        "uncertain": bool(result.uncertain),
        "fallback": bool(result.fallback),
        "repaired_edges": int(result.validation.repaired_edges),
        "errors_added": int(result.validation.errors_added),
        "error": result.error,
        "prompt_truncated": bool(result.prompt_truncated),
    }


def annotation_view(trajectory: Trajectory) -> Trajectory:
    """``trajectory`` as the annotators read it: each assistant message's text without reasoning
    (:func:`verl_credit.openai_chat.strip_thinking`: ``<think>`` blocks, everything before a lone
    ``</think>``, an unclosed ``<think>`` to the end); tool calls, actions, order and token lengths
    as they were. The trajectory itself when no message has reasoning."""
    if not any(_has_reasoning(message) for message in trajectory.messages):
        return trajectory
    messages = [
        {**message, "content": strip_thinking(message["content"])} if _has_reasoning(message) else message
        for message in trajectory.messages
    ]
    view = Trajectory.from_messages(
        messages,
        id=trajectory.id,
        uid=trajectory.uid,
        reward=trajectory.reward,
        action_token_lengths=[action.length for action in trajectory.actions],
        graph=trajectory.graph,
    )
    view.extra = dict(trajectory.extra)
    return view


def _has_reasoning(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return message.get("role") == "assistant" and isinstance(content, str) and "think>" in content


async def annotate_finished_trajectory(
    trajectory: Trajectory, estimator: str, settings: AnnotatorSettings, annotator: Annotator | None = None
) -> dict[str, Any]:
    """The annotation payload of a finished trajectory for ``extra_fields["credit"]``, by what the
    estimator needs (``Estimator.needs``).

    Influence graphs (``iapo``): from the configured annotator (validated; failures become counted
    fallbacks inside the annotator). Call graphs (``call_credit``): from the rule classifier.
    Every other estimator gets the call graph for ``credit/reward_hacking_rate`` only (anchor
    states and turn rewards need no annotation: the trainer reads them from the transcript and
    the environment's ``turn_rewards``). Every annotator reads :func:`annotation_view` of the trajectory.
    """
    trajectory = annotation_view(trajectory)

    async def influence_graph() -> dict[str, Any]:
        result = (await (annotator or rollout_annotator(settings)).annotate_batch([trajectory]))[0]
        roles = await asyncio.to_thread(_metric_roles, trajectory)
        return {"graph": result.graph.to_json(), "annotation": result_summary(result), **roles}

    async def call_graph() -> dict[str, Any]:  # with each call's verification outcome (rv_statuses)
        started = time.perf_counter()
        graph, rv_status = await asyncio.to_thread(build_call_graph, trajectory)
        return {
            "call_graph": graph.to_json(),
            "rv_status": rv_status,
            "annotation": {"source": "roles", "seconds": time.perf_counter() - started, "fallback": False},
        }

    # what a rollout annotates; the other needs are read by the trainer from the transcript, the
    # environment's turn rewards and its own forward passes
    annotations = gather_needs(
        get_estimator(estimator).needs,
        {"influence_graphs": influence_graph, "call_graphs": call_graph},
        estimator=estimator,
        where="the rollout's annotation",
        partial=True,
    )
    if not annotations:
        return await asyncio.to_thread(_metric_roles, trajectory)
    payload: dict[str, Any] = {}
    for annotation in annotations.values():  # in the order of NEEDS: a call graph replaces the roles'
        payload.update(await annotation)
    return payload


def _metric_roles(trajectory: Trajectory) -> dict[str, Any]:
    """The call graph (IG/AE/RV roles) for the ``credit/reward_hacking_rate`` metric of estimators
    that do not route with it; nothing when the classifier fails (the metric then skips the batch)."""
    try:
        graph, _ = build_call_graph(trajectory)
    except Exception as exc:
        logger.warning("credit: call roles of %s for the metrics failed: %r", trajectory.id, exc)
        return {}
    return {"call_graph": graph.to_json()}


def result_from_payload(payload: Mapping[str, Any], num_actions: int) -> AnnotationResult | None:
    """The stored influence graph of a session (re-validated against its action count), with the
    original annotation's bookkeeping; ``None`` when the session carries no graph."""
    raw = payload.get("graph")
    if raw is None:
        return None
    graph, validation = validate_graph(raw, num_actions)
    summary = dict(payload.get("annotation") or {})
    merged = GraphValidation(
        fallback=validation.fallback or bool(summary.get("fallback", False)),
        repaired_edges=validation.repaired_edges + int(summary.get("repaired_edges", 0)),
        errors_added=validation.errors_added + int(summary.get("errors_added", 0)),
        problems=validation.problems,
    )
    return AnnotationResult(
        graph=graph,
        validation=merged,
        source=str(summary.get("source", "given")),
        cached=bool(summary.get("cached", False)),
        seconds=float(summary.get("seconds", 0.0)),
        uncertain=bool(summary.get("uncertain", False)),
        error=summary.get("error"),
        prompt_truncated=bool(summary.get("prompt_truncated", False)),
    )


def annotate_now(trajectories: Sequence[Trajectory], settings: AnnotatorSettings) -> list[AnnotationResult]:
    """Annotate trajectories synchronously (the trainer's path for sessions without a graph), all
    within ``settings.deadline`` (:func:`annotate_within_deadline`), each as :func:`annotation_view`.

    A fresh annotator is built and closed per call, so no async client outlives its event loop.
    Works from synchronous code whether or not the calling thread runs an event loop.
    """
    if not trajectories:
        return []
    views = [annotation_view(trajectory) for trajectory in trajectories]

    async def run() -> list[AnnotationResult]:
        annotator = make_annotator(settings)
        try:
            return await annotate_within_deadline(annotator, views, settings)
        finally:
            await annotator.aclose()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()


async def annotate_within_deadline(
    annotator: Annotator, trajectories: Sequence[Trajectory], settings: AnnotatorSettings
) -> list[AnnotationResult]:
    """``annotator``'s results for ``trajectories`` (``settings.concurrency`` at once); those not
    done within ``settings.deadline`` seconds (``None``: no limit), or whose annotation raised, get
    ``settings.fallback`` (the rule annotator's graph, or the uniform graph) with
    ``TRAINER_DEADLINE_ERROR`` or the exception as their error."""
    semaphore = asyncio.Semaphore(max(1, settings.concurrency))

    async def one(trajectory: Trajectory) -> AnnotationResult:
        async with semaphore:
            return (await annotator.annotate_batch([trajectory]))[0]

    tasks = [asyncio.ensure_future(one(trajectory)) for trajectory in trajectories]
    _, pending = await asyncio.wait(tasks, timeout=settings.deadline)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    results: list[AnnotationResult | None] = []
    failed: dict[int, str] = {}
    for number, task in enumerate(tasks):
        if task in pending:
            failed[number] = TRAINER_DEADLINE_ERROR
        elif task.exception() is not None:
            failed[number] = f"the trainer's annotation failed: {task.exception()!r}"
        results.append(None if number in failed else task.result())
    if failed:
        logger.warning(
            "credit: %d of %d sessions annotated by the trainer get the %s fallback (%s)",
            len(failed),
            len(tasks),
            settings.fallback,
            "; ".join(sorted(set(failed.values()))),
        )
        fallbacks = await _fallback_results([trajectories[number] for number in failed], settings)
        for (number, error), result in zip(failed.items(), fallbacks, strict=True):
            results[number] = replace(result, error=error)
    return [result for result in results if result is not None]


async def _fallback_results(trajectories: Sequence[Trajectory], settings: AnnotatorSettings) -> list[AnnotationResult]:
    """``settings.fallback`` for ``trajectories``: the rule annotator's graphs, or uniform graphs."""
    if settings.fallback == "rules":
        rules = make_annotator(settings.rule_fallback())
        try:
            found = await rules.annotate_batch(list(trajectories))
        finally:
            await rules.aclose()
        return [replace(result, source="fallback:rules") for result in found]
    return [
        AnnotationResult(InfluenceGraph.uniform(t.num_actions), GraphValidation(fallback=True), "fallback:uniform")
        for t in trajectories
    ]


def _accepted_options(cls: Any) -> set[str] | None:
    """Keyword names ``cls(...)`` accepts, or ``None`` when it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
