"""The ``credit/*`` metrics of docs/design.md section 6, from one batch's credit and annotation stats.

Used by the trainer (logged through verl's tracker every step), the CLI summaries and the demo.
Definitions:

* ``w_pos_*``: the routed weights of actions (with tokens) of trajectories on the positive branch
  (``A > 0``); ``w_pos_frac_dev10`` / ``w_neg_frac_dev10``: share of those (resp. ``A < 0``)
  actions with ``|w - 1| > 0.1``.
* ``edges_per_action``: influence-graph edges per action; ``error_rate``: share of actions with
  ``e_i = 1``.
* ``reward_hacking_rate``: see ``credit.call_credit.compute_reward_hacking_rate`` (needs call
  roles: the call_credit estimator has them; for iapo pass ``call_graphs`` to get it).
* ``tool_call_redundancy``: mean, over trajectories, of tool calls that repeat an earlier call of
  the same trajectory with identical name and arguments.
* ``zero_adv_groups``: share of GRPO groups (sessions sharing a ``uid``) of at least two sessions
  whose scores are all equal, so every advantage of the group is 0 and it gives no gradient
  (a group of one has ``A = R``, verl's rule). Early in training, and on tasks the policy always
  or never solves, this is high; ``algorithm.filter_groups`` (DAPO) drops such groups.

Counters the trainer adds (``verl_credit.verl.credit_step.compute_credit_advantages``):
``nonfinite_rewards`` (sessions whose reward was NaN/inf: treated as 0 and their whole group's
advantages set to 0, so the step neither crashes nor trains on NaN), ``nonfinite_advantages``
(token advantages still non-finite after routing, set to 0; expected 0) and ``reward_failures``
(sessions whose environment reward raised, scored 0 by the agent loop, plus environments whose
``close()`` raised; expected 0 -- a policy that keeps it above 0 is breaking its grader).

:data:`METRIC_DOCS` documents every metric name the project logs (those computed here and those the
trainer adds in ``verl_credit.verl``), grouped in :data:`METRIC_GROUPS`; ``docs/metrics.md`` is
generated from it (``python scripts/docs_metrics.py``) and a test keeps both in step with the code.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from verl_credit.annotate.base import AnnotationStats
from verl_credit.batch_credit import BatchCredit, pad_call_graphs
from verl_credit.call_graph import CallGraph
from verl_credit.credit_math.call_credit import compute_reward_hacking_rate
from verl_credit.graph import InfluenceGraph
from verl_credit.trajectory import Trajectory

__all__ = [
    "DESIGN_METRICS",
    "INFLUENCE_GRAPH_METRICS",
    "METRIC_DOCS",
    "METRIC_GROUPS",
    "NONFINITE_METRICS",
    "VERL_METRIC_DOCS",
    "MetricDoc",
    "MetricGroup",
    "compute_credit_metrics",
    "count_redundant_tool_calls",
    "weight_spread",
    "zero_variance_group_share",
]

#: counters of non-finite input that the trainer neutralized (see the module doc)
NONFINITE_METRICS: tuple[str, ...] = ("credit/nonfinite_rewards", "credit/nonfinite_advantages")

#: the metrics the trainer logs every step: docs/design.md section 6, plus ``credit/zero_adv_groups``
#: (the share of GRPO groups whose advantages are all 0; not in docs/design.md section 6)
DESIGN_METRICS: tuple[str, ...] = (
    "credit/fallback_rate",
    "credit/repaired_edges",
    "credit/annotate_seconds",
    "credit/cache_hit_rate",
    "credit/w_pos_std",
    "credit/w_pos_min",
    "credit/w_pos_max",
    "credit/w_pos_frac_dev10",
    "credit/w_neg_frac_dev10",
    "credit/edges_per_action",
    "credit/error_rate",
    "credit/reward_hacking_rate",
    "credit/tool_call_redundancy",
    "credit/zero_adv_groups",
)
#: the ones defined on influence graphs (logged by estimators that route with them: iapo)
INFLUENCE_GRAPH_METRICS: tuple[str, ...] = ("credit/edges_per_action", "credit/error_rate")


def weight_spread(weight: torch.Tensor, selected: torch.Tensor) -> dict[str, float]:
    """std/min/max and share with ``|w - 1| > 0.1`` of ``weight[selected]`` (empty -> zeros)."""
    values = weight[selected]
    if values.numel() == 0:
        return {"std": 0.0, "min": 0.0, "max": 0.0, "frac_dev10": 0.0, "count": 0.0}
    return {
        "std": float(values.std(unbiased=False)),
        "min": float(values.min()),
        "max": float(values.max()),
        "frac_dev10": float(((values - 1.0).abs() > 0.1).double().mean()),
        "count": float(values.numel()),
    }


def zero_variance_group_share(rewards: torch.Tensor | Sequence[float], groups: Sequence[Hashable]) -> float:
    """Share of groups (``groups[i]``: group of trajectory ``i``) of two or more trajectories whose
    rewards are all equal; 0.0 for no groups."""
    values = [float(r) for r in (rewards.tolist() if isinstance(rewards, torch.Tensor) else rewards)]
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} rewards for {len(groups)} group ids")
    members: dict[Hashable, list[float]] = {}
    for group, value in zip(groups, values, strict=True):
        members.setdefault(group, []).append(value)
    if not members:
        return 0.0
    flat = sum(1 for scores in members.values() if len(scores) > 1 and min(scores) == max(scores))
    return flat / len(members)


def count_redundant_tool_calls(trajectory: Trajectory) -> int:
    """Tool calls repeating an earlier call of the trajectory (same name, same canonical arguments)."""
    seen: set[tuple[str, str]] = set()
    repeats = 0
    for action in trajectory.actions:
        for call in action.tool_calls:
            key = (
                call.name,
                json.dumps(call.arguments, sort_keys=True) if call.arguments_valid else call.raw_arguments,
            )
            repeats += key in seen
            seen.add(key)
    return repeats


def compute_credit_metrics(
    credit: BatchCredit,
    stats: AnnotationStats | None = None,
    trajectories: Sequence[Trajectory] | None = None,
    graphs: Sequence[InfluenceGraph] | None = None,
    call_graphs: Sequence[CallGraph] | None = None,
    rewards: torch.Tensor | None = None,
    groups: Sequence[Hashable] | None = None,
) -> dict[str, float]:
    """docs/design.md section 6 metrics for one batch (keys prefixed ``credit_math/``); ``zero_adv_groups``
    needs ``rewards`` and ``groups`` (the GRPO group id of each trajectory)."""
    metrics: dict[str, float] = {}
    if stats is not None:
        metrics["credit/fallback_rate"] = stats.fallback_rate
        metrics["credit/repaired_edges"] = float(stats.repaired_edges)
        metrics["credit/annotate_seconds"] = stats.seconds
        metrics["credit/cache_hit_rate"] = stats.cache_hit_rate
        metrics["credit/truncated_prompts"] = float(stats.truncated_prompts)

    has_tokens = credit.lengths > 0
    advantage = credit.trajectory_advantage.unsqueeze(-1)
    positive = weight_spread(credit.weight, has_tokens & (advantage > 0))
    negative = weight_spread(credit.weight, has_tokens & (advantage < 0))
    metrics["credit/w_pos_std"] = positive["std"]
    metrics["credit/w_pos_min"] = positive["min"]
    metrics["credit/w_pos_max"] = positive["max"]
    metrics["credit/w_pos_frac_dev10"] = positive["frac_dev10"]
    metrics["credit/w_neg_frac_dev10"] = negative["frac_dev10"]

    total_actions = int(credit.num_actions.sum())
    if graphs is not None and total_actions:
        metrics["credit/edges_per_action"] = sum(len(g.edges) for g in graphs) / total_actions
        metrics["credit/error_rate"] = sum(len(g.errors) for g in graphs) / total_actions

    roles = None
    if all(role in credit.extras for role in ("IG", "AE")):
        roles = credit.extras["IG"], credit.extras["AE"]
    elif call_graphs is not None:
        padded = pad_call_graphs(call_graphs, credit.weight.shape[1], {"IG": 1.0, "AE": 1.0, "RV": 1.0})
        roles = padded["IG"], padded["AE"]
    if roles is not None and rewards is not None:
        rate, _ = compute_reward_hacking_rate(
            rewards.to(torch.float64), credit.action_advantage.to(torch.float64), credit.lengths, roles[0], roles[1]
        )
        metrics["credit/reward_hacking_rate"] = rate

    if rewards is not None and groups is not None:
        metrics["credit/zero_adv_groups"] = zero_variance_group_share(rewards, groups)

    if "anchor_matched" in credit.extras and total_actions:  # gigpo: share of actions in an anchor group of 2+
        metrics["credit/anchor_match_rate"] = float(credit.extras["anchor_matched"].sum()) / total_actions

    if trajectories:
        metrics["credit/tool_call_redundancy"] = sum(count_redundant_tool_calls(t) for t in trajectories) / len(
            trajectories
        )
    return metrics


# -- the registry of logged metrics (docs/metrics.md is generated from it) -----------------------


@dataclass(frozen=True)
class MetricDoc:
    """One logged metric: ``name`` (a ``{...}`` part is a pattern whose values ``meaning`` lists),
    what it measures, and ``healthy``: its healthy range, or what a bad value means."""

    name: str
    meaning: str
    healthy: str


@dataclass(frozen=True)
class MetricGroup:
    """A table of ``docs/metrics.md``: a title, one sentence on when these are logged, the metrics."""

    title: str
    summary: str
    metrics: tuple[MetricDoc, ...]


_ANNOTATION = MetricGroup(
    "Annotation",
    "Where the step's influence graphs came from; logged every step (the graph counts are 0 for "
    "estimators that use no influence graph). `credit/fallback_rate`, `credit/repaired_edges`, "
    "`credit/annotate_seconds` and `credit/cache_hit_rate` are in docs/design.md section 6.",
    (
        MetricDoc(
            "credit/fallback_rate",
            "Share of the step's sessions whose graph is a fallback (the annotator failed or passed its "
            "deadline, or the session has no transcript): they get `credit.annotator.fallback` credit "
            "(rule or uniform graph) instead of the configured annotator's.",
            "near 0 with `llm`; a lasting rise means the annotator endpoint is down or too slow",
        ),
        MetricDoc(
            "credit/fallback_rate_window",
            "Fallback sessions over all sessions of the last `credit.annotator.fallback_window` steps "
            "(default 5); the run guard reads it.",
            "at most `credit.annotator.max_fallback_rate` (0.2); above it the trainer warns every step",
        ),
        MetricDoc(
            "credit/fallback_limit_exceeded",
            "1 when `credit/fallback_rate_window` is above `credit.annotator.max_fallback_rate`, else 0; "
            "with `credit.annotator.stop_on_fallback` the run stops once the window is full.",
            "0; 1 means the run is training on fallback graphs, not the annotator's",
        ),
        MetricDoc(
            "credit/repaired_edges",
            "Graph entries that validation dropped or fixed (edges out of range, backward, of an unknown "
            "type or duplicated; bad error marks; indices given as strings), summed over the step's graphs.",
            "0 with `rules`; a rising count with `llm` means its output is degrading",
        ),
        MetricDoc(
            "credit/annotate_seconds",
            "Annotator wall time summed over the step's sessions (in-rollout annotation overlaps the "
            "rollouts, so this is not added to the step time).",
            "informational; growth at a constant session count points at a slow annotator endpoint",
        ),
        MetricDoc(
            "credit/cache_hit_rate",
            "Share of the step's sessions whose graph came from the annotation cache.",
            "about 0 on fresh rollouts; near 1 only when the same transcripts come back",
        ),
        MetricDoc(
            "credit/truncated_prompts",
            "Sessions whose LLM-annotator prompt was shortened to fit the server's context.",
            "0; above 0: raise the annotator's context or expect coarser graphs for long sessions",
        ),
        MetricDoc(
            "credit/annotation_timeouts",
            "Sessions whose in-rollout annotation passed `credit.annotator.deadline`; they get "
            "`credit.annotator.fallback` and count in `credit/fallback_rate`.",
            "0; above 0: the annotator endpoint is slow or down",
        ),
        MetricDoc(
            "credit/annotated_in_trainer",
            "Sessions that reached the trainer without a graph (or call graph) and were annotated there, "
            "synchronously.",
            "0 when the agent loop annotates in rollout; above 0 adds annotation time to the step",
        ),
        MetricDoc(
            "credit/trainer_annotation_timeouts",
            "Of `credit/annotated_in_trainer`, the sessions whose annotation in the trainer passed "
            "`credit.annotator.deadline` (they get a fallback graph).",
            "0; above 0: the annotator cannot keep up with the trainer",
        ),
        MetricDoc(
            "credit/missing_transcript",
            "Sessions without a transcript in `extra_fields`: a uniform graph (iapo) or anchor states of "
            "their own (gigpo, step advantage 0).",
            "0; above 0: the agent loop is not `credit_agent`",
        ),
    ),
)

_CREDIT_MAP = MetricGroup(
    "Credit map",
    "What the routed weights `w` did (docs/design.md section 6, plus `credit/zero_adv_groups`). A "
    "weight is an action's share of its trajectory's advantage `A`; `w = 1` everywhere is GRPO.",
    (
        MetricDoc(
            "credit/w_pos_std",
            "Standard deviation of `w` over the step's actions with tokens on the positive branch "
            "(trajectories with `A > 0`); 0 when there are none.",
            "above 0 with a real graph; 0 means uniform credit (empty or fallback graphs)",
        ),
        MetricDoc(
            "credit/w_pos_min",
            "Smallest `w` on the positive branch (0 when the step has no `A > 0` action).",
            "positive, a little below 1; equal to `credit/w_pos_max` (1) means uniform credit",
        ),
        MetricDoc(
            "credit/w_pos_max",
            "Largest `w` on the positive branch (0 when the step has no `A > 0` action).",
            "a little above 1 (kept near 1 by `credit.iapo.clip_c`); 1 means uniform credit",
        ),
        MetricDoc(
            "credit/w_pos_frac_dev10",
            "Share of positive-branch actions whose weight moved more than 10% (`|w - 1| > 0.1`).",
            "IAPO paper: 86.5%; 0 means routing changes nothing",
        ),
        MetricDoc(
            "credit/w_neg_frac_dev10",
            "Share of negative-branch actions (`A < 0`) with `|w - 1| > 0.1`.",
            "IAPO paper: 27.1%; 0 when no action is marked as an error (uniform negative branch)",
        ),
        MetricDoc(
            "credit/edges_per_action",
            "Influence-graph edges per action of the step (estimators that route with influence graphs: iapo).",
            "above 0; 0 means empty graphs, so uniform credit",
        ),
        MetricDoc(
            "credit/error_rate",
            "Share of actions marked as an error (`e_i = 1`) in the influence graphs (iapo).",
            "follows the tool-error rate; it should fall as the policy learns",
        ),
        MetricDoc(
            "credit/reward_hacking_rate",
            "Among successful trajectories (`R > 0`) with both IG and AE calls, the share whose mean "
            "per-token advantage on IG calls exceeds the one on AE calls by more than 10%. Needs call "
            "roles: call_credit has them; iapo and grpo when the agent loop recorded them.",
            "0 for flat GRPO by construction; high means the credit rewards looking over doing",
        ),
        MetricDoc(
            "credit/tool_call_redundancy",
            "Tool calls per trajectory that repeat an earlier call of the same trajectory (same name, same arguments).",
            "should fall during training (IAPO paper at 4B: GRPO 46.00, IAPO 29.74)",
        ),
        MetricDoc(
            "credit/zero_adv_groups",
            "Share of GRPO groups (two or more sessions of one `uid`) whose scores are all equal, so "
            "every advantage of the group is 0 and it gives no gradient.",
            "high early and on tasks always or never solved; near 1: almost no signal "
            "(`algorithm.filter_groups` drops such groups)",
        ),
    ),
)

_ESTIMATORS = MetricGroup(
    "Estimator-specific",
    "Logged only by the estimator named in each meaning.",
    (
        MetricDoc(
            "credit/anchor_match_rate",
            "gigpo: share of actions whose anchor group (same `uid`, same state) has two or more actions; "
            "only those get a step advantage.",
            "above 0; near 0 on free-form dialogue past the first turn (step term inactive)",
        ),
        MetricDoc(
            "credit/turn_reward_sessions",
            "turn_reward: sessions with valid per-turn environment rewards.",
            "`credit/sessions` when the environment gives turn rewards; 0 means pure GRPO",
        ),
        MetricDoc(
            "credit/bad_turn_rewards",
            "turn_reward: sessions whose per-turn rewards were malformed and ignored (GRPO credit for them).",
            "0; above 0 is an environment bug",
        ),
        MetricDoc(
            "credit/info_gain_pairs",
            "info_gain: pairs of consecutive actions with feedback between them (tool result, user reply) "
            "found for the masked forward passes.",
            "informational: about the step's feedback turns",
        ),
        MetricDoc(
            "credit/info_gain_unmatched",
            "info_gain: pairs whose feedback tokens could not be located in the row; they get no gain.",
            "0; above 0: the chat template or row layout does not match the transcript",
        ),
        MetricDoc(
            "credit/info_gain_mean",
            "info_gain: mean information gain over the measured actions (per-token log-prob gain of the "
            "next action from seeing the feedback rather than a placeholder).",
            "above 0 on average; about 0 means the feedback does not change the next action",
        ),
        MetricDoc(
            "credit/info_gain_forward_rows",
            "info_gain: masked rows sent through the actor's extra forward pass.",
            "`credit/info_gain_pairs`; twice that with `rollout_correction.bypass_mode`",
        ),
        MetricDoc(
            "credit/info_gain_forward_tokens",
            "info_gain: tokens of those rows.",
            "informational: the cost of the extra passes",
        ),
        MetricDoc(
            "credit/info_gain_token_ratio",
            "info_gain: `credit/info_gain_forward_tokens` over the step's batch tokens, i.e. the extra "
            "passes' cost relative to the old-log-prob pass.",
            "about `T / 2` for sessions of `T` actions",
        ),
        MetricDoc(
            "credit/info_gain_seconds",
            "info_gain: wall time of the extra forward passes.",
            "a share of verl's `timing_s/step` close to `credit/info_gain_token_ratio`'s",
        ),
        MetricDoc(
            "credit/info_gain_actions",
            "info_gain: actions that got an information gain (not the last action, not one without feedback).",
            "informational: at most the step's actions minus one per session",
        ),
        MetricDoc(
            "credit/info_gain_gate_mean",
            "info_gain: mean over trajectories of the variance gate `sigmoid(-sigma_g / T_gate)` (`sigma_g` "
            "the std of the group's outcome rewards).",
            "between 0 and 0.5; near 0.5: outcomes rarely separate the rollouts, the gain drives learning",
        ),
        MetricDoc(
            "credit/info_gain_ratio",
            "info_gain: the magnitude ratio `rho` that scales the normalized gain to the outcome advantage's spread.",
            "in (0, 1]; small means the gain term is being shrunk",
        ),
        MetricDoc(
            "credit/info_gain_bonus_abs_mean",
            "info_gain: mean absolute bonus `beta * gate * rho * Ahat` per trainable token: what the gain "
            "adds to the token advantage.",
            "small beside `|A|` (`beta` = 0.1); 0 means no intrinsic signal",
        ),
    ),
)

_CALL_CREDIT = MetricGroup(
    "CALL-CREDIT optional parts",
    "Logged by the call_credit estimator when the part named in each meaning is switched on "
    "(`credit.call_credit.*`, docs/design.md section 4).",
    (
        MetricDoc(
            "credit/counterfactual_selected",
            "Calls selected for replay this step (the `counterfactual` and `ig_downweight` budgets of the "
            "largest `|A_i|`).",
            "at most the sum of both budgets",
        ),
        MetricDoc(
            "credit/counterfactual_failures",
            "Replays (or their proposals) that failed; counted, never raised.",
            "0; above 0: the environment's replay or the proposer is broken",
        ),
        MetricDoc(
            "credit/counterfactual_seconds",
            "Wall time of selecting and running the step's replays.",
            "informational; near `counterfactual.timeout`: replays are timing out",
        ),
        MetricDoc(
            "credit/counterfactual_calls",
            "counterfactual: AE calls with a replay result.",
            "`credit/counterfactual_selected` minus failures and IG calls",
        ),
        MetricDoc(
            "credit/counterfactual_delta_mean",
            "counterfactual: mean `Delta = R(tau) - R(tau')` of the replayed AE calls (logged when one replayed).",
            "above 0: the replayed edits mattered; about 0: removing them changes nothing",
        ),
        MetricDoc(
            "credit/ig_replays",
            "ig_downweight: IG calls with a replay result.",
            "informational: at most `ig_downweight.budget`",
        ),
        MetricDoc(
            "credit/ig_downweighted",
            "ig_downweight: replayed IG calls with `Delta < theta_ig` whose weight was multiplied by `factor`.",
            "below `credit/ig_replays`; all of them: the reads rarely matter to the reward",
        ),
        MetricDoc(
            "credit/ig_delta_mean",
            "ig_downweight: mean `Delta` of the replayed IG calls (logged when one replayed).",
            "above 0 means the reads the policy makes affect the reward",
        ),
        MetricDoc(
            "credit/omega_{role}",
            "adaptive_omega: the running role weight `omega` of each call role, `role` one of IG, AE, RV "
            "(used by the next step).",
            "inside `[omega_min, omega_max]` (0.1 to 2.0); pinned at a bound for long is suspect",
        ),
        MetricDoc(
            "credit/role_share_{role}",
            "adaptive_omega: EMA of the role's share of the mean `|A_i|`, `role` one of IG, AE, RV.",
            "about 1 together; AE well below IG means credit goes to looking, not doing",
        ),
        MetricDoc(
            "credit/role_delta_{role}",
            "adaptive_omega: EMA of the role's mean replay `Delta`, `role` one of IG, AE, RV (from the first "
            "step that replayed a call of the role).",
            "above 0 for the roles whose calls matter to the reward",
        ),
        MetricDoc(
            "credit/dpo_pairs",
            "dpo_export: DPO pairs (original vs counterfactual AE call) appended to `dpo_export.path` this step.",
            "at most `credit/counterfactual_calls`",
        ),
        MetricDoc(
            "credit/rv_reward_per_session",
            "rv_reward: the step's RV self-correction reward (`+kappa` per RV call whose failure was fixed "
            "and verified) per session.",
            "0 or more (the `literal` mode can go below 0); rising as the policy learns to fix failures",
        ),
    ),
)

_SESSIONS = MetricGroup(
    "Sessions and guards",
    "What the step trained on and the input it had to neutralize; logged every step.",
    (
        MetricDoc(
            "credit/sessions",
            "Sessions (trajectories) in the step's credit, after groups with a failed session were dropped.",
            "the prompts times `rollout.n`, less `credit/dropped_sessions`",
        ),
        MetricDoc(
            "credit/rows_per_session",
            "Mean training rows per session.",
            "1 with `credit.layout=merged`; above 1 with `per_request` or multi-output sessions",
        ),
        MetricDoc(
            "credit/failed_sessions",
            "Sessions that failed for a reason outside the policy (simulated user, environment, rollout "
            "server, session deadline).",
            "0; a share above `credit.session.max_failed_share` (0.25) stops the run",
        ),
        MetricDoc(
            "credit/failed_session_share",
            "`credit/failed_sessions` over all sessions of the step.",
            "0; above `credit.session.max_failed_share` (0.25) the run stops",
        ),
        MetricDoc(
            "credit/failed_sessions_{kind}",
            "Failed sessions by cause, `kind` one of user, environment, policy (the rollout server), "
            "deadline (`credit.session.deadline`).",
            "0; says which endpoint to check",
        ),
        MetricDoc(
            "credit/dropped_groups",
            "Groups left out of the step's credit (advantage 0) because one of their sessions failed.",
            "0",
        ),
        MetricDoc(
            "credit/dropped_sessions",
            "Sessions of those groups: the failed ones and their healthy siblings.",
            "0",
        ),
        MetricDoc(
            "credit/reward_failures",
            "Sessions whose environment reward raised (scored 0), plus environments whose `close()` raised.",
            "0; a policy that keeps it above 0 is breaking its grader",
        ),
        MetricDoc(
            "credit/nonfinite_rewards",
            "Sessions whose reward was NaN or inf: treated as 0 and their whole group's advantages set to 0.",
            "0; above 0 is a reward bug",
        ),
        MetricDoc(
            "credit/nonfinite_advantages",
            "Token advantages still non-finite after routing, set to 0.",
            "0 (anything else is a bug in the credit)",
        ),
        MetricDoc(
            "credit/dropped_tool_calls",
            "Tool calls past verl's `multi_turn.max_parallel_calls` in one turn: not executed, their "
            "tokens still trained.",
            "0; above 0: raise `max_parallel_calls` or expect unexecuted calls in the gradient",
        ),
        MetricDoc(
            "credit/malformed_tool_calls",
            "Tool calls verl's tool parser could not decode (dropped; the turn goes on as text).",
            "near 0; a rise means the policy is drifting (a learning rate too high, for one)",
        ),
    ),
)

_LAYOUT = MetricGroup(
    "Batch layout",
    "The actor update the step made; `credit/padding_rows` with `credit.layout=per_request` only.",
    (
        MetricDoc(
            "credit/padding_rows",
            "Rows added to the batch so that per_request mini-batches match the merged layout's number "
            "of optimizer updates.",
            "small beside the batch",
        ),
        MetricDoc(
            "credit/mini_batch_rows",
            "Actor mini-batch size in rows (planned for per_request; `ppo_mini_batch_size * rollout.n` for merged).",
            "informational",
        ),
        MetricDoc(
            "credit/optimizer_updates",
            "Actor optimizer updates this step: batch rows over `credit/mini_batch_rows`, times `ppo_epochs`.",
            "the same for both layouts at the same settings",
        ),
    ),
)

_VIZ = MetricGroup(
    "Live credit pictures",
    "`credit.viz` (every `credit.viz.every_n_steps` steps; off at 0). The `credit_viz/*` keys are "
    "media, not scalars: tensorboard tags, wandb / mlflow / swanlab keys (swanlab: the images only).",
    (
        MetricDoc(
            "credit/viz_errors",
            "Drawing or hand-off failures so far in the run (never fail the step).",
            "0",
        ),
        MetricDoc(
            "credit/viz_wait_seconds",
            "This step's time on the trainer's thread for the pictures (starting a drawing, handing "
            "finished ones to the trackers).",
            "well under a second; more means a tracker that needs its steps in order is waiting",
        ),
        MetricDoc(
            "credit/viz_render_seconds",
            "Time the worker thread took to draw the last drawn step (logged from the first drawn step on).",
            "informational; it does not hold up the step",
        ),
        MetricDoc(
            "credit_viz/rollout_{k}",
            "Image: per-action weights of pictured rollout `k`, `k` from 0 to `credit.viz.rollouts - 1` "
            "(a success and a failure of the same task where the step has one).",
            "a picture; uniform bars mean uniform credit",
        ),
        MetricDoc(
            "credit_viz/batch",
            "Image: `w+` / `w-` over the step's rollouts.",
            "a picture",
        ),
        MetricDoc(
            "credit_viz/actions",
            "Table of the pictured actions: rollout, action, role, weight, advantage, text (tensorboard: "
            "markdown text; mlflow: a table artifact).",
            "a table",
        ),
        MetricDoc(
            "credit_viz/w_plus",
            "Histogram of `w` on the positive branch (tensorboard, wandb).",
            "centred on 1; a spike at 1 alone means uniform credit",
        ),
        MetricDoc(
            "credit_viz/w_minus",
            "Histogram of `w` on the negative branch (tensorboard, wandb).",
            "centred on 1; a spike at 1 alone: no errors marked",
        ),
    ),
)

#: the tables of ``docs/metrics.md``, in order
METRIC_GROUPS: tuple[MetricGroup, ...] = (_ANNOTATION, _CREDIT_MAP, _ESTIMATORS, _CALL_CREDIT, _SESSIONS, _LAYOUT, _VIZ)
#: every metric name the project logs, one entry each
METRIC_DOCS: tuple[MetricDoc, ...] = tuple(doc for group in METRIC_GROUPS for doc in group.metrics)

#: verl's own metrics worth watching beside the ones above (not logged by this project)
VERL_METRIC_DOCS: tuple[MetricDoc, ...] = (
    MetricDoc(
        "actor/entropy",
        "Mean token entropy of the policy on the step's responses.",
        "a slow decline; a collapse toward 0 early means premature convergence",
    ),
    MetricDoc(
        "actor/grad_norm",
        "Norm of the actor's gradient (before clipping).",
        "steady; spikes mean an unstable update (learning rate, bad advantages)",
    ),
    MetricDoc(
        "critic/score/mean",
        "Mean sequence score (the reward) of the step's responses; with 0/1 rewards the success rate.",
        "rising; flat with `credit/zero_adv_groups` near 1: nothing to learn from",
    ),
    MetricDoc(
        "timing_s/step",
        "Wall time of the whole training step.",
        "steady; compare with `credit/annotate_seconds`, `credit/info_gain_seconds`, `credit/viz_wait_seconds`",
    ),
)
