"""Optional CALL-CREDIT parts (docs/design.md section 4): RV reward, counterfactual calibration, adaptive omega,
IG down-weighting, DPO export. Hand-computed expectations in the comments."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from verl_credit.annotate.roles import analyze_calls, build_call_graph
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.config import CallCreditConfig, CounterfactualConfig, CreditConfig
from verl_credit.counterfactual_replay import (
    EDIT_PROPOSERS,
    AlternativeEdit,
    CounterfactualResult,
    EditProposer,
    RemoveCallProposer,
    ReplayEnvironment,
    ReplayRequest,
    build_edit_proposer,
    register_edit_proposer,
    run_replays,
)
from verl_credit.credit_math.call_adjustments import (
    AdaptiveRoleWeights,
    apply_counterfactual_calibration,
    compute_rv_rewards,
    counterfactual_delta_matrix,
    downweight_ig_calls,
    route_rv_reward_tokens,
    rv_reward_matrix,
    select_counterfactual_calls,
)
from verl_credit.dpo_export import append_dpo_pairs, build_dpo_pairs, counterfactual_message, write_dpo_pairs
from verl_credit.trajectory import Trajectory


def replay_selected(
    trajectories: list[Trajectory], selected: list[tuple[int, int]], env: object, proposer: EditProposer
) -> list[CounterfactualResult]:
    """The selected calls replayed through ``env`` with the proposer's alternatives, as the trainer
    runs them (``replay.run_replays``); calls without an alternative are skipped."""
    requests = []
    for row, call_index in selected:
        alternative = proposer.propose(trajectories[row], call_index)
        if alternative is not None:
            requests.append(ReplayRequest(row, call_index, trajectories[row], alternative, trajectories[row].reward))

    async def replay(request: ReplayRequest) -> float:
        value = env.replay(request.trajectory.messages, request.call_index, request.alternative.arguments)
        return await value if inspect.isawaitable(value) else value

    results, failures = asyncio.run(run_replays(requests, replay))
    assert not failures, failures
    return results


# ------------------------------------------------------------------ RV self-correction reward

# RV0 fails and names a.py -> AE1 edits a.py -> RV2 passes; RV3 fails, nothing fixes it.
SELF_CORRECTING = CallGraph(
    roles=("RV", "AE", "RV", "RV"),
    ambiguous=(False,) * 4,
    edges=(CallEdge(0, 1, "RV->AE", "a.py"), CallEdge(1, 2, "AE->RV", "a.py")),
)
STATUS = ["fail", None, "pass", "fail"]


def test_rv_reward_self_correction() -> None:
    reward = compute_rv_rewards(SELF_CORRECTING, STATUS, "self_correction", kappa=0.2)
    # RV0: failed, a named path was edited (edge 0->1), an RV after the fix passed -> +kappa.
    # RV2 passed (no failure to correct), RV3 failed and was ignored -> 0.
    assert reward.tolist() == [0.2, 0.0, 0.0, 0.0]


def test_rv_reward_self_correction_needs_a_later_pass() -> None:
    reward = compute_rv_rewards(SELF_CORRECTING, ["fail", None, "fail", "fail"], "self_correction", kappa=0.2)
    assert reward.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_rv_reward_literal_seed_formula_penalizes_the_correction() -> None:
    reward = compute_rv_rewards(SELF_CORRECTING, STATUS, "literal", kappa=0.2)
    # r = kappa * (1[pass] - 1[fail and bug identified]):
    # RV0: 0.2 * (0 - 1) = -0.2 (the behaviour the seed wants to encourage is penalized); RV2: +0.2;
    # RV3: failed but no edit followed -> 0.2 * (0 - 0) = 0.
    assert reward.tolist() == [-0.2, 0.0, 0.2, 0.0]


def test_rv_reward_off_and_errors() -> None:
    assert compute_rv_rewards(SELF_CORRECTING, STATUS, "off").tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="rv_reward"):
        compute_rv_rewards(SELF_CORRECTING, STATUS, "bonus")
    with pytest.raises(ValueError, match="rv_status"):
        compute_rv_rewards(SELF_CORRECTING, STATUS[:2])


def _tool_call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _fix_transcript() -> list[dict]:
    """read -> failing test -> edit of the named file -> passing test."""
    return [
        {"role": "user", "content": "divide by zero crashes"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("r", "read_file", {"path": "calc/ops.py"})]},
        {"role": "tool", "tool_call_id": "r", "content": "def divide(a, b):\n    return a / b\n"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("t1", "run_tests", {})]},
        {
            "role": "tool",
            "tool_call_id": "t1",
            "content": "FAILED tests/test_ops.py::test_zero\ncalc/ops.py:2: ZeroDivisionError\n1 failed in 0.1s",
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                _tool_call(
                    "e",
                    "edit_file",
                    {"path": "calc/ops.py", "old": "    return a / b", "new": "    return a / b if b else 0.0"},
                )
            ],
        },
        {"role": "tool", "tool_call_id": "e", "content": "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -2 +2 @@"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("t2", "run_tests", {})]},
        {"role": "tool", "tool_call_id": "t2", "content": "...\n3 passed in 0.1s"},
    ]


def test_rv_reward_end_to_end_from_a_transcript() -> None:
    trajectory = Trajectory.from_messages(_fix_transcript(), reward=1.0, action_token_lengths=[3, 2, 5, 2])
    graph = build_call_graph(trajectory)
    status = [f.rv_status for f in analyze_calls(trajectory)]
    assert graph.roles == ("IG", "RV", "AE", "RV") and status == [None, "fail", None, "pass"]
    matrix = rv_reward_matrix([graph], [status], width=5, mode="self_correction", kappa=0.5)
    assert matrix.tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0]]
    # on tokens: merged row with spans [0,3) [4,6) [6,11) [12,14) -> r on tokens 4, 5 only
    tokens = route_rv_reward_tokens(
        matrix,
        torch.tensor([0]),
        torch.tensor([[0, 1, 2, 3]]),
        torch.tensor([[0, 4, 6, 12]]),
        torch.tensor([[3, 6, 11, 14]]),
        response_length=16,
    )
    expected = torch.zeros(1, 16)
    expected[0, 4:6] = 0.5
    assert torch.equal(tokens, expected)


# ------------------------------------------------------------------ counterfactual calibration


def test_select_counterfactual_calls_top_k_abs_advantage_of_ae_calls() -> None:
    advantage = torch.tensor([[0.5, -2.0, 1.0], [3.0, -1.5, 0.0]])
    is_ae = torch.tensor([[1, 1, 0], [0, 1, 1]])
    # AE magnitudes: (0,0)=0.5, (0,1)=2.0, (1,1)=1.5, (1,2)=0 (never picked); (1,0)=3.0 is not AE
    assert select_counterfactual_calls(advantage, is_ae, 2) == [(0, 1), (1, 1)]
    assert select_counterfactual_calls(advantage, is_ae, 10) == [(0, 1), (1, 1), (0, 0)]
    assert select_counterfactual_calls(advantage, is_ae, 0) == []


def test_counterfactual_calibration_hand_computed() -> None:
    weight = torch.tensor([[1.5, 0.5, 1.0]], dtype=torch.float64)
    lengths = torch.tensor([[2.0, 2.0, 1.0]], dtype=torch.float64)
    delta = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    has = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    out = apply_counterfactual_calibration(weight, lengths, delta, has, eta=0.5)
    # factor on call 0: 1 + 0.5 * 1 = 1.5 -> w' = [2.25, 0.5, 1.0]
    # mass before: 2*1.5 + 2*0.5 + 1*1.0 = 5.0; after: 2*2.25 + 1.0 + 1.0 = 6.5 -> scale 5 / 6.5
    expected = torch.tensor([[2.25, 0.5, 1.0]], dtype=torch.float64) * (5.0 / 6.5)
    assert torch.allclose(out, expected, rtol=0, atol=1e-12)
    assert math.isclose(float((lengths * out).sum()), 5.0, rel_tol=1e-12)


def test_counterfactual_calibration_negative_delta_and_floor() -> None:
    weight = torch.ones(1, 2, dtype=torch.float64)
    lengths = torch.ones(1, 2, dtype=torch.float64)
    delta = torch.tensor([[-1.0, 0.0]], dtype=torch.float64)
    has = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    # eta = 2: 1 + 2 * (-1) = -1 -> clamped to the floor 0.01; mass 2 restored: w = 2 * [0.01, 1] / 1.01
    out = apply_counterfactual_calibration(weight, lengths, delta, has, eta=2.0, floor=0.01)
    assert torch.allclose(out, torch.tensor([[0.02 / 1.01, 2.0 / 1.01]], dtype=torch.float64))
    assert bool((out > 0).all())
    # nothing replayed -> unchanged
    assert torch.equal(apply_counterfactual_calibration(weight, lengths, delta, torch.zeros_like(has), 0.5), weight)


def test_counterfactual_calibration_follows_the_sign_of_the_advantage() -> None:
    # A failed rollout (A < 0) whose edit caused the failure: the alternative edit would have passed,
    # Delta = R - R' = 0 - 1 = -1. Blame must grow: factor 1 + 0.5 * sign(A) * Delta = 1.5.
    weight = torch.ones(1, 2, dtype=torch.float64)
    lengths = torch.ones(1, 2, dtype=torch.float64)
    delta = torch.tensor([[-1.0, 0.0]], dtype=torch.float64)
    has = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    out = apply_counterfactual_calibration(weight, lengths, delta, has, eta=0.5, advantage=torch.tensor([-0.7]))
    # w' = [1.5, 1] -> mass 2 restored: [1.5, 1] * 2 / 2.5 = [1.2, 0.8]
    assert torch.allclose(out, torch.tensor([[1.2, 0.8]], dtype=torch.float64))
    # the same Delta on a successful rollout (A > 0) shrinks the edit's credit: [0.5, 1] * 2 / 1.5
    out = apply_counterfactual_calibration(weight, lengths, delta, has, eta=0.5, advantage=torch.tensor([0.7]))
    assert torch.allclose(out, torch.tensor([[1.0 / 1.5, 2.0 / 1.5]], dtype=torch.float64))


class FakeReplayEnv:
    """Reward 1 unless the replacement edit writes 'return 0' (a wrong fix)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Any, int]] = []

    def replay(
        self,
        trajectory_messages: Sequence[Mapping[str, Any]],
        call_index: int,
        replacement_arguments: Mapping[str, Any] | None,
    ) -> float:
        self.calls.append((call_index, replacement_arguments, len(trajectory_messages)))
        if replacement_arguments is None:
            return 0.0
        return 0.0 if "return 0" in replacement_arguments.get("new", "") else 1.0


class AsyncFakeReplayEnv(FakeReplayEnv):
    async def replay(self, trajectory_messages, call_index, replacement_arguments):  # type: ignore[override]
        await asyncio.sleep(0)
        return super().replay(trajectory_messages, call_index, replacement_arguments)


class FakeProposer:
    def __init__(self, new: str | None) -> None:
        self.new = new

    def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit | None:
        if self.new == "skip":
            return None
        if self.new is None:
            return AlternativeEdit(None, "drop")
        return AlternativeEdit({"path": "calc/ops.py", "old": "    return a / b", "new": self.new}, "second sample")


@pytest.mark.parametrize("env_class", [FakeReplayEnv, AsyncFakeReplayEnv])
def test_counterfactual_driver_with_a_fake_replay_env(env_class: type) -> None:
    trajectory = Trajectory.from_messages(_fix_transcript(), id="t0", reward=1.0, action_token_lengths=[3, 2, 5, 2])
    env = env_class()
    assert isinstance(env, ReplayEnvironment) and isinstance(FakeProposer("x"), EditProposer)
    advantage = torch.tensor([[0.3, 0.2, 1.4, 0.1]])
    is_ae = torch.tensor([[0, 0, 1, 0]])
    results = replay_selected(
        [trajectory], select_counterfactual_calls(advantage, is_ae, 3), env, FakeProposer("    return 0")
    )
    assert len(results) == 1 and env.calls == [(2, results[0].alternative.arguments, 9)]
    result = results[0]
    # R(tau) = 1, R(tau') = 0 (the alternative edit is wrong) -> Delta = 1
    assert (result.row, result.call_index, result.delta) == (0, 2, 1.0)
    assert result.original_arguments == {
        "path": "calc/ops.py",
        "old": "    return a / b",
        "new": "    return a / b if b else 0.0",
    }
    delta, has = counterfactual_delta_matrix(results, (1, 4))
    assert delta.tolist() == [[0.0, 0.0, 1.0, 0.0]] and has.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    # an equally good alternative -> Delta 0; no alternative -> skipped
    same = replay_selected([trajectory], [(0, 2)], env, FakeProposer("    return 1.0"))
    assert same[0].delta == 0.0
    assert replay_selected([trajectory], [(0, 2)], env, FakeProposer("skip")) == []


def test_replay_protocol_matches_the_coding_sandbox() -> None:
    import inspect

    import verl_credit.envs.coding.environment as coding

    parameters = list(inspect.signature(coding.CodingEnvironment.replay).parameters)
    assert parameters[:4] == ["self", "trajectory_messages", "call_index", "replacement_arguments"]
    assert isinstance(coding.CodingEnvironment(), ReplayEnvironment)


# ------------------------------------------------------------------ IG down-weighting


def test_ig_downweight_hand_computed() -> None:
    weight = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    lengths = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    is_ig = torch.tensor([[1, 1, 1, 0]])
    delta = torch.tensor([[-0.5, 0.5, -0.5, -1.0]], dtype=torch.float64)
    has = torch.tensor([[1, 1, 0, 1]], dtype=torch.float64)
    out = downweight_ig_calls(weight, lengths, is_ig, delta, has, theta_ig=0.0, factor=0.5)
    # only call 0 qualifies (IG, measured, Delta < 0); call 2 has no measurement; call 3 is not IG.
    # w' = [0.5, 1, 1, 1], mass 3.5 -> rescale by 4 / 3.5
    assert torch.allclose(out, torch.tensor([[0.5, 1.0, 1.0, 1.0]], dtype=torch.float64) * (4 / 3.5))


# ------------------------------------------------------------------ adaptive role weights


def test_adaptive_role_weights_two_steps_hand_computed() -> None:
    state = AdaptiveRoleWeights({"AE": 1.0, "IG": 0.6, "RV": 0.4}, rho=0.5, ema_beta=0.5)
    # initial shares = omega / sum(omega) = AE 0.5, IG 0.3, RV 0.2
    assert state.share == pytest.approx({"AE": 0.5, "IG": 0.3, "RV": 0.2})
    advantage = torch.tensor([[2.0, -2.0, 1.0, 1.0]])
    masks = {"AE": torch.tensor([[1, 1, 0, 0]]), "IG": torch.tensor([[0, 0, 1, 0]]), "RV": torch.tensor([[0, 0, 0, 1]])}
    metrics = state.update(advantage, masks)
    # mean |A|: AE 2, IG 1, RV 1 -> share AE 0.5, IG 0.25, RV 0.25
    # EMA (beta 0.5): AE 0.5, IG 0.275, RV 0.225; target = 2.0 * S = AE 1.0, IG 0.55, RV 0.45
    # omega += 0.5 (target - omega): AE 1.0, IG 0.575, RV 0.425
    assert state.omega == pytest.approx({"AE": 1.0, "IG": 0.575, "RV": 0.425})
    assert metrics["credit/omega_IG"] == pytest.approx(0.575) and "credit/role_delta_AE" not in metrics
    delta = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    has = torch.tensor([[1, 1, 0, 0]])
    metrics = state.update(advantage, masks, delta, has)
    # D_AE = mean(1, 0) = 0.5 (first measurement) -> gain AE 1.5, IG 1, RV 1
    # S: AE 0.5, IG 0.2625, RV 0.2375; norm = 0.75 + 0.2625 + 0.2375 = 1.25; sum(omega) = 2.0
    # target AE 2 * 0.75 / 1.25 = 1.2, IG 0.42, RV 0.38
    # omega: AE 1.0 + 0.5 * 0.2 = 1.1, IG 0.575 - 0.5 * 0.155 = 0.4975, RV 0.425 - 0.5 * 0.045 = 0.4025
    assert state.omega == pytest.approx({"AE": 1.1, "IG": 0.4975, "RV": 0.4025})
    assert metrics["credit/role_delta_AE"] == pytest.approx(0.5)


def test_adaptive_role_weights_respect_bounds() -> None:
    state = AdaptiveRoleWeights({"AE": 1.0, "IG": 0.6, "RV": 0.4}, rho=1.0, ema_beta=1.0, omega_min=0.3, omega_max=1.05)
    advantage = torch.tensor([[5.0, 0.01, 0.01]])
    masks = {"AE": torch.tensor([[1, 0, 0]]), "IG": torch.tensor([[0, 1, 0]]), "RV": torch.tensor([[0, 0, 1]])}
    state.update(advantage, masks)
    # share ~ AE 0.996 -> target AE ~1.99 (clipped to 1.05), IG/RV ~0.004 (clipped to 0.3)
    assert state.omega == pytest.approx({"AE": 1.05, "IG": 0.3, "RV": 0.3})


def test_optional_part_settings_live_under_call_credit() -> None:
    config = CreditConfig.from_mapping({"estimator": "call_credit"}).call_credit
    assert not config.counterfactual.enabled and not config.adaptive_omega.enabled
    assert not config.ig_downweight.enabled and config.dpo_export.path is None
    assert not config.needs_replay and not config.adjustments_enabled
    values = {"counterfactual": {"enabled": True, "eta": 0.2}, "adaptive_omega": {"rho": 0.3}}
    config = CreditConfig.from_mapping({"call_credit": values}).call_credit
    assert config.counterfactual.eta == 0.2 and config.needs_replay and config.adjustments_enabled
    # a budget of 0 replays nothing
    assert not CallCreditConfig(counterfactual=CounterfactualConfig(enabled=True, budget=0)).needs_replay
    state = AdaptiveRoleWeights.from_config({"AE": 1.0, "IG": 0.6, "RV": 0.4}, config.adaptive_omega)
    assert state.rho == 0.3 and (state.omega_min, state.omega_max) == (0.1, 2.0)
    with pytest.raises(ValueError, match="missing roles"):
        AdaptiveRoleWeights({"AE": 1.0})


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"counterfactual": {"bogus": 1}}, r"credit\.call_credit\.counterfactual\.bogus"),
        ({"counterfactual": {"budget": -1}}, r"credit\.call_credit\.counterfactual\.budget"),
        ({"counterfactual": {"budget": 2.5}}, r"credit\.call_credit\.counterfactual\.budget"),
        ({"counterfactual": {"enabled": "yes"}}, r"credit\.call_credit\.counterfactual\.enabled"),
        ({"counterfactual": {"factor_floor": 0.0}}, r"credit\.call_credit\.counterfactual\.factor_floor"),
        ({"counterfactual": {"timeout": 0}}, r"credit\.call_credit\.counterfactual\.timeout"),
        ({"counterfactual": 3}, r"credit\.call_credit\.counterfactual must be a mapping"),
        ({"adaptive_omega": {"omega_min": 2.0, "omega_max": 1.0}}, r"credit\.call_credit\.adaptive_omega\.omega_max"),
        ({"adaptive_omega": {"rho": 1.5}}, r"credit\.call_credit\.adaptive_omega\.rho"),
        ({"ig_downweight": {"factor": 0.0}}, r"credit\.call_credit\.ig_downweight\.factor"),
        ({"dpo_export": {"theta_ae": -1.0}}, r"credit\.call_credit\.dpo_export\.theta_ae"),
        ({"dpo_export": {"path": "pairs.jsonl"}}, r"credit\.call_credit\.dpo_export\.path needs .*counterfactual"),
        ({"replay": {}}, r"credit\.call_credit\.replay"),
    ],
)
def test_optional_part_settings_reject_bad_values_naming_the_key(values: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        CreditConfig.from_mapping({"call_credit": values})


def test_adaptive_role_weights_state_round_trip() -> None:
    state = AdaptiveRoleWeights({"AE": 1.0, "IG": 0.6, "RV": 0.4}, rho=0.5, ema_beta=0.5)
    advantage = torch.tensor([[2.0, -2.0, 1.0, 1.0]])
    masks = {"AE": torch.tensor([[1, 1, 0, 0]]), "IG": torch.tensor([[0, 0, 1, 0]]), "RV": torch.tensor([[0, 0, 0, 1]])}
    state.update(advantage, masks, torch.tensor([[1.0, 0.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0, 0]]))
    saved = json.loads(json.dumps(state.state_dict()))
    fresh = AdaptiveRoleWeights({"AE": 1.0, "IG": 0.6, "RV": 0.4}, rho=0.5, ema_beta=0.5)
    fresh.load_state_dict(saved)
    assert (fresh.omega, fresh.share, fresh.delta) == (state.omega, state.share, state.delta)
    # the restored state continues exactly like the original
    assert fresh.update(advantage, masks) == state.update(advantage, masks)
    with pytest.raises(ValueError, match="share is missing roles"):
        fresh.load_state_dict({"omega": saved["omega"], "share": {"AE": 1.0}})


# ------------------------------------------------------------------ proposers and the replay runner


def test_remove_proposer_and_registry(monkeypatch) -> None:
    messages = [*_fix_transcript(), {"role": "assistant", "content": "Fixed: divide returns 0.0 for b = 0."}]
    trajectory = Trajectory.from_messages(messages, id="t0", reward=1.0)
    proposer = build_edit_proposer("remove")
    assert isinstance(proposer, RemoveCallProposer) and isinstance(proposer, EditProposer)
    assert proposer.propose(trajectory, 2) == AlternativeEdit(None, source="remove")  # the edit call
    assert proposer.propose(trajectory, 4) is None  # the final answer has no tool call to remove
    # import path (package.module:Class) and registration
    by_path = build_edit_proposer("verl_credit.counterfactual_replay:RemoveCallProposer")
    assert isinstance(by_path, RemoveCallProposer) and by_path is not proposer
    monkeypatch.setitem(EDIT_PROPOSERS, "wrong_fix", lambda: FakeProposer("    return 0"))
    assert build_edit_proposer("wrong_fix").propose(trajectory, 2).arguments["new"] == "    return 0"
    with pytest.raises(ValueError, match="unknown edit proposer 'nope'"):
        build_edit_proposer("nope")
    with pytest.raises(ValueError, match="cannot import edit proposer"):
        build_edit_proposer("verl_credit.counterfactual_replay:Missing")
    with pytest.raises(ValueError, match="has no propose"):
        build_edit_proposer("collections:OrderedDict")
    with pytest.raises(ValueError, match="already registered"):
        register_edit_proposer("remove")(FakeProposer)


def test_run_replays_counts_failures_and_keeps_order() -> None:
    trajectory = Trajectory.from_messages(_fix_transcript(), id="t0", reward=1.0)
    requests = [ReplayRequest(0, call, trajectory, AlternativeEdit(None, "remove"), 1.0) for call in (0, 1, 2, 3)]
    running = {"now": 0, "peak": 0}

    async def replay(request: ReplayRequest) -> float:
        running["now"] += 1
        running["peak"] = max(running["peak"], running["now"])
        try:
            await asyncio.sleep(0.05)
            if request.call_index == 1:
                raise RuntimeError("sandbox broke")
            if request.call_index == 3:
                await asyncio.sleep(5)  # past the time limit
            return float("nan") if request.call_index == 0 else 0.25
        finally:
            running["now"] -= 1

    results, failures = asyncio.run(run_replays(requests, replay, concurrency=2, timeout=0.5))
    # call 2: R(tau') = 0.25 -> Delta = 0.75; the original arguments are the edit's
    assert [(r.call_index, r.delta) for r in results] == [(2, 0.75)]
    assert results[0].original_arguments["new"] == "    return a / b if b else 0.0"
    assert [(f.call_index, f.error.split(":")[0].split(" ")[0]) for f in failures] == [
        (0, "replay"),
        (1, "RuntimeError"),
        (3, "replay"),
    ]
    assert "returned nan" in failures[0].error and "timed out" in failures[2].error
    assert running["peak"] == 2  # never more than `concurrency` at once
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(run_replays(requests, replay, concurrency=0))


def test_rescale_keeps_untouched_rows_bit_identical() -> None:
    weight = torch.tensor([[0.1, 0.7, 2.2], [1.3, 0.3, 1.4]], dtype=torch.float64)
    lengths = torch.tensor([[3.0, 7.0, 11.0], [5.0, 2.0, 9.0]], dtype=torch.float64)
    delta = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    has = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    out = apply_counterfactual_calibration(weight, lengths, delta, has, eta=0.5)
    assert torch.equal(out[1], weight[1])  # no replay in row 1: exactly the old weights
    # row 0: w' = [0.1, 1.05, 2.2] rescaled to mass 0.3 + 4.9 + 24.2 = 29.4
    assert math.isclose(float((lengths[0] * out[0]).sum()), 29.4, rel_tol=1e-12)
    assert float(out[0, 1] / out[0, 0]) == pytest.approx(10.5)


# ------------------------------------------------------------------ DPO export


def test_dpo_pairs(tmp_path) -> None:
    trajectory = Trajectory.from_messages(_fix_transcript(), id="t0", uid="task", reward=1.0)
    original = {"path": "calc/ops.py", "old": "    return a / b", "new": "    return a / b if b else 0.0"}
    wrong = AlternativeEdit({"path": "calc/ops.py", "old": "    return a / b", "new": "    return 0"})
    results = [
        CounterfactualResult(0, 2, "t0", original, wrong, 1.0, 0.0),  # Delta 1: original chosen
        CounterfactualResult(0, 2, "t0", original, AlternativeEdit(None), 1.0, 1.0),  # Delta 0: no preference
    ]
    pairs = build_dpo_pairs([trajectory], results)
    assert len(pairs) == 1
    pair = pairs[0]
    assert pair["delta"] == 1.0 and pair["chosen"] == "original" and pair["call_index"] == 2
    assert pair["context"] == _fix_transcript()[:5]  # everything before the edit call
    assert pair["original"] == _fix_transcript()[5]
    changed = json.loads(pair["counterfactual"]["tool_calls"][0]["function"]["arguments"])
    assert changed["new"] == "    return 0"
    # a negative Delta prefers the counterfactual; theta filters small effects
    flipped = CounterfactualResult(0, 2, "t0", original, wrong, 0.0, 1.0)
    assert build_dpo_pairs([trajectory], [flipped])[0]["chosen"] == "counterfactual"
    assert build_dpo_pairs([trajectory], [flipped], theta_ae=1.0) == []
    path = tmp_path / "dpo.jsonl"
    assert write_dpo_pairs(path, pairs) == 1
    assert json.loads(path.read_text().splitlines()[0])["id"] == "t0"
    # the trainer appends each step's pairs, with the step and the proposer's name
    appended = tmp_path / "run" / "pairs.jsonl"
    assert append_dpo_pairs(appended, build_dpo_pairs([trajectory], results, step=3)) == 1
    assert append_dpo_pairs(appended, build_dpo_pairs([trajectory], [flipped], step=4)) == 1
    assert append_dpo_pairs(appended, []) == 0
    lines = [json.loads(line) for line in appended.read_text().splitlines()]
    assert [(r["step"], r["chosen"], r["source"]) for r in lines] == [(3, "original", ""), (4, "counterfactual", "")]
    assert "step" not in pairs[0]
    # a dropped call
    dropped = counterfactual_message(_fix_transcript()[5], None)
    assert dropped["tool_calls"] is None
    with pytest.raises(ValueError, match="points at row"):
        build_dpo_pairs([trajectory], [CounterfactualResult(0, 2, "other", original, wrong, 1.0, 0.0)])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_counterfactual_calibration_with_the_real_coding_sandbox(tmp_path) -> None:
    """End to end on a shipped task: the correct fix replayed with a plausible-but-wrong edit scores 0,
    so Delta = 1, the edit's weight grows, and a DPO pair prefers the original edit."""
    import verl_credit.envs.coding.environment as coding
    from verl_credit.batch_credit import compute_batch_credit
    from verl_credit.config import CreditConfig
    from verl_credit.envs.coding.task_spec import load_task

    task = load_task("median_even")
    env = coding.CodingEnvironment(jail="fallback")
    start = asyncio.run(env.start({"task": "median_even"}))
    messages: list[dict] = [
        {"role": "system", "content": start.system_prompt},
        {"role": "user", "content": start.first_user_message},
    ]
    plan = [("read_file", {"path": task.target}), ("edit_file", task.solution[0].to_arguments()), ("run_tests", {})]
    for k, (name, arguments) in enumerate(plan):
        messages.append({"role": "assistant", "content": "", "tool_calls": [_tool_call(f"c{k}", name, arguments)]})
        result = asyncio.run(env.call_tool(name, arguments))
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": result.content})
    reward = asyncio.run(env.reward())
    try:
        assert reward == 1.0
        # two rollouts of the task: this one (R = 1) and a failed one (R = 0) -> A_tau = +0.7071
        trajectory = Trajectory.from_messages(
            messages, id="ok", uid="median", reward=reward, action_token_lengths=[4, 12, 2]
        )
        graph = build_call_graph(trajectory)
        assert graph.roles == ("IG", "AE", "RV")
        assert {(e.src, e.dst, e.kind) for e in graph.edges} == {(0, 1, "IG->AE"), (1, 2, "AE->RV")}
        failed = CallGraph(roles=("IG",), ambiguous=(False,))
        credit = compute_batch_credit(
            torch.tensor([1.0, 0.0]),
            ["median", "median"],
            [[4, 12, 2], [5]],
            CreditConfig(estimator="call_credit"),
            call_graphs=[graph, failed],
        )
        wrong = AlternativeEdit(task.wrong_edit("always_average_middles").edits[0].to_arguments(), "wrong edit")

        class WrongEditProposer:
            def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit:
                return wrong

        selected = select_counterfactual_calls(credit.action_advantage[:1], credit.extras["AE"][:1], 1)
        results = replay_selected([trajectory], selected, env, WrongEditProposer())
    finally:
        asyncio.run(env.close())
    assert [(r.call_index, r.counterfactual_reward, r.delta) for r in results] == [(1, 0.0, 1.0)]
    delta, has = counterfactual_delta_matrix(results, tuple(credit.weight[:1].shape))
    calibrated = apply_counterfactual_calibration(credit.weight[:1], credit.lengths[:1], delta, has, eta=0.5)
    assert float(calibrated[0, 1]) > float(credit.weight[0, 1])  # the decisive edit gains weight
    assert math.isclose(float((credit.lengths[:1] * calibrated).sum()), 18.0, rel_tol=1e-9)  # mass L kept
    pairs = build_dpo_pairs([trajectory], results)
    assert pairs[0]["chosen"] == "original" and pairs[0]["delta"] == 1.0
