"""Offline check of a CPU training run: the advantages verl's actor received vs the credit core.

For every dumped step (``credit.debug.dump_dir``, :mod:`verl_credit.verl.credit_dump`) and every
training row, the expected advantages are rebuilt from the raw inputs the run recorded -- row keys,
rollout masks, token-level rewards, and each session's transcript, spans and graph from
``extra_fields["credit"]`` -- without the trainer's own batch code:

* ``grpo``: verl's ``core_algos.compute_grpo_outcome_advantage`` on each session's final row
  (verl's own GRPO), broadcast over the session's rows;
* ``iapo`` / ``call_credit``: ``batch_credit.credit_from_inputs`` on the sessions' rewards, group ids,
  per-action token counts (summed from the spans) and graphs, then ``A_tau * w_i`` written onto
  each span's tokens (the estimator's token hook applied per action:
  ``batch_credit.credit_with_token_hook``, e.g. call_credit's alpha fusion and RV reward), times the
  response mask;
* ``gigpo`` / ``turn_reward`` / ``info_gain``: the same, with the estimator's own per-action
  advantage (anchor states from the transcripts, the environment's turn rewards, the information
  gains the trainer measured with its masked forward passes and recorded in the payloads).

    python -m verl_credit.verl.cpu.check --run grpo=DIR --run iapo=DIR ... [--resumed DIR] [--json OUT]

prints one line per run and, last, the smoke line
``cpu training: grpo N steps, ..., resumed at step K, credit matches core: yes|no, max |adv - core| X``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_credit.anchor_states import anchor_states
from verl_credit.batch_credit import credit_from_inputs, credit_with_token_hook
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.estimators.needs import (
    INFORMATION_GAINS_KEY,
    TURN_REWARDS_KEY,
    check_information_gains,
    check_turn_rewards,
    gather_needs,
)
from verl_credit.estimators.registry import EstimatorInputs
from verl_credit.graph import validate_graph
from verl_credit.trajectory import Trajectory
from verl_credit.verl.credit_dump import read_step_dumps

__all__ = ["RunCheck", "StepCheck", "check_run", "check_step", "expected_advantages", "smoke_line"]

#: the agreement the smoke run requires (fp32 rows; the core computes in float64)
TOLERANCE = 1e-6


@dataclass
class StepCheck:
    step: int
    rows: int
    sessions: int
    max_abs_diff: float  # actor's advantages vs the rebuilt ones
    trainer_actor_diff: float  # what the trainer wrote vs what the actor read
    nonzero_tokens: int  # tokens with a non-zero advantage (a check on zeros alone proves little)
    problems: list[str] = field(default_factory=list)


@dataclass
class RunCheck:
    name: str
    folder: str
    estimator: str | None
    steps: list[StepCheck]

    @property
    def max_abs_diff(self) -> float:
        return max((s.max_abs_diff for s in self.steps), default=math.inf)

    @property
    def problems(self) -> list[str]:
        found = [f"step {s.step}: {p}" for s in self.steps for p in s.problems]
        return found if self.steps else ["no dumped training step"]

    def ok(self, tolerance: float = TOLERANCE) -> bool:
        return bool(self.steps) and not self.problems and self.max_abs_diff <= tolerance


def _session_of(key: str) -> tuple[str, int]:
    """``{uid}_{session}_{index}`` -> (``{uid}_{session}``, index)."""
    head, index = key.rsplit("_", 1)
    return head, int(index)


def expected_advantages(record: Mapping[str, Any]) -> tuple[torch.Tensor, int, list[str]]:
    """``(rows, R)`` float64 advantages rebuilt from one dump; also the session count and problems."""
    keys: Sequence[str] = record["keys"]
    tags: Sequence[Mapping[str, Any]] = record["tags"]
    rollout_mask = record["rollout_mask"].to(torch.bool)
    response_mask = record["response_mask"].to(torch.float64)
    rewards = record["token_level_rewards"].to(torch.float64)
    payloads: Sequence[Mapping[str, Any] | None] = record["payloads"]
    estimator = str(record["estimator"])
    problems: list[str] = []

    sessions: dict[str, list[tuple[int, int]]] = {}
    uid_of: dict[str, Any] = {}
    for row, (key, tag) in enumerate(zip(keys, tags, strict=True)):
        if tag.get("is_padding"):
            continue
        session, index = _session_of(key)
        sessions.setdefault(session, []).append((index, row))
        uid_of[session] = record["uids"][row]
    names = list(sessions)
    final_rows = [max(sessions[name])[1] for name in names]
    expected = torch.zeros_like(rewards)
    if not names:
        return expected, 0, problems

    if estimator == "grpo":
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        finals = torch.tensor(final_rows)
        advantage, _ = compute_grpo_outcome_advantage(
            token_level_rewards=rewards[finals].to(torch.float32),
            response_mask=torch.ones_like(rewards[finals], dtype=torch.float32),
            index=np.array([uid_of[name] for name in names], dtype=object),
            epsilon=float(record["epsilon"]),
            norm_adv_by_std_in_grpo=bool(record["norm_adv_by_std_in_grpo"]),
        )
        for number, name in enumerate(names):
            for _, row in sessions[name]:
                expected[row] = float(advantage[number, 0]) * response_mask[row]
        return expected, len(names), problems

    config = CreditConfig.from_mapping(record["credit_config"])
    session_payloads = [payloads[row] or {} for row in final_rows]
    lengths, spans_of, action_counts = [], [], []
    for number, name in enumerate(names):
        payload = session_payloads[number]
        spans = [
            (int(a), int(s), int(e), row)
            for _, row in sessions[name]
            for a, s, e in (payloads[row] or {}).get("spans", [])
        ]
        num_actions = int(payload.get("num_actions", 1 + max((a for a, *_ in spans), default=-1)))
        per_action = [0] * num_actions
        for action, start, end, row in spans:
            if not bool(rollout_mask[row, start:end].all()):
                problems.append(f"session {name}: span {action} [{start}, {end}) covers masked tokens")
            per_action[action] += end - start
        lengths.append(per_action)
        spans_of.append(spans)
        action_counts.append(num_actions)

    def information_gains() -> list[list[float | None] | None]:
        gains = []
        for name, payload, count in zip(names, session_payloads, action_counts, strict=True):
            gain = check_information_gains(payload.get(INFORMATION_GAINS_KEY), count, f"session {name}")
            if gain is None:
                problems.append(f"session {name}: no information_gains recorded")
            gains.append(gain)
        return gains

    sessions_of = list(zip(names, session_payloads, action_counts, strict=True))
    gathered = gather_needs(
        config.registered_estimator.needs,
        {
            "influence_graphs": lambda: [validate_graph(p.get("graph"), n)[0] for _, p, n in sessions_of],
            "call_graphs": lambda: [CallGraph.from_json(p["call_graph"]) for _, p, _ in sessions_of],
            "rv_statuses": lambda: [list(p.get("rv_status") or [None] * n) for _, p, n in sessions_of],
            "anchor_states": lambda: [
                anchor_states(Trajectory.from_messages(list(p["messages"])), config.gigpo.state)
                for _, p, _ in sessions_of
            ],
            "turn_rewards": lambda: [
                check_turn_rewards(p.get(TURN_REWARDS_KEY), n, f"session {name}") for name, p, n in sessions_of
            ],
            "information_gains": information_gains,
        },
        estimator=config.estimator,
        where="the offline check of a training run",
    )
    scores = torch.stack([rewards[row].sum() for row in final_rows]).to(torch.float32)
    inputs = EstimatorInputs(uids=[uid_of[name] for name in names], scores=scores, **gathered)
    # what every token of an action gets, the estimator's token hook (alpha fusion, RV reward) included
    credit, _ = credit_with_token_hook(credit_from_inputs(inputs, lengths, config), inputs, config)
    for number, spans in enumerate(spans_of):
        advantage = float(credit.trajectory_advantage[number])
        for action, start, end, row in spans:
            if credit.additive:  # gigpo, turn_reward, info_gain, a token hook: the per-action advantage
                expected[row, start:end] = float(credit.action_advantage[number, action])
            else:
                expected[row, start:end] = advantage * float(credit.weight[number, action])
    return expected * response_mask, len(names), problems


def check_step(step: int, record: Mapping[str, Any]) -> StepCheck:
    expected, sessions, problems = expected_advantages(record)
    actor = record.get("actor_advantages")
    if actor is None:
        return StepCheck(step, len(record["keys"]), sessions, math.inf, math.inf, 0, ["no actor advantages dumped"])
    actor = actor.to(torch.float64)
    trainer = record["trainer_advantages"].to(torch.float64)
    width = min(actor.shape[1], expected.shape[1])
    diff = float((actor[:, :width] - expected[:, :width]).abs().max()) if actor.numel() else 0.0
    written = float((actor[:, :width] - trainer[:, :width]).abs().max()) if actor.numel() else 0.0
    if not torch.isfinite(actor).all():
        problems.append("non-finite advantages")
    return StepCheck(step, len(record["keys"]), sessions, diff, written, int((actor != 0).sum()), problems)


def check_run(name: str, folder: str | Path) -> RunCheck:
    dumps = read_step_dumps(str(Path(folder) / "dumps"))
    estimator = str(dumps[0][1]["estimator"]) if dumps else None
    return RunCheck(name, str(folder), estimator, [check_step(step, record) for step, record in dumps])


def smoke_line(runs: Sequence[RunCheck], resumed: RunCheck | None = None, tolerance: float = TOLERANCE) -> str:
    """The smoke line; the resumed run's steps must match too but are not counted among the runs'."""
    checked = [*runs, *([resumed] if resumed is not None else [])]
    counts = ", ".join(f"{run.name} {len(run.steps)} steps" for run in runs)
    ok = all(run.ok(tolerance) for run in checked)
    worst = max((run.max_abs_diff for run in checked), default=math.inf)
    resumed_at = str(resumed.steps[0].step - 1) if resumed is not None and resumed.steps else "none"
    return (
        f"cpu training: {counts}, resumed at step {resumed_at}, credit matches core: {'yes' if ok else 'no'}, "
        f"max |adv - core| {worst:.3g}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], help="NAME=RUN_DIR (a train.sh RUN_DIR); repeatable")
    parser.add_argument("--resumed", default=None, help="RUN_DIR of the resumed run (its steps are checked too)")
    parser.add_argument("--json", default=None, help="write the per-step figures here")
    args = parser.parse_args(argv)
    runs = []
    for item in args.run:
        name, sep, folder = item.partition("=")
        if not sep:
            parser.error(f"--run expects NAME=RUN_DIR, got {item!r}")
        runs.append(check_run(name, folder))
    resumed = check_run("resumed", args.resumed) if args.resumed else None
    checked = [*runs, *([resumed] if resumed is not None else [])]
    for run in checked:
        print(
            f"{run.name}: {run.estimator} {len(run.steps)} steps, max |adv - core| {run.max_abs_diff:.3g}, "
            f"non-zero advantage tokens {[s.nonzero_tokens for s in run.steps]}"
            + (f", problems: {run.problems}" if run.problems else "")
        )
    if args.json:
        report = {
            run.name: {"folder": run.folder, "estimator": run.estimator, "steps": [vars(s) for s in run.steps]}
            for run in checked
        }
        Path(args.json).write_text(json.dumps(report, indent=2))
    line = smoke_line(runs, resumed)
    print(line)
    return 0 if "matches core: yes" in line else 1


if __name__ == "__main__":
    sys.exit(main())
