"""One training step as a plain record (the ``credit.debug.dump_dir`` dump), and read back as the
credit lines the report draws.

:func:`step_record` is what the credit trainer keeps of a step after ``_compute_advantage``: the
rows' keys, tags and uids, masks, token-level rewards, ``extra_fields["credit"]`` payloads
(transcripts, spans, graphs), the ``CreditConfig`` the step routed with and the advantages it
wrote -- the format :mod:`verl_credit.verl.credit_dump` documents. The dump writer adds what the
actor read; the live pictures (:mod:`verl_credit.verl.viz`) draw the same record.

:func:`rebuild_step` turns such a record into one :class:`~verl_credit.report.credit_input.CreditLine`
per session by running the trainer's own credit path again on the recorded inputs
(:func:`~verl_credit.verl.credit_step.compute_credit_advantages`), so the weights are the ones
the step routed with; graphs and call graphs come from the payloads. Two things it cannot redo
are reported, not hidden: a session whose graph the trainer annotated itself (it is not in the
record: the session is drawn with a uniform graph and says so) and the optional CALL-CREDIT parts
that replay sessions (``RebuiltStep.max_abs_diff`` then shows how far the rebuilt token
advantages are from the ones the trainer wrote).

:func:`read_step_record` / :func:`dumped_steps` read the dump folder (``step_<N>.pt``).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_credit.annotate.base import AnnotationResult
from verl_credit.config import CreditConfig
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.io import InputError
from verl_credit.report.credit_input import CreditLine, action_kinds, action_labels
from verl_credit.verl.annotation import result_from_payload
from verl_credit.verl.batch import CREDIT_KEY, credit_payload, group_sessions
from verl_credit.verl.credit_dump import DUMP_PATTERN, dump_path
from verl_credit.verl.credit_step import compute_credit_advantages
from verl_credit.verl.session_inputs import read_sessions, session_graphs
from verl_credit.verl.settings import AnnotatorSettings, CreditSettings

__all__ = [
    "NOT_RECORDED",
    "RebuiltStep",
    "dumped_steps",
    "read_step_record",
    "rebuild_step",
    "step_record",
]

#: ``source`` of the uniform graph a session gets here when its graph is not in the record
NOT_RECORDED = "not_recorded"
#: agreement below which the rebuilt token advantages count as the trainer's (fp32 rows)
AGREEMENT = 1e-6


def step_record(
    *,
    keys: Sequence[str],
    tags: Sequence[Mapping[str, Any]],
    uids: Sequence[Any],
    extras: Sequence[Any],
    rollout_mask: torch.Tensor,
    response_mask: torch.Tensor,
    token_level_rewards: torch.Tensor,
    estimator: str,
    config: CreditConfig,
    norm_adv_by_std_in_grpo: bool,
    advantages: torch.Tensor,
) -> dict[str, Any]:
    """The record of one step (:mod:`verl_credit.verl.credit_dump` format, without the actor's side).

    Tensors are copied: the record stays valid after the trainer reuses its batch."""
    return {
        "keys": list(keys),
        "tags": [dict(tag) for tag in tags],
        "uids": list(uids),
        "rollout_mask": rollout_mask.to(torch.int8),
        "response_mask": response_mask.to(torch.int8),
        "token_level_rewards": token_level_rewards.clone(),
        "payloads": [dict(credit_payload(extra)) or None for extra in extras],
        "estimator": estimator,
        "credit_config": config.to_mapping(),
        "norm_adv_by_std_in_grpo": bool(norm_adv_by_std_in_grpo),
        "epsilon": float(config.epsilon),
        "trainer_advantages": advantages.clone(),
    }


@dataclass
class RebuiltStep:
    """A step's sessions as credit lines, and how well the rebuild matches what the trainer wrote."""

    lines: list[CreditLine]
    max_abs_diff: float  # max |rebuilt token advantage - the trainer's| over the rows (nan: none recorded)
    not_recorded: int = 0  # sessions whose graph the trainer annotated (not in the record)
    notes: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return self.max_abs_diff <= AGREEMENT


def _graph_not_recorded(trajectories: Sequence[Any], settings: AnnotatorSettings) -> list[AnnotationResult]:
    """Stands in for the annotator: a session without a stored graph is drawn with the uniform
    graph (never re-annotated here: that could call an LLM, and give another graph)."""
    return [
        AnnotationResult(
            InfluenceGraph.uniform(trajectory.num_actions),
            GraphValidation(fallback=True),
            NOT_RECORDED,
            error="the graph is not in the record (the trainer annotated this session)",
        )
        for trajectory in trajectories
    ]


def rebuild_step(record: Mapping[str, Any]) -> RebuiltStep:
    """One :class:`CreditLine` per session of a step record, in the trainer's session order.

    Raises:
        ValueError: the record misses a field or its rows are malformed (names the field or row).
    """
    missing = [
        k for k in ("keys", "tags", "uids", "payloads", "rollout_mask", "token_level_rewards") if k not in record
    ]
    if "credit_config" not in record:
        missing.append("credit_config")
    if missing:
        raise ValueError(f"not a credit step record: missing {', '.join(missing)}")
    keys = list(record["keys"])
    tags = list(record["tags"])
    uids = list(record["uids"])
    extras = [{CREDIT_KEY: payload} if payload else {} for payload in record["payloads"]]
    rollout_mask = record["rollout_mask"].to(torch.long)
    response_mask = record.get("response_mask", record["rollout_mask"]).to(torch.long)
    rewards = record["token_level_rewards"]
    config = CreditConfig.from_mapping(record["credit_config"])
    settings = CreditSettings(credit=config)

    rebuilt = compute_credit_advantages(
        keys, tags, uids, extras, rollout_mask, response_mask, rewards, settings, annotate=_graph_not_recorded
    )
    sessions, _ = group_sessions(keys, tags, uids)
    if not sessions or rebuilt.credit is None:
        return RebuiltStep([], float("nan"))
    inputs = read_sessions(sessions, keys, extras, rollout_mask, rewards)
    found = session_graphs(sessions, inputs, settings, _graph_not_recorded)
    credit = rebuilt.credit

    written = record.get("trainer_advantages")
    max_abs_diff = float("nan")
    if isinstance(written, torch.Tensor) and written.shape == rebuilt.advantages.shape:
        max_abs_diff = float((rebuilt.advantages.double() - written.double()).abs().max()) if written.numel() else 0.0

    lines: list[CreditLine] = []
    not_recorded = 0
    for number, session in enumerate(sessions):
        payload = inputs.payloads[number]
        trajectory = inputs.trajectories[number]
        num_actions = len(inputs.lengths[number])
        call_graph = found.call_graphs[number] if found.call_graphs is not None else None
        line = CreditLine(
            id=session.key,
            uid=session.uid,
            reward=float(inputs.scores[number]),
            estimator=config.estimator,
            trajectory_advantage=float(credit.trajectory_advantage[number]),
            weights=credit.weights_of(number),
            advantages=credit.advantages_of(number),
            lengths=[int(length) for length in inputs.lengths[number]],
            roles=list(call_graph.reported_roles()) if call_graph is not None else [None] * num_actions,
            fallback=bool((payload.get("annotation") or {}).get("fallback", False)),
            call_graph=call_graph,
        )
        if found.graphs is not None:
            stored = result_from_payload(payload, num_actions)
            if stored is None:
                not_recorded += 1
                line.notes.append("graph not drawn: the trainer annotated this session (the graph is not recorded)")
            else:
                line.graph = found.graphs[number]
                line.fallback = stored.fallback
        if trajectory is not None and trajectory.num_actions == num_actions:
            line.labels = action_labels(trajectory)
            line.kinds = action_kinds(trajectory)
        lines.append(line)
    notes = []
    if not_recorded:
        notes.append(f"{not_recorded} sessions had no recorded graph: their weights here use the uniform graph")
    if max_abs_diff == max_abs_diff and max_abs_diff > AGREEMENT:  # not nan
        notes.append(
            f"the rebuilt token advantages differ from the trainer's by up to {max_abs_diff:.3g} "
            "(graphs annotated in the trainer, or CALL-CREDIT replays, are not rebuilt)"
        )
    return RebuiltStep(lines, max_abs_diff, not_recorded, notes)


_STEP_FILE = re.compile(r"step_(\d+)\.pt")


def dumped_steps(folder: str | os.PathLike[str]) -> list[int]:
    """The steps dumped in ``folder`` (``step_<N>.pt``), ascending."""
    found = []
    for path in glob.glob(os.path.join(os.fspath(folder), DUMP_PATTERN)):
        match = _STEP_FILE.fullmatch(os.path.basename(path))
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def read_step_record(folder: str | os.PathLike[str], step: int | None = None) -> tuple[int, dict[str, Any]]:
    """``(step, record)`` of one dumped step (``None``: the last one).

    Raises:
        InputError: the folder has no dump, or not that step (lists the steps it has).
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise InputError(folder, None, "no such folder (a credit.debug.dump_dir of the credit trainer)")
    steps = dumped_steps(folder)
    if not steps:
        raise InputError(folder, None, f"no {DUMP_PATTERN} file: not a credit.debug.dump_dir")
    chosen = steps[-1] if step is None else int(step)
    if chosen not in steps:
        raise InputError(folder, None, f"no step {chosen} (dumped steps: {', '.join(map(str, steps))})")
    path = dump_path(folder, chosen)
    try:
        record = torch.load(path, weights_only=False)  # the trainer's own file: plain values and tensors
    except Exception as exc:  # a truncated or foreign file: name it
        raise InputError(path, None, f"cannot read the dump: {exc}") from None
    if not isinstance(record, dict):
        raise InputError(path, None, f"expected a dict record, got {type(record).__name__}")
    return chosen, record
