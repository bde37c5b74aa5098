"""The optional CALL-CREDIT parts (docs/design.md section 4) in ``CreditTrainerSync._compute_advantage``,
against a real local TransferQueue (rows written by ``credit_agent`` and verl's own TQ writer).

Episodes (``xM`` merged, ``xP`` per_request; the same 3 sessions in each, rewards 1 / 0 / 0.5 ->
A = +1, -1, 0 (/ (1 + 2e-6))), 4 model calls each, roles from the tool names::

    0 IG  get_order      1 AE  refund_order (10)      2 AE  refund_order (5)      3 RV  text

call graph: IG0 -> AE1, AE2 -> RV3. CALL-CREDIT scores s = omega (deg + 1) gamma^(T - pos):
AE2 = 1.0 * 2 * 0.95 = 1.9 > AE1 = 1.0 * 1 * 0.95^2 = 0.9025, so |A_AE2| > |A_AE1| in every
session; sessions 0 and 1 tie exactly (|A| equal, same lengths), the earlier row wins.

The test environment ``test_replay`` replays with ``R(tau')`` from the task (``REPLAY``), so
``Delta = R(tau) - R(tau')`` per session and call is known here:

    session 0 (R = 1):  IG0 -> 0 (Delta 1)   AE1 -> 0.5 (Delta 0.5)   AE2 -> 0 (Delta 1)
    session 1 (R = 0):  IG0 -> 0 (Delta 0)   AE1 -> 0   (Delta 0)     AE2 -> 1 (Delta -1)
    session 2 (R = .5): A = 0: never selected
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest
import torch
from verl_helpers import TinyModelServer, batch_meta, compose_credit_config, put_session, run_session

import verl_credit.verl.annotation as annotation_module
import verl_credit.verl.credit_step as credit_step_module
from verl_credit.batch_credit import compute_batch_credit
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.envs.base import (
    ENVIRONMENTS,
    Environment,
    EpisodeStart,
    ToolResult,
    UserTurn,
    register_environment,
)
from verl_credit.trajectory import Trajectory
from verl_credit.verl.settings import load_settings

#: Ray + TransferQueue + a tiny model per module (about 1-2 min on 2 cores): deselect with -m "not slow"
pytestmark = pytest.mark.slow

REWARDS = [1.0, 0.0, 0.5]
REPLAY = [{"0": 0.0, "1": 0.5, "2": 0.0}, {"0": 0.0, "1": 0.0, "2": 1.0}, {"0": 0.5, "1": 0.5, "2": 0.5}]
READ = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W12"}}\n</tool_call>'
REFUND = '<tool_call>\n{"name": "refund_order", "arguments": {"order_id": "#W12", "amount": 10}}\n</tool_call>'
TOP_UP = '<tool_call>\n{"name": "refund_order", "arguments": {"order_id": "#W12", "amount": 5}}\n</tool_call>'
PLANS: list[str | None] = [READ, REFUND, TOP_UP, "Refund issued."]
ROLES_BY_TOOL = {"get_order": "IG", "refund_order": "AE"}
BASE = [
    "actor_rollout_ref.rollout.prompt_length=512",
    "actor_rollout_ref.rollout.response_length=512",
    "actor_rollout_ref.rollout.n=3",
    "credit.env.name=test_replay",
    "algorithm.adv_estimator=call_credit",
]
EPS = 1e-6


def _schema(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


class ReplayOrdersEnv(Environment):
    """Orders world with ``replay``: ``R(tau') = task["replay_reward"][call]``. Class-wide
    ``replays`` records every replay (R(tau), call, replacement, messages); ``fail`` names the
    (R(tau), call) replays that raise; ``delay_s`` sleeps in replay (a slow sandbox)."""

    replays: ClassVar[list[tuple[float, int, Any, int]]] = []
    fail: ClassVar[set[tuple[float, int]]] = set()
    delay_s: ClassVar[float] = 0.0

    def __init__(self) -> None:
        self.task: Mapping[str, Any] = {}
        self.closed = False

    async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
        self.task = task
        tools = [
            _schema("get_order", {"order_id": {"type": "string"}}),
            _schema("refund_order", {"order_id": {"type": "string"}, "amount": {"type": "integer"}}),
        ]
        return EpisodeStart("You are a support agent.", tools, "refund order #W12 please", {})

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult(json.dumps({"tool": name, "ok": True}))

    async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
        return UserTurn(None, done=True)

    async def reward(self) -> float:
        return float(self.task["reward"])

    def replay(
        self, trajectory_messages: Sequence[Mapping[str, Any]], call_index: int, replacement: Mapping[str, Any] | None
    ) -> float:
        reward = float(self.task["reward"])
        ReplayOrdersEnv.replays.append((reward, call_index, replacement, len(trajectory_messages)))
        if ReplayOrdersEnv.delay_s:
            time.sleep(ReplayOrdersEnv.delay_s)
        if (reward, call_index) in ReplayOrdersEnv.fail:
            raise RuntimeError("replay sandbox crashed")
        return float(self.task["replay_reward"][str(call_index)])


def role_call_graph(trajectory: Trajectory) -> tuple[CallGraph, list[str | None]]:
    """Roles from the tool names (text calls: RV); IG0 -> first AE, last AE -> final RV."""
    roles = [ROLES_BY_TOOL[a.tool_calls[0].name] if a.tool_calls else "RV" for a in trajectory.actions]
    ae = [i for i, role in enumerate(roles) if role == "AE"]
    edges = (CallEdge(0, ae[0], "IG->AE", "#W12"), CallEdge(ae[-1], len(roles) - 1, "AE->RV", "#W12"))
    return CallGraph(tuple(roles), (False,) * len(roles), edges), [None] * len(roles)


@pytest.fixture(scope="module")
def stored(ray_tq, chatml_tokenizer, tiny_model):
    """Roll out and store ``xM`` (merged) and ``xP`` (per_request); ``{prefix: [outputs per session]}``."""
    if "test_replay" not in ENVIRONMENTS:
        register_environment("test_replay")(ReplayOrdersEnv)
    outputs: dict[str, list[list[Any]]] = {}

    async def go():
        for prefix, layout in (("xM", "merged"), ("xP", "per_request")):
            config = compose_credit_config([*BASE, f"credit.layout={layout}"])
            server = TinyModelServer(tiny_model, chatml_tokenizer, PLANS)
            outputs[prefix] = []
            for sid, (reward, replay) in enumerate(zip(REWARDS, REPLAY, strict=True)):
                task = {"reward": reward, "replay_reward": replay}
                session, kwargs = await run_session(config, server, chatml_tokenizer, prefix, sid, task)
                await put_session(session, kwargs)
                outputs[prefix].append(session)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(annotation_module, "build_call_graph", role_call_graph)
        asyncio.run(go())
    for prefix in outputs:
        for session in outputs[prefix]:
            payload = session[-1].extra_fields["credit"]
            assert payload["env"] == "test_replay" and payload["num_actions"] == 4
            assert CallGraph.from_json(payload["call_graph"]).roles == ("IG", "AE", "AE", "RV")
    return outputs


@pytest.fixture(autouse=True)
def _clean_replay_env():
    ReplayOrdersEnv.replays.clear()
    ReplayOrdersEnv.fail = set()
    ReplayOrdersEnv.delay_s = 0.0
    yield
    ReplayOrdersEnv.replays.clear()


def _trainer(*overrides: str):
    from verl_credit.verl.trainer import CreditTrainerSync

    return CreditTrainerSync(compose_credit_config([*BASE, *overrides]))


def _advantages(tq, meta) -> list[torch.Tensor]:
    return list(
        tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["advantages"])["advantages"].unbind()
    )


def _rows_of(meta, prefix: str, sid: int) -> list[int]:
    rows = [i for i, k in enumerate(meta.keys) if k.startswith(f"{prefix}_{sid}_")]
    return sorted(rows, key=lambda i: int(meta.keys[i].rsplit("_", 1)[1]))


def _action_values(outputs_of_session: list[Any], advantages_by_row: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Per action: its token advantages (concatenated over the rows that hold it)."""
    values: dict[int, list[torch.Tensor]] = {}
    for output, adv in zip(outputs_of_session, advantages_by_row, strict=True):
        for action, start, end in output.extra_fields["credit"]["spans"]:
            values.setdefault(action, []).append(adv[start:end])
    return {a: torch.cat(v) for a, v in values.items()}


def _step(
    tq, meta, stored, *overrides: str, trainer=None
) -> tuple[dict[str, dict[int, dict[int, torch.Tensor]]], dict]:
    """One ``_compute_advantage``; returns ``{prefix: {session: {action: token advantages}}}`` and the metrics."""
    trainer = trainer or _trainer(*overrides)
    metrics: dict[str, float] = {}
    trainer._compute_advantage(meta, metrics)
    advantages = _advantages(tq, meta)
    prefixes = sorted({key.split("_", 1)[0] for key in meta.keys})
    values = {
        p: {s: _action_values(stored[p][s], [advantages[r] for r in _rows_of(meta, p, s)]) for s in range(3)}
        for p in prefixes
    }
    return values, metrics


def _expect_rescaled(before: dict[int, torch.Tensor], factors: dict[int, float]) -> dict[int, torch.Tensor]:
    """Eq. (15)/(17) on token values: action i gets before_i * f_i * c, with c restoring the
    session's total sum_tokens A_t (mass)."""
    total = sum(float(v.double().sum()) for v in before.values())
    scaled = sum(float(v.double().sum()) * factors.get(a, 1.0) for a, v in before.items())
    c = total / scaled
    return {a: (v.double() * factors.get(a, 1.0) * c).to(v.dtype) for a, v in before.items()}


def _assert_values(got: dict[int, torch.Tensor], expected: dict[int, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for action in got:
        assert torch.allclose(got[action], expected[action], rtol=1e-5, atol=1e-7), action


def _mass(values: dict[int, torch.Tensor]) -> float:
    return sum(float(v.double().sum()) for v in values.values())


# --------------------------------------------------------------------------- switches off


@pytest.mark.timeout(180)
def test_switches_off_leave_advantages_identical(stored, ray_tq, monkeypatch):
    """Off (the default) never enters the optional code path; switches off with other knobs
    changed, counterfactual on with budget 0, and adaptive omega on its first step (omega is
    still the configured one) all write the same tensors (torch.equal)."""
    meta = batch_meta(ray_tq, ["xM_", "xP_"])

    def must_not_run(*args, **kwargs):
        raise AssertionError("apply_call_adjustments ran with every switch off")

    with monkeypatch.context() as patch:
        patch.setattr(credit_step_module, "apply_call_adjustments", must_not_run)
        reference, metrics = _step(ray_tq, meta, stored)
        _step(
            ray_tq, meta, stored, "credit.call_credit.counterfactual.eta=3.0", "credit.call_credit.adaptive_omega.rho=1"
        )
    assert not any(k.startswith(("credit/counterfactual", "credit/omega", "credit/dpo")) for k in metrics)
    assert reference["xM"][0][2].abs().max() > 0  # non-trivial advantages
    variants = {
        "knobs changed, switches off": [
            "credit.call_credit.counterfactual.budget=1",
            "credit.call_credit.counterfactual.eta=2.0",
            "credit.call_credit.ig_downweight.theta_ig=5.0",
            "credit.call_credit.adaptive_omega.rho=1.0",
            "credit.call_credit.adaptive_omega.omega_max=0.5",
        ],
        "counterfactual with budget 0": [
            "credit.call_credit.counterfactual.enabled=true",
            "credit.call_credit.counterfactual.budget=0",
        ],
        "adaptive omega, first step": ["credit.call_credit.adaptive_omega.enabled=true"],
    }
    for name, overrides in variants.items():
        values, _ = _step(ray_tq, meta, stored, *overrides)
        for prefix in ("xM", "xP"):
            for sid in range(3):
                for action, tokens in reference[prefix][sid].items():
                    assert torch.equal(values[prefix][sid][action], tokens), (name, prefix, sid, action)
    assert ReplayOrdersEnv.replays == []


# --------------------------------------------------------------------------- counterfactual calibration


@pytest.mark.timeout(180)
def test_counterfactual_calibration_direction_mass_and_layouts(stored, ray_tq):
    """Budget 8 over xM + xP: the 8 AE calls with A != 0 are replayed with the ``remove`` proposer.
    Factors 1 + eta sign(A) Delta (eta = 0.5): session 0 AE1 1 + 0.5 * 0.5 = 1.25, AE2 1.5;
    session 1 AE1 1, AE2 1 + 0.5 * (-1) * (-1) = 1.5 (more blame for the edit that caused the
    failure). Each session's sum of token advantages is unchanged; merged and per_request rows
    still carry identical action advantages; session 2 (A = 0) is untouched."""
    meta = batch_meta(ray_tq, ["xM_", "xP_"])
    before, _ = _step(ray_tq, meta, stored)
    after, metrics = _step(
        ray_tq,
        meta,
        stored,
        "credit.call_credit.counterfactual.enabled=true",
        "credit.call_credit.counterfactual.budget=8",
    )
    factors = {0: {1: 1.25, 2: 1.5}, 1: {1: 1.0, 2: 1.5}}
    for prefix in ("xM", "xP"):
        for sid, session_factors in factors.items():
            _assert_values(after[prefix][sid], _expect_rescaled(before[prefix][sid], session_factors))
            assert math.isclose(_mass(after[prefix][sid]), _mass(before[prefix][sid]), rel_tol=1e-6)
            # the replayed edit with |Delta| = 1 gains weight in both the won and the lost session
            assert after[prefix][sid][2].abs().min() > before[prefix][sid][2].abs().max()
            assert after[prefix][sid][0].abs().max() < before[prefix][sid][0].abs().min()
        for action, tokens in before[prefix][2].items():
            assert torch.equal(after[prefix][2][action], tokens)
        for sid in range(3):  # layout invariance survives the calibration
            for action in after["xM"][sid]:
                assert torch.equal(after["xM"][sid][action], after["xP"][sid][action]), (sid, action)
    replayed = sorted((r, c, repl) for r, c, repl, _ in ReplayOrdersEnv.replays)
    assert replayed == sorted([(1.0, 1, None), (1.0, 2, None), (0.0, 1, None), (0.0, 2, None)] * 2)
    # Deltas: 0.5, 1, 0, -1 per layout -> mean 0.125
    assert metrics["credit/counterfactual_calls"] == 8.0 and metrics["credit/counterfactual_failures"] == 0.0
    assert metrics["credit/counterfactual_delta_mean"] == pytest.approx(0.125)
    assert metrics["credit/counterfactual_selected"] == 8.0


@pytest.mark.timeout(180)
def test_counterfactual_budget_picks_the_largest_abs_advantages(stored, ray_tq):
    """Budget 1 replays only session 0's AE2 (largest |A_i|, tied with session 1's AE2, earlier row
    first); budget 3 adds session 1's AE2 and session 0's AE1 -- the ranking of |A_i| read from the
    written advantages of the uncalibrated step."""
    meta = batch_meta(ray_tq, ["xM_"])
    before, _ = _step(ray_tq, meta, stored)
    ranking = sorted(
        ((sid, action) for sid in range(3) for action in (1, 2) if before["xM"][sid][action].abs().max() > 0),
        key=lambda key: (-float(before["xM"][key[0]][key[1]].abs().max()), key),
    )
    assert ranking == [(0, 2), (1, 2), (0, 1), (1, 1)]
    for budget in (1, 3):
        ReplayOrdersEnv.replays.clear()
        after, metrics = _step(
            ray_tq,
            meta,
            stored,
            "credit.call_credit.counterfactual.enabled=true",
            f"credit.call_credit.counterfactual.budget={budget}",
        )
        replayed = [(REWARDS.index(reward), call) for reward, call, _, _ in ReplayOrdersEnv.replays]
        assert sorted(replayed) == sorted(ranking[:budget]), budget
        assert metrics["credit/counterfactual_calls"] == float(budget)
    # budget 3: session 1's AE1 was not replayed -> only AE2's factor 1.5 applies there
    _assert_values(after["xM"][1], _expect_rescaled(before["xM"][1], {2: 1.5}))
    _assert_values(after["xM"][0], _expect_rescaled(before["xM"][0], {1: 1.25, 2: 1.5}))


@pytest.mark.timeout(180)
def test_failed_and_slow_replays_are_counted_and_training_continues(stored, ray_tq, monkeypatch):
    """Session 0's AE2 replay raises, session 1's AE2 replay never finishes on its own (timeout
    0.5 s): both are counted as failures, the step returns while the slow replay is still blocked
    (no wall-clock bound: the replay waits on an event set only after the step), and only the
    successful replays (session 0's AE1: factor 1.25) change weights. An environment without
    ``replay`` fails every replay, counted, with the advantages of the uncalibrated step."""
    meta = batch_meta(ray_tq, ["xM_"])
    before, _ = _step(ray_tq, meta, stored)
    ReplayOrdersEnv.fail = {(1.0, 2)}
    original_replay = ReplayOrdersEnv.replay
    release = threading.Event()
    slow_finished = threading.Event()

    def slow_for_session_1(self, messages, call_index, replacement):
        if float(self.task["reward"]) == 0.0 and call_index == 2:
            release.wait(60)  # abandoned after the timeout; touches no shared state when it wakes
            slow_finished.set()
            return 1.0
        return original_replay(self, messages, call_index, replacement)

    monkeypatch.setattr(ReplayOrdersEnv, "replay", slow_for_session_1)
    overrides = [
        "credit.call_credit.counterfactual.enabled=true",
        "credit.call_credit.counterfactual.budget=4",
        "credit.call_credit.counterfactual.timeout=0.5",
    ]
    after, metrics = _step(ray_tq, meta, stored, *overrides)
    assert not slow_finished.is_set()  # the step did not wait for the abandoned replay
    release.set()
    assert metrics["credit/counterfactual_failures"] == 2.0 and metrics["credit/counterfactual_calls"] == 2.0
    _assert_values(after["xM"][0], _expect_rescaled(before["xM"][0], {1: 1.25}))
    for action, tokens in before["xM"][1].items():  # session 1: AE1 has Delta 0, AE2 failed
        assert torch.equal(after["xM"][1][action], tokens)

    monkeypatch.setattr(ReplayOrdersEnv, "replay", None)  # an environment that cannot replay
    after, metrics = _step(ray_tq, meta, stored, *overrides)
    assert metrics["credit/counterfactual_failures"] == 4.0 and metrics["credit/counterfactual_calls"] == 0.0
    for sid in range(3):
        for action, tokens in before["xM"][sid].items():
            assert torch.equal(after["xM"][sid][action], tokens)


# --------------------------------------------------------------------------- IG down-weighting


@pytest.mark.timeout(180)
def test_ig_downweight_uses_the_replay_deltas(stored, ray_tq):
    """IG0 replays (budget 4; 2 IG calls with A != 0): session 0 Delta = 1 - 0 = 1 >= theta 0.5
    (the read mattered: kept); session 1 Delta = 0 - 0 = 0 < 0.5 -> w * 0.5, mass restored."""
    meta = batch_meta(ray_tq, ["xM_"])
    before, _ = _step(ray_tq, meta, stored)
    after, metrics = _step(ray_tq, meta, stored, "credit.call_credit.ig_downweight.enabled=true")
    for action, tokens in before["xM"][0].items():
        assert torch.equal(after["xM"][0][action], tokens)
    _assert_values(after["xM"][1], _expect_rescaled(before["xM"][1], {0: 0.5}))
    assert math.isclose(_mass(after["xM"][1]), _mass(before["xM"][1]), rel_tol=1e-6)
    assert sorted((r, c) for r, c, _, _ in ReplayOrdersEnv.replays) == [(0.0, 0), (1.0, 0)]
    assert metrics["credit/ig_replays"] == 2.0 and metrics["credit/ig_downweighted"] == 1.0
    assert metrics["credit/ig_delta_mean"] == pytest.approx(0.5)
    assert "credit/counterfactual_calls" not in metrics  # AE calibration stays off


# --------------------------------------------------------------------------- adaptive omega


def _role_means(values: dict[int, dict[int, torch.Tensor]]) -> dict[str, float]:
    """Mean |A_i| per role over the batch's calls (A = 0 sessions included)."""
    roles = {0: "IG", 1: "AE", 2: "AE", 3: "RV"}
    sums: dict[str, list[float]] = {"AE": [], "IG": [], "RV": []}
    for session in values.values():
        for action, tokens in session.items():
            sums[roles[action]].append(float(tokens.abs().max()))
    return {role: sum(v) / len(v) for role, v in sums.items()}


@pytest.mark.timeout(180)
def test_adaptive_omega_moves_toward_the_target_and_stays_in_bounds(stored, ray_tq, tmp_path, monkeypatch):
    """rho = 0.5, ema_beta = 1 (the EMA is this step's share): share_r = a_r / sum a (a_r: mean
    |A_i| of role r), target_r = sum(omega) share_r = 2.0 share_r, omega_r += 0.5 (target_r - omega_r).
    The next step routes with the new omega (checked against the credit core); the state survives a
    checkpoint round trip; with rho = 1 and bounds [0.5, 0.9] every omega is clip(target)."""
    meta = batch_meta(ray_tq, ["xM_"])
    overrides = [
        "credit.call_credit.adaptive_omega.enabled=true",
        "credit.call_credit.adaptive_omega.rho=0.5",
        "credit.call_credit.adaptive_omega.ema_beta=1.0",
        f"trainer.default_local_dir={tmp_path}",
    ]
    trainer = _trainer(*overrides)
    first, metrics = _step(ray_tq, meta, stored, trainer=trainer)
    a = _role_means(first["xM"])
    share = {r: a[r] / sum(a.values()) for r in a}
    omega0 = {"AE": 1.0, "IG": 0.6, "RV": 0.4}
    expected = {r: omega0[r] + 0.5 * (2.0 * share[r] - omega0[r]) for r in omega0}
    for role in omega0:
        assert metrics[f"credit/omega_{role}"] == pytest.approx(expected[role], rel=1e-5)
        assert metrics[f"credit/role_share_{role}"] == pytest.approx(share[role], rel=1e-5)
    # a role moves toward its share of |A|: IG's calls (out-degree 1) carry more than its omega share
    # 0.6 / 2.0 = 0.3 and move up, RV's (leaves, last) less than 0.2 and move down; sum(omega) stays 2
    assert share["IG"] > 0.3 and expected["IG"] > omega0["IG"]
    assert share["RV"] < 0.2 and expected["RV"] < omega0["RV"]
    assert sum(expected.values()) == pytest.approx(2.0)
    assert trainer.call_adjustments.adaptive.omega == pytest.approx(expected, rel=1e-5)

    # step 2 routes with the updated omega (and updates it again)
    settings = load_settings(trainer.config)
    config = trainer.call_adjustments.credit_config(settings.credit)
    second, _ = _step(ray_tq, meta, stored, trainer=trainer)
    trajectories = [
        Trajectory.from_messages(
            s[-1].extra_fields["credit"]["messages"],
            reward=REWARDS[sid],
            action_token_lengths=s[-1].extra_fields["credit"]["action_lengths"],
        )
        for sid, s in enumerate(stored["xM"])
    ]
    assert dict(config.call_credit.omega) == pytest.approx(expected, rel=1e-5)
    core = compute_batch_credit(
        torch.tensor(REWARDS),
        ["xM"] * 3,
        [t.action_lengths for t in trajectories],
        config,
        call_graphs=[role_call_graph(t)[0] for t in trajectories],
    )
    for sid in range(3):
        for action, tokens in second["xM"][sid].items():
            target = core.action_advantage[sid, action].to(tokens.dtype)
            assert torch.allclose(tokens, target.expand_as(tokens), rtol=1e-6, atol=1e-7), (sid, action)
    assert not torch.allclose(second["xM"][0][1], first["xM"][0][1])  # omega really changed the weights

    # checkpoint: verl's own save/load replaced by no-ops (they need workers)
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)
    trainer.global_steps = 2
    trainer._save_checkpoint()
    saved = json.loads((tmp_path / "global_step_2" / "credit_state.json").read_text())
    assert saved["adaptive_omega"]["omega"] == trainer.call_adjustments.adaptive.omega

    def resume(self):
        self.global_steps = 2

    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", resume)
    restored = _trainer(*overrides)
    assert restored.call_adjustments.adaptive.omega == omega0
    restored._load_checkpoint()
    assert restored.call_adjustments.adaptive.state_dict() == trainer.call_adjustments.adaptive.state_dict()

    bounded = _trainer(
        "credit.call_credit.adaptive_omega.enabled=true",
        "credit.call_credit.adaptive_omega.rho=1.0",
        "credit.call_credit.adaptive_omega.ema_beta=1.0",
        "credit.call_credit.adaptive_omega.omega_min=0.5",
        "credit.call_credit.adaptive_omega.omega_max=0.9",
    )
    _, metrics = _step(ray_tq, meta, stored, trainer=bounded)
    for role in omega0:  # rho = 1: omega = clip(2.0 share_r, 0.5, 0.9)
        clipped = min(max(2.0 * share[role], 0.5), 0.9)
        assert metrics[f"credit/omega_{role}"] == pytest.approx(clipped, rel=1e-5)
        assert 0.5 <= metrics[f"credit/omega_{role}"] <= 0.9
    # 2 share: AE ~0.99 -> 0.9 (upper bound), RV ~0.28 -> 0.5 (lower bound), IG ~0.73 inside
    assert metrics["credit/omega_AE"] == 0.9 and metrics["credit/omega_RV"] == 0.5
    assert 0.5 < metrics["credit/omega_IG"] < 0.9


# --------------------------------------------------------------------------- DPO export


@pytest.mark.timeout(180)
def test_dpo_pairs_are_appended_per_step(stored, ray_tq, tmp_path):
    """The 4 AE replays of xM give |Delta| = 1, 0.5, 1, 0 -> 3 pairs with |Delta| > theta_ae = 0
    (session 1's AE1, Delta 0, is no preference); a second step appends 3 more."""
    meta = batch_meta(ray_tq, ["xM_"])
    path = tmp_path / "dpo" / "pairs.jsonl"
    trainer = _trainer(
        "credit.call_credit.counterfactual.enabled=true",
        "credit.call_credit.counterfactual.budget=4",
        f"credit.call_credit.dpo_export.path={path}",
    )
    trainer.global_steps = 5
    _, metrics = _step(ray_tq, meta, stored, trainer=trainer)
    assert metrics["credit/dpo_pairs"] == 3.0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    got = sorted((r["id"], r["call_index"], r["delta"], r["chosen"]) for r in records)
    assert got == [("xM_0", 1, 0.5, "original"), ("xM_0", 2, 1.0, "original"), ("xM_1", 2, -1.0, "counterfactual")]
    for record in records:
        messages = stored["xM"][int(record["id"][-1])][-1].extra_fields["credit"]["messages"]
        index = [i for i, m in enumerate(messages) if m["role"] == "assistant"][record["call_index"]]
        assert record["context"] == messages[:index] and record["original"] == messages[index]
        assert record["original"]["tool_calls"] and record["counterfactual"]["tool_calls"] is None
        assert record["counterfactual"]["content"] == record["original"]["content"]
        assert record["uid"] == "xM" and record["source"] == "remove" and record["step"] == 5
        assert record["reward"] - record["counterfactual_reward"] == pytest.approx(record["delta"])
    trainer.global_steps = 6
    _step(ray_tq, meta, stored, trainer=trainer)
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [5, 5, 5, 6, 6, 6]


# --------------------------------------------------------------------------- config


def test_hydra_overrides_of_the_optional_parts():
    settings = load_settings(
        compose_credit_config(
            [
                *BASE,
                "credit.call_credit.counterfactual.enabled=true",
                "credit.call_credit.counterfactual.budget=2",
                "credit.call_credit.counterfactual.proposer=verl_credit.counterfactual_replay:RemoveCallProposer",
                "credit.call_credit.ig_downweight.theta_ig=0.25",
                "credit.call_credit.adaptive_omega.omega_max=1.5",
                "credit.call_credit.dpo_export.path=/tmp/pairs.jsonl",
            ]
        )
    )
    call = settings.credit.call_credit
    assert (call.counterfactual.enabled, call.counterfactual.budget) == (True, 2)
    assert call.ig_downweight.theta_ig == 0.25 and call.adaptive_omega.omega_max == 1.5
    assert call.dpo_export.path == "/tmp/pairs.jsonl" and call.needs_replay
    for override, key in [
        ("credit.call_credit.counterfactual.budget=-2", r"credit\.call_credit\.counterfactual\.budget"),
        ("credit.call_credit.counterfactual.proposer=telepathy", r"credit\.call_credit\.counterfactual\.proposer"),
        ("credit.call_credit.adaptive_omega.ema_beta=0", r"credit\.call_credit\.adaptive_omega\.ema_beta"),
        ("credit.call_credit.ig_downweight.factor=2", r"credit\.call_credit\.ig_downweight\.factor"),
        ("+credit.call_credit.counterfactual.budgett=2", r"credit\.call_credit\.counterfactual\.budgett"),
    ]:
        with pytest.raises(ValueError, match=key):
            load_settings(compose_credit_config([*BASE, "credit.call_credit.counterfactual.enabled=true", override]))


# --------------------------------------------------------------------------- the real coding sandbox


def _coding_rows(episodes: list[tuple[str, Any]], width: int = 4, gap: int = 2):
    """Two sessions of one task as merged rows: action i occupies ``width`` tokens after a gap."""
    keys, tags, uids, extras, masks, rewards = [], [], [], [], [], []
    for sid, (uid, episode) in enumerate(episodes):
        n = sum(1 for m in episode.messages if m["role"] == "assistant")
        length = n * (width + gap)
        mask = torch.zeros(length, dtype=torch.int64)
        spans = []
        for action in range(n):
            start = action * (width + gap) + gap
            mask[start : start + width] = 1
            spans.append([action, start, start + width])
        reward = torch.zeros(length)
        reward[spans[-1][2] - 1] = episode.reward
        keys.append(f"{uid}_{sid}_0")
        tags.append({})
        uids.append(uid)
        extras.append(
            {
                "credit": {"spans": spans, "messages": episode.messages, "num_actions": n, "env": "coding"},
                "reward_extra_info": {"env_reward": episode.reward},
            }
        )
        masks.append(mask)
        rewards.append(reward)
    pad = max(len(m) for m in masks)
    mask = torch.stack([torch.nn.functional.pad(m, (0, pad - len(m))) for m in masks])
    reward = torch.stack([torch.nn.functional.pad(r, (0, pad - len(r))) for r in rewards])
    return keys, tags, uids, extras, mask, reward


@pytest.mark.timeout(120)
def test_counterfactual_replays_the_real_coding_sandbox():
    """median_even, scripted: a correct session (read, edit, run_tests, answer; R = 1) and a wrong-edit
    session (R = 0), one group -> A = +-1. The rule classifier makes each edit AE; budget 2 replays
    both edits without them (``remove``) in the real sandbox: the correct edit's removal fails the
    hidden tests (Delta = 1 - 0 = 1 -> factor 1.5), the wrong edit's removal changes nothing
    (Delta = 0 - 0 = 0 -> unchanged). The row's ``extra_info`` has the recipe's shape
    (``{"env": "coding", "task": "median_even"}``)."""
    from verl_credit.envs.coding_agent import run_scripted_agent
    from verl_credit.verl.call_adjustments_step import CallAdjustmentsState
    from verl_credit.verl.credit_step import compute_credit_advantages

    correct = run_scripted_agent("median_even", "correct")
    wrong = run_scripted_agent("median_even", "wrong_edit")
    assert (correct.reward, wrong.reward) == (1.0, 0.0)
    keys, tags, uids, extras, mask, reward = _coding_rows([("med", correct), ("med", wrong)])
    infos = [{"env": "coding", "task": "median_even", "index": 0}] * 2
    base = ["algorithm.adv_estimator=call_credit"]
    off = load_settings(compose_credit_config(base))
    on = load_settings(
        compose_credit_config(
            [*base, "credit.call_credit.counterfactual.enabled=true", "credit.call_credit.counterfactual.budget=2"]
        )
    )
    reference = compute_credit_advantages(keys, tags, uids, extras, mask, mask, reward, off)
    step = compute_credit_advantages(
        keys,
        tags,
        uids,
        extras,
        mask,
        mask,
        reward,
        on,
        call_adjustments=CallAdjustmentsState.from_settings(on),
        extra_infos=infos,
    )
    assert step.metrics["credit/counterfactual_failures"] == 0.0, step.metrics
    assert step.metrics["credit/counterfactual_calls"] == 2.0
    assert step.metrics["credit/counterfactual_delta_mean"] == pytest.approx(0.5)  # (1 + 0) / 2
    ae = step.credit.extras["AE"]
    edit = int(torch.nonzero(ae[0])[0])  # the correct session's edit call
    assert edit == 1 and int(torch.nonzero(ae[1])[0]) == 1
    factors = torch.ones_like(reference.credit.weight[0])
    factors[edit] = 1.5
    lengths = reference.credit.lengths[0]
    old = reference.credit.weight[0]
    expected = old * factors * float((lengths * old).sum()) / float((lengths * old * factors).sum())
    assert torch.allclose(step.credit.weight[0], expected, rtol=1e-12)
    assert step.credit.weight[0, edit] > old[edit]
    assert torch.equal(step.credit.weight[1], reference.credit.weight[1])  # Delta 0: unchanged
    assert torch.equal(step.advantages[1], reference.advantages[1])
