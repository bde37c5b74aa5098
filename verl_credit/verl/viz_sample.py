"""A real step record without a cluster: the service world's scripted rollouts through the
trainer's own credit path (for ``scripts/bench_viz.py`` and the viz tests).

Each rollout becomes one merged training row as ``credit_agent`` stores it: its actions' tokens
(``action_token_lengths``) separated by ``gap`` observation tokens (response mask 0), the reward on
the last action's last token, and ``extra_fields["credit"]`` with the transcript, the spans and
the annotation the agent loop would attach (:func:`~verl_credit.verl.annotation.annotate_finished_trajectory`
with the rule annotator). The step's advantages are
:func:`~verl_credit.verl.credit_step.compute_credit_advantages`' and the record is
:func:`~verl_credit.verl.step_record.step_record`'s: the shape the trainer dumps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from verl_credit.envs.service.rollouts import sample_groups
from verl_credit.verl.annotation import annotate_finished_trajectory
from verl_credit.verl.batch import CREDIT_KEY
from verl_credit.verl.credit_step import compute_credit_advantages
from verl_credit.verl.settings import load_settings
from verl_credit.verl.step_record import step_record

__all__ = ["sample_step_record"]


def sample_step_record(
    groups: int = 4,
    group_size: int = 8,
    *,
    estimator: str = "iapo",
    seed: int = 0,
    variant: str = "mixed",
    gap: int = 2,
    credit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The step record of ``groups`` tasks x ``group_size`` scripted rollouts (``credit``: more of
    the ``credit`` node, e.g. ``{"iapo": {"clip_c": 0.5}}``)."""
    settings = load_settings({"estimator": estimator, **(credit or {})})
    rollouts = sample_groups(groups, group_size, seed=seed, variant=variant)

    async def annotate_all() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                *(annotate_finished_trajectory(r.trajectory, estimator, settings.annotator) for r in rollouts)
            )
        )

    annotations = asyncio.run(annotate_all())
    width = max(sum(gap + length for length in r.trajectory.action_lengths) for r in rollouts)
    keys, tags, uids, extras = [], [], [], []
    mask = torch.zeros((len(rollouts), width), dtype=torch.int64)
    rewards = torch.zeros((len(rollouts), width), dtype=torch.float32)
    sample_of: dict[str, int] = {}
    for row, (rollout, annotation) in enumerate(zip(rollouts, annotations, strict=True)):
        trajectory = rollout.trajectory
        spans, position = [], 0
        for action, length in enumerate(trajectory.action_lengths):
            position += gap
            if length > 0:
                spans.append([action, position, position + length])
                mask[row, position : position + length] = 1
            position += length
        if spans:
            rewards[row, spans[-1][2] - 1] = float(trajectory.reward)
        sample = sample_of[trajectory.uid] = sample_of.get(trajectory.uid, -1) + 1
        keys.append(f"{trajectory.uid}_{sample}_0")
        tags.append({"global_steps": 1})
        uids.append(trajectory.uid)
        payload = {
            "spans": spans,
            "row": 0,
            "rows": 1,
            "final": True,
            "messages": list(rollout.record["messages"]),
            "num_actions": trajectory.num_actions,
            "action_lengths": list(trajectory.action_lengths),
            "layout": "merged",
            "env": "service",
            **annotation,
        }
        extras.append({CREDIT_KEY: payload})
    step = compute_credit_advantages(keys, tags, uids, extras, mask, mask, rewards, settings)
    return step_record(
        keys=keys,
        tags=tags,
        uids=uids,
        extras=extras,
        rollout_mask=mask,
        response_mask=mask,
        token_level_rewards=rewards,
        estimator=settings.estimator,
        config=step.config or settings.credit,
        norm_adv_by_std_in_grpo=settings.credit.norm_adv_by_std_in_grpo,
        advantages=step.advantages,
    )
