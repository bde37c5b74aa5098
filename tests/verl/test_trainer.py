"""``CreditTrainerSync._compute_advantage`` against a real local TransferQueue.

Rows are produced by ``credit_agent`` (tiny model, scripted env) and stored by verl's own
``AgentLoopWorkerTQ._agent_loop_postprocess``; padding rows by verl's own
``upsample_batch_to_divisible_size``; the reference is verl's own ``PPOTrainerSync``.

Groups stored once per module (3 sessions each, rewards 1.0 / 0.0 / 0.5, sessions with 4 / 3 / 2
actions):
    gM, gP   iapo, graphs annotated in the rollout (FixedGraphAnnotator), merged / per_request
    uM, uP   iapo, uniform graphs annotated in the rollout
    nM       iapo, no graph in the rollout (the trainer must annotate)
    cM, cP   call_credit, hand-built call graphs attached in the rollout
    tM       turn_reward, the environment's per-action rewards (TURN_REWARDS), merged
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
import torch
from verl_helpers import (
    DEFAULT_PLANS,
    FixedGraphAnnotator,
    SleepyAnnotator,
    TinyModelServer,
    batch_meta,
    compose_credit_config,
    put_session,
    run_session,
)

import verl_credit.verl.annotation as annotation_module
from verl_credit.annotate.base import ANNOTATORS, AnnotationResult, Annotator
from verl_credit.batch_credit import compute_batch_credit
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.metrics import DESIGN_METRICS
from verl_credit.trajectory import Trajectory
from verl_credit.verl.settings import load_settings

#: Ray + TransferQueue + a tiny model per module (about 1-2 min on 2 cores): deselect with -m "not slow"
pytestmark = pytest.mark.slow

REWARDS = [1.0, 0.0, 0.5]
USER_REPLIES = [["card", "yes please"], ["card"], []]  # -> 4, 3, 2 actions
GROUPS = {
    "gM": ("iapo", "merged", "in_rollout"),
    "gP": ("iapo", "per_request", "in_rollout"),
    "uM": ("iapo", "merged", "uniform"),
    "uP": ("iapo", "per_request", "uniform"),
    "nM": ("iapo", "merged", "none"),
    "cM": ("call_credit", "merged", "in_rollout"),
    "cP": ("call_credit", "per_request", "in_rollout"),
    "tM": ("turn_reward", "merged", "turn_rewards"),
}
#: per-action environment rewards of the tM sessions (4 / 3 / 2 actions)
TURN_REWARDS = [[0.0, 0.25, 0.0, 0.5], [0.5, 0.0, 0.0], [0.0, 0.0]]
BASE = [
    "actor_rollout_ref.rollout.prompt_length=512",
    "actor_rollout_ref.rollout.response_length=256",
    "actor_rollout_ref.rollout.n=3",
    "credit.env.name=test_orders",
]


class UniformAnnotator(Annotator):
    async def annotate_one(self, trajectory) -> AnnotationResult:
        return AnnotationResult(InfluenceGraph.uniform(trajectory.num_actions), GraphValidation(), "test_uniform")


def hand_call_graph(trajectory: Trajectory) -> tuple[CallGraph, list[str | None]]:
    """Tool-call actions are IG, text actions AE, the last action RV (its check "pass"); an
    IG -> first-AE edge. Returns the graph and the per-call RV outcomes."""
    n = trajectory.num_actions
    roles = ["IG" if a.tool_calls else "AE" for a in trajectory.actions]
    roles[-1] = "RV"
    edges = []
    if "AE" in roles[:-1]:
        edges.append(CallEdge(0, roles.index("AE"), "IG->AE", "order"))
    return CallGraph(tuple(roles), (False,) * n, tuple(edges)), [None] * (n - 1) + ["pass"]


def _rollout_config(prefix: str) -> Any:
    estimator, layout, annotation = GROUPS[prefix]
    overrides = [*BASE, f"algorithm.adv_estimator={estimator}", f"credit.layout={layout}"]
    if annotation == "none":
        overrides.append("credit.annotator.in_rollout=false")
    elif annotation == "turn_rewards":
        pass  # turn_reward needs no influence graph: the environment's rewards and the transcript
    else:
        name = "test_uniform" if annotation == "uniform" else "test_fixed"
        overrides.append(f"credit.annotator.name={name}")
    return compose_credit_config(overrides)


@pytest.fixture(scope="module")
def stored(ray_tq, chatml_tokenizer, tiny_model, orders_env_cls):
    """Roll out and store every group; returns ``{prefix: [outputs of session 0, 1, 2]}``."""
    outputs: dict[str, list[list[Any]]] = {}

    async def go():
        for prefix in GROUPS:
            config = _rollout_config(prefix)
            server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
            outputs[prefix] = []
            for sid, (reward, replies) in enumerate(zip(REWARDS, USER_REPLIES, strict=True)):
                task: dict[str, Any] = {"user_replies": replies, "reward": reward}
                if GROUPS[prefix][2] == "turn_rewards":
                    task["turn_rewards"] = TURN_REWARDS[sid]
                session, kwargs = await run_session(config, server, chatml_tokenizer, prefix, sid, task)
                await put_session(session, kwargs)
                outputs[prefix].append(session)

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ANNOTATORS, "test_fixed", FixedGraphAnnotator)
        patch.setitem(ANNOTATORS, "test_uniform", UniformAnnotator)
        patch.setattr(annotation_module, "build_call_graph", hand_call_graph)
        asyncio.run(go())
    return outputs


def _trainer(cls_name: str, *overrides: str):
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from verl_credit.verl.trainer import CreditTrainerSync

    config = compose_credit_config([*BASE, *overrides])
    cls = CreditTrainerSync if cls_name == "credit" else PPOTrainerSync
    return cls(config)


def _advantages(tq, meta) -> list[torch.Tensor]:
    return list(
        tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["advantages"])["advantages"].unbind()
    )


def _action_values(outputs_of_session: list[Any], advantages_by_row: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Per action: its token advantages (concatenated over the rows that hold it)."""
    values: dict[int, list[torch.Tensor]] = {}
    for output, adv in zip(outputs_of_session, advantages_by_row, strict=True):
        for action, start, end in output.extra_fields["credit"]["spans"]:
            values.setdefault(action, []).append(adv[start:end])
    return {a: torch.cat(v) for a, v in values.items()}


def _rows_of(meta, prefix: str, sid: int) -> list[int]:
    rows = [i for i, k in enumerate(meta.keys) if k.startswith(f"{prefix}_{sid}_")]
    return sorted(rows, key=lambda i: int(meta.keys[i].rsplit("_", 1)[1]))


@pytest.mark.timeout(180)
def test_trainer_keeps_sync_semantics(stored):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    trainer = _trainer("credit")
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.credit_settings.estimator == "iapo"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("estimator", ["iapo", "grpo"])
def test_uniform_graphs_reproduce_verl_grpo_exactly(stored, ray_tq, chatml_tokenizer, estimator):
    """Merged + per_request sessions + verl's padding rows: verl's PPOTrainerSync (grpo) and the
    credit trainer (iapo with uniform graphs / grpo) write identical tensors (torch.equal)."""
    meta = batch_meta(ray_tq, ["uM_", "uP_"], pad_to=16, eos_token_id=chatml_tokenizer.eos_token_id)
    padding = [i for i, tag in enumerate(meta.tags) if tag.get("is_padding")]
    assert padding, "the batch must contain verl padding rows"
    _trainer("verl", "algorithm.adv_estimator=grpo")._compute_advantage(meta, {})
    reference = _advantages(ray_tq, meta)
    metrics: dict[str, float] = {}
    _trainer("credit", f"algorithm.adv_estimator={estimator}")._compute_advantage(meta, metrics)
    ours = _advantages(ray_tq, meta)
    for key, expected, got in zip(meta.keys, reference, ours, strict=True):
        assert torch.equal(expected, got), key
    for row in padding:  # padding rows: a 1-token zero row, as verl writes it
        assert ours[row].tolist() == [0.0]
    assert metrics["credit/sessions"] == 6.0  # padding rows are not sessions
    # the group statistics are non-trivial: A = (R - 0.5) / (std + eps) with std = 0.5
    first = ours[_rows_of(meta, "uM", 0)[0]]
    assert torch.allclose(first[first != 0], torch.full_like(first[first != 0], 0.5 / (0.5 + 1e-6)))


@pytest.mark.timeout(180)
def test_kl_in_reward_matches_verl(stored, ray_tq, chatml_tokenizer):
    """use_kl_in_reward: verl's apply_kl_penalty runs unchanged before the credit step."""
    from tensordict import TensorDict

    meta = batch_meta(ray_tq, ["uM_"])
    log_probs = ray_tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["rollout_log_probs"])
    ref = TensorDict({"ref_log_prob": log_probs["rollout_log_probs"] - 0.25}, batch_size=len(meta.keys))
    ray_tq.kv_batch_put(keys=meta.keys, partition_id="train", fields=ref)
    kl = ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1"]
    _trainer("verl", "algorithm.adv_estimator=grpo", *kl)._compute_advantage(meta, {})
    reference = _advantages(ray_tq, meta)
    _trainer("credit", "algorithm.adv_estimator=grpo", *kl)._compute_advantage(meta, {})
    for expected, got in zip(reference, _advantages(ray_tq, meta), strict=True):
        assert torch.equal(expected, got)


@pytest.mark.timeout(180)
def test_multi_output_sessions_count_once(stored, ray_tq):
    """uP: sessions of 4 / 3 / 2 rows with rewards 1 / 0 / 0.5. verl's rule: one score per
    session. Session scores [1, 0, 0.5]: mean 0.5, std 0.5 -> A = [+1, -1, 0] / (1 + 2e-6).
    Counting rows instead ([1,1,1,1, 0,0,0, .5,.5]: mean 5/9) would give session 0 A = 0.889/0.441."""
    meta = batch_meta(ray_tq, ["uP_"])
    assert [len(_rows_of(meta, "uP", s)) for s in range(3)] == [4, 3, 2]
    metrics: dict[str, float] = {}
    _trainer("credit", "algorithm.adv_estimator=iapo")._compute_advantage(meta, metrics)
    advantages = _advantages(ray_tq, meta)
    expected = [0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0.0]
    for sid, value in enumerate(expected):
        for row in _rows_of(meta, "uP", sid):
            assert torch.allclose(advantages[row], torch.full_like(advantages[row], value), rtol=1e-6, atol=0.0)
    assert metrics["credit/sessions"] == 3.0 and metrics["credit/rows_per_session"] == 3.0


@pytest.mark.timeout(180)
def test_turn_reward_routes_the_environments_turn_rewards(stored, ray_tq):
    """tM: the agent loop records the environment's per-action rewards and the trainer's
    ``turn_reward`` advantages equal the credit core's on the same inputs (rebuilt here from the
    rollout outputs); the turn term is really there (not GRPO)."""
    from verl_credit.anchor_states import anchor_states

    meta = batch_meta(ray_tq, ["tM_"])
    metrics: dict[str, float] = {}
    trainer = _trainer("credit", "algorithm.adv_estimator=turn_reward", "credit.turn_reward.lambda_turn=0.5")
    trainer._compute_advantage(meta, metrics)
    advantages = _advantages(ray_tq, meta)
    settings = load_settings(trainer.config)
    assert settings.credit.estimator == "turn_reward" and settings.credit.turn_reward.lambda_turn == 0.5

    trajectories, recorded = [], []
    for sid, outputs in enumerate(stored["tM"]):
        credit = outputs[-1].extra_fields["credit"]
        trajectories.append(
            Trajectory.from_messages(
                credit["messages"],
                id=f"tM_{sid}",
                uid="tM",
                reward=REWARDS[sid],
                action_token_lengths=credit["action_lengths"],
            )
        )
        recorded.append(credit["turn_rewards"])
    assert recorded == TURN_REWARDS  # one environment reward per action, in order
    lengths = [t.action_lengths for t in trajectories]
    states = [anchor_states(t, settings.credit.gigpo.state) for t in trajectories]
    core = compute_batch_credit(
        torch.tensor(REWARDS), ["tM"] * 3, lengths, settings.credit, anchor_states=states, turn_rewards=recorded
    )
    grpo = compute_batch_credit(torch.tensor(REWARDS), ["tM"] * 3, lengths, replace(settings.credit, estimator="grpo"))
    assert not torch.allclose(core.action_advantage, grpo.action_advantage)  # the turn term changes the credit
    for sid, outputs in enumerate(stored["tM"]):
        rows = _rows_of(meta, "tM", sid)
        for action, tokens in _action_values(outputs, [advantages[r] for r in rows]).items():
            target = core.action_advantage[sid, action].to(tokens.dtype)
            assert torch.allclose(tokens, target.expand_as(tokens), rtol=1e-6, atol=1e-7), (sid, action)
    assert metrics["credit/turn_reward_sessions"] == 3.0


@pytest.mark.timeout(180)
def test_advantages_equal_credit_core_output(stored, ray_tq):
    """gM: every written token advantage equals batch_credit.compute_batch_credit's action advantage
    for the same trajectories (rebuilt here from the rollout outputs, not from TransferQueue)."""
    meta = batch_meta(ray_tq, ["gM_"])
    metrics: dict[str, float] = {}
    trainer = _trainer("credit", "algorithm.adv_estimator=iapo", "credit.iapo.beta_plus=0.3", "credit.iapo.clip_c=0.5")
    trainer._compute_advantage(meta, metrics)
    advantages = _advantages(ray_tq, meta)

    trajectories, graphs = [], []
    for sid, outputs in enumerate(stored["gM"]):
        credit = outputs[-1].extra_fields["credit"]
        trajectory = Trajectory.from_messages(
            credit["messages"],
            id=f"gM_{sid}",
            uid="gM",
            reward=REWARDS[sid],
            action_token_lengths=credit["action_lengths"],
        )
        trajectories.append(trajectory)
        graphs.append(asyncio.run(FixedGraphAnnotator().annotate_one(trajectory)).graph)
    settings = load_settings(trainer.config)
    assert settings.credit.iapo.beta_plus == 0.3 and settings.credit.iapo.clip_c == 0.5  # overrides reach the math
    core = compute_batch_credit(
        torch.tensor(REWARDS), ["gM"] * 3, [t.action_lengths for t in trajectories], settings.credit, graphs=graphs
    )
    assert [t.num_actions for t in trajectories] == [4, 3, 2]
    assert not torch.all(core.weight[0, :4] == 1.0)  # the graph really changes the weights
    for sid, outputs in enumerate(stored["gM"]):
        rows = _rows_of(meta, "gM", sid)
        values = _action_values(outputs, [advantages[r] for r in rows])
        for action, tokens in values.items():
            target = core.action_advantage[sid, action].to(tokens.dtype)
            assert torch.allclose(tokens, target.expand_as(tokens), rtol=1e-6, atol=1e-7), (sid, action)
        # observation tokens get exactly 0
        inside = sum(len(v) for v in values.values())
        assert int((advantages[rows[0]] != 0).sum()) <= inside
    # these sessions carry no call roles, so no reward-hacking rate
    for name in (m for m in DESIGN_METRICS if m != "credit/reward_hacking_rate"):
        assert name in metrics, name
    # 3 edges (one per session) over 9 actions; 3 error marks over 9 actions
    assert metrics["credit/edges_per_action"] == pytest.approx(3 / 9)
    assert metrics["credit/error_rate"] == pytest.approx(3 / 9)
    assert metrics["credit/annotated_in_trainer"] == 0.0 and metrics["credit/fallback_rate"] == 0.0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pair", [("gM", "gP"), ("cM", "cP")])
def test_per_request_and_merged_layouts_give_identical_action_advantages(stored, ray_tq, pair):
    """The same episodes stored merged (one row per session) and per_request (one row per model
    request) under two group ids with identical rewards: every action's token advantages are
    identical (torch.equal) -- a weight never depends on how calls are packed into rows."""
    merged, per_request = pair
    estimator = GROUPS[merged][0]
    overrides = ["credit.call_credit.alpha=0.25"] if estimator == "call_credit" else []
    meta = batch_meta(ray_tq, [f"{merged}_", f"{per_request}_"])
    _trainer("credit", f"algorithm.adv_estimator={estimator}", *overrides)._compute_advantage(meta, {})
    advantages = _advantages(ray_tq, meta)
    for sid in range(3):
        a = _action_values(stored[merged][sid], [advantages[r] for r in _rows_of(meta, merged, sid)])
        b = _action_values(stored[per_request][sid], [advantages[r] for r in _rows_of(meta, per_request, sid)])
        assert a.keys() == b.keys()
        for action in a:
            assert torch.equal(a[action], b[action]), (sid, action)
    assert len(meta.keys) == 3 + 9


@pytest.mark.timeout(180)
def test_call_credit_routes_hand_built_call_graphs_with_fusion(stored, ray_tq):
    """cM: call graphs from the rollout (hand-built roles); token advantage of call i =
    alpha * A + (1 - alpha) * A * w_i with alpha = 0.5 (docs/design.md section 4, eq. 13)."""
    meta = batch_meta(ray_tq, ["cM_"])
    metrics: dict[str, float] = {}
    trainer = _trainer("credit", "algorithm.adv_estimator=call_credit", "credit.call_credit.alpha=0.5")
    trainer._compute_advantage(meta, metrics)
    advantages = _advantages(ray_tq, meta)
    trajectories = []
    for sid, outputs in enumerate(stored["cM"]):
        credit = outputs[-1].extra_fields["credit"]
        assert CallGraph.from_json(credit["call_graph"]).roles[-1] == "RV" and credit["rv_status"][-1] == "pass"
        trajectories.append(
            Trajectory.from_messages(
                credit["messages"], reward=REWARDS[sid], action_token_lengths=credit["action_lengths"]
            )
        )
    settings = load_settings(trainer.config)
    core = compute_batch_credit(
        torch.tensor(REWARDS),
        ["cM"] * 3,
        [t.action_lengths for t in trajectories],
        settings.credit,
        call_graphs=[hand_call_graph(t)[0] for t in trajectories],
    )
    for sid, outputs in enumerate(stored["cM"]):
        values = _action_values(outputs, [advantages[r] for r in _rows_of(meta, "cM", sid)])
        a_tau = float(core.trajectory_advantage[sid])
        for action, tokens in values.items():
            fused = 0.5 * a_tau + 0.5 * a_tau * float(core.weight[sid, action])
            assert torch.allclose(tokens, torch.full_like(tokens, fused), rtol=1e-5, atol=1e-6), (sid, action)
    assert "credit/reward_hacking_rate" in metrics


@pytest.mark.timeout(180)
def test_attached_graphs_are_not_reannotated(stored, ray_tq, monkeypatch):
    """Annotation latency is off the critical path: with a 1 s annotator configured, a batch whose
    graphs arrived with the rollout takes far less than 1 s in _compute_advantage and annotates
    nothing; a batch without graphs is annotated synchronously (counted) and takes >= 1 s."""
    monkeypatch.setitem(ANNOTATORS, "test_sleepy", SleepyAnnotator)
    trainer = _trainer("credit", "algorithm.adv_estimator=iapo", "credit.annotator.name=test_sleepy")

    attached = batch_meta(ray_tq, ["gM_", "gP_"])
    metrics: dict[str, float] = {}
    started = time.perf_counter()
    trainer._compute_advantage(attached, metrics)
    fast = time.perf_counter() - started
    assert fast < 0.5, fast
    assert metrics["credit/annotated_in_trainer"] == 0.0

    missing = batch_meta(ray_tq, ["nM_"])
    metrics = {}
    started = time.perf_counter()
    trainer._compute_advantage(missing, metrics)
    slow = time.perf_counter() - started
    assert slow >= 1.0, slow  # SleepyAnnotator: 1 s per trajectory, 3 annotated concurrently
    assert metrics["credit/annotated_in_trainer"] == 3.0 and metrics["credit/fallback_rate"] == 0.0
    assert metrics["credit/annotate_seconds"] >= 3.0


@pytest.mark.timeout(180)
def test_one_policy_gradient_step_through_verls_loss(stored, ray_tq, tiny_model):
    """The routed advantages, read back from TransferQueue, drive one real update of the tiny model
    through verl's actor loss (``verl.workers.utils.losses.ppo_loss`` -> ``get_policy_loss_fn("vanilla")``).

    With old_log_probs = the current log-probs (ratio 1), the token-mean PPO loss is
    ``-sum(A * mask) / N`` and d loss / d log p_t = ``-A_t / N`` on action tokens, 0 elsewhere
    (prompt, user and tool tokens), so the logits of those positions get no gradient either."""
    import copy

    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    meta = batch_meta(ray_tq, ["gM_", "gP_"])
    trainer = _trainer(
        "credit", "algorithm.adv_estimator=iapo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"
    )
    trainer._compute_advantage(meta, {})
    stored_fields = ray_tq.kv_batch_get(
        keys=meta.keys,
        partition_id="train",
        select_fields=["prompts", "responses", "input_ids", "response_mask", "advantages"],
    )
    model = copy.deepcopy(tiny_model).train()
    logits_rows, flat = [], []
    for ids in stored_fields["input_ids"].unbind():
        logits = model(ids.unsqueeze(0)).logits[0]
        logits.retain_grad()
        logits_rows.append(logits)
        log_probs = torch.log_softmax(logits[:-1].float(), dim=-1).gather(-1, ids[1:, None])[:, 0]
        flat.append(torch.cat([log_probs, log_probs.new_zeros(1)]))  # verl's layout: value t = log p(token t+1)
    values = torch.cat(flat)
    values.retain_grad()

    prompt_lens = stored_fields["prompts"].offsets().diff().tolist()
    response_lens = stored_fields["responses"].offsets().diff().tolist()
    starts = torch.tensor([0, *torch.tensor(prompt_lens) + torch.tensor(response_lens)]).cumsum(0)[:-1].tolist()
    old = [
        values.detach()[s + p - 1 : s + p - 1 + r] for s, p, r in zip(starts, prompt_lens, response_lens, strict=True)
    ]
    masks = [m.to(torch.bool) for m in stored_fields["response_mask"].unbind()]
    num_tokens = int(sum(int(m.sum()) for m in masks))
    data = TensorDict(
        {
            "prompts": stored_fields["prompts"],
            "responses": stored_fields["responses"],
            "response_mask": stored_fields["response_mask"],
            "advantages": stored_fields["advantages"],
            "old_log_probs": torch.nested.as_nested_tensor(old, layout=torch.jagged),
        },
        batch_size=len(meta.keys),
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=num_tokens, global_batch_size=len(meta.keys))
    actor_config = omega_conf_to_dataclass(trainer.config.actor_rollout_ref.actor)
    assert actor_config.policy_loss.loss_mode == "vanilla" and actor_config.loss_agg_mode == "token-mean"

    loss, _ = ppo_loss(actor_config, {"log_probs": values}, data)
    advantages = [a for a in stored_fields["advantages"].unbind()]
    expected = -sum(float((a * m).sum()) for a, m in zip(advantages, masks, strict=True)) / num_tokens
    assert torch.isfinite(loss) and float(loss) == pytest.approx(expected, rel=1e-5)
    loss.backward()

    nonzero_actions = 0
    for s, p, r, adv, mask, logits in zip(
        starts, prompt_lens, response_lens, advantages, masks, logits_rows, strict=True
    ):
        grad = values.grad[s : s + p + r]
        response_grad = grad[p - 1 : p - 1 + r]
        assert torch.allclose(response_grad, -adv * mask / num_tokens, atol=1e-9)
        outside = torch.ones(p + r, dtype=torch.bool)
        outside[p - 1 : p - 1 + r] = mask  # positions that predict an action token
        assert torch.all(grad[~outside] == 0)  # prompt, observation and padding positions
        assert torch.all(logits.grad[~outside] == 0)
        nonzero_actions += int((response_grad != 0).sum())
    assert nonzero_actions > 0

    before = [p.detach().clone() for p in model.parameters()]
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    changed = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(), strict=True)]
    assert any(changed) and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.timeout(180)
def test_call_credit_rv_reward_is_added_to_rv_calls(stored, ray_tq):
    """rv_reward=literal, kappa=0.2: r = kappa * (1[pass] - 1[fail and fixed]) = +0.2 on the
    (passing) RV call of every session, on top of A * w_i; other calls unchanged."""
    meta = batch_meta(ray_tq, ["cM_"])
    off: dict[str, float] = {}
    _trainer("credit", "algorithm.adv_estimator=call_credit")._compute_advantage(meta, off)
    without = _advantages(ray_tq, meta)
    metrics: dict[str, float] = {}
    trainer = _trainer(
        "credit",
        "algorithm.adv_estimator=call_credit",
        "credit.call_credit.rv_reward=literal",
        "credit.call_credit.kappa=0.2",
    )
    trainer._compute_advantage(meta, metrics)
    with_reward = _advantages(ray_tq, meta)
    for sid, outputs in enumerate(stored["cM"]):
        rows = _rows_of(meta, "cM", sid)
        before = _action_values(outputs, [without[r] for r in rows])
        after = _action_values(outputs, [with_reward[r] for r in rows])
        last = max(before)
        for action in before:
            bonus = 0.2 if action == last else 0.0
            assert torch.allclose(after[action], before[action] + bonus, atol=1e-6), (sid, action)
    assert metrics["credit/rv_reward_per_session"] == pytest.approx(0.2)
    assert "credit/rv_reward_per_session" not in off


def _plain_rows(rewards: list[float], uids: list[str], actions: int = 2, width: int = 3, gap: int = 1):
    """One merged row per session (no rollout needed): ``actions`` text actions of ``width`` tokens,
    the reward on the last action's last token."""
    keys, tags, extras, masks, token_rewards = [], [], [], [], []
    length = actions * (width + gap)
    for sid, (uid, reward) in enumerate(zip(uids, rewards, strict=True)):
        mask = torch.zeros(length, dtype=torch.int64)
        spans = []
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        for action in range(actions):
            start = action * (width + gap) + gap
            mask[start : start + width] = 1
            spans.append([action, start, start + width])
            messages.append({"role": "assistant", "content": f"answer {action}"})
            if action + 1 < actions:
                messages.append({"role": "user", "content": "more"})
        row_reward = torch.zeros(length)
        row_reward[spans[-1][2] - 1] = reward
        keys.append(f"{uid}_{sid}_0")
        tags.append({})
        call_graph = CallGraph(("AE",) * actions, (False,) * actions).to_json()
        extras.append(
            {"credit": {"spans": spans, "messages": messages, "num_actions": actions, "call_graph": call_graph}}
        )
        masks.append(mask)
        token_rewards.append(row_reward)
    return keys, tags, list(uids), extras, torch.stack(masks), torch.stack(token_rewards)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_reward_is_counted_and_neutralized(bad: float) -> None:
    """A NaN/inf reward neither crashes the step nor spreads NaN: its group's advantages are 0,
    other groups are untouched, and ``credit/nonfinite_rewards`` counts it."""
    from verl_credit.verl.credit_step import compute_credit_advantages

    settings = load_settings(compose_credit_config(["algorithm.adv_estimator=call_credit"]))
    clean = _plain_rows([1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"])
    poisoned = _plain_rows([1.0, bad, 1.0, 0.0], ["a", "a", "b", "b"])
    reference = compute_credit_advantages(*clean[:4], clean[4], clean[4], clean[5], settings)
    step = compute_credit_advantages(*poisoned[:4], poisoned[4], poisoned[4], poisoned[5], settings)
    assert torch.isfinite(step.advantages).all()
    assert torch.equal(step.advantages[:2], torch.zeros_like(step.advantages[:2]))  # group a: no baseline
    assert torch.equal(step.advantages[2:], reference.advantages[2:])  # group b unchanged
    assert step.advantages[2:].abs().sum() > 0
    assert step.metrics["credit/nonfinite_rewards"] == 1.0
    assert reference.metrics["credit/nonfinite_rewards"] == 0.0
    assert step.metrics["credit/nonfinite_advantages"] == 0.0


def test_overflowing_fp32_rewards_give_finite_trainer_advantages() -> None:
    """3.4e38 fits fp32 but its group sum does not: the group is normalized in float64."""
    from verl_credit.verl.credit_step import compute_credit_advantages

    settings = load_settings(compose_credit_config(["algorithm.adv_estimator=call_credit"]))
    rows = _plain_rows([3.4e38, 3.4e38, -3.4e38, 0.0], ["a"] * 4)
    step = compute_credit_advantages(*rows[:4], rows[4], rows[4], rows[5], settings)
    assert torch.isfinite(step.advantages).all() and step.advantages.abs().sum() > 0
    assert step.metrics["credit/nonfinite_rewards"] == 0.0
