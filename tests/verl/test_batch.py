"""Rows -> sessions -> spans (pure bookkeeping; no TransferQueue)."""

from __future__ import annotations

import math

import pytest
import torch

from verl_credit.verl.batch import (
    VALIDATE_KEY,
    ValidationBatches,
    build_span_tensors,
    count_sessions,
    group_sessions,
    plan_mini_batches,
    session_lengths,
    session_spans,
    split_key,
    tag_validation_batch,
)


def test_group_sessions_orders_by_first_appearance_and_skips_padding():
    keys = ["u1_1_1", "u1_0_0", "u1_1_0", "padabc_0_0", "u2_0_0", "u1_1_2"]
    tags = [{}, {}, {}, {"is_padding": True}, {}, {}]
    sessions, row_session = group_sessions(keys, tags, ["u1", "u1", "u1", "u1", "u2", "u1"])
    assert [s.key for s in sessions] == ["u1_1", "u1_0", "u2_0"]
    assert sessions[0].rows == [2, 0, 5] and sessions[0].final_row == 5  # index order 0, 1, 2
    assert row_session == [0, 1, 0, -1, 2, 0]


def test_split_key_rejects_foreign_keys():
    assert split_key("a-b_c_3_1") == ("a-b_c_3", 1)
    with pytest.raises(ValueError, match="'nounderscore'"):
        split_key("nounderscore")


def _mask(*bits):
    return torch.tensor(bits)


def test_session_spans_recorded_and_derived():
    sessions, _ = group_sessions(["u_0_0", "u_0_1"], [{}, {}], ["u", "u"])
    masks = [_mask(1, 1, 0, 1), _mask(1, 1, 1, 0)]
    recorded = [{"credit": {"spans": [[0, 0, 2], [1, 3, 4]]}}, {"credit": {"spans": [[2, 0, 3]]}}]
    spans, was_recorded = session_spans(sessions[0], recorded, masks, ["u_0_0", "u_0_1"])
    assert was_recorded and spans == {0: [(0, 0, 2), (1, 3, 4)], 1: [(2, 0, 3)]}
    assert session_lengths(spans, 3) == [2, 1, 3]
    # without recorded spans, each run of ones is an action, numbered across the session's rows
    spans, was_recorded = session_spans(sessions[0], [{}, {}], masks, ["u_0_0", "u_0_1"])
    assert not was_recorded and spans == {0: [(0, 0, 2), (1, 3, 4)], 1: [(2, 0, 3)]}


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ([[0, 0, 3]], "covers tokens with response_mask 0"),
        ([[0, 0, 2]], "spans cover 2 tokens but response_mask has 3"),
        ([[0, 3, 9]], "outside a response of 4 tokens"),
    ],
)
def test_session_spans_reject_inexact_spans(spans, message):
    sessions, _ = group_sessions(["u_0_0"], [{}], ["u"])
    with pytest.raises(ValueError, match=message):
        session_spans(sessions[0], [{"credit": {"spans": spans}}], [_mask(1, 1, 0, 1)], ["u_0_0"])


def test_session_lengths_rejects_unknown_action():
    with pytest.raises(ValueError, match="action 3 but the session has 2"):
        session_lengths({0: [(3, 0, 1)]}, 2)


def test_build_span_tensors_pads_and_sorts():
    action, start, end = build_span_tensors([[(1, 5, 7), (0, 0, 2)], []])
    assert action.tolist() == [[0, 1], [-1, -1]]
    assert start.tolist() == [[0, 5], [0, 0]] and end.tolist() == [[2, 7], [0, 0]]


def test_count_sessions_skips_padding():
    keys = ["u1_0_0", "u1_0_1", "u1_1_0", "padx_0_0", "u2_0_3"]
    tags = [{}, {}, {}, {"is_padding": True}, {}]
    assert count_sessions(keys, tags) == 3


# ---- plan_mini_batches: per_request trains with merged's number of optimizer updates ----------


def _verl_rules(plan, dp, micro, forward):
    """The row constraints verl 0.9.1 asserts (train_mini_batch, make_iterator, prepare_micro_batches)."""
    assert plan.padded_rows % plan.batch_multiple == 0 and plan.padded_rows % dp == 0
    assert 0 <= plan.padded_rows - plan.rows < plan.batch_multiple
    for role, rows in plan.mini_batch_rows.items():
        assert rows % dp == 0  # train_mini_batch: mini_batch_size % dp == 0
        assert (plan.padded_rows // dp) % (rows // dp) == 0  # make_iterator: rank rows % per-GPU mini-batch
        assert (rows // dp) % micro.get(role, 1) == 0  # prepare_micro_batches (training)
        assert plan.padded_rows // rows == plan.updates[role]
    for size in forward:
        assert (plan.padded_rows // dp) % size == 0  # prepare_micro_batches (forward passes)


def test_plan_per_request_matches_merged_update_count():
    # 16 prompts x n=4 = 64 sessions, ppo_mini_batch_size=4 -> 16 sessions per update: merged = 4 updates
    merged = plan_mini_batches(64, 64, {"actor": 16}, dp_size=8, micro_batch_sizes={"actor": 2})
    assert merged.updates == {"actor": 4} and merged.mini_batch_rows == {"actor": 16} and merged.padded_rows == 64
    # per_request, 15 requests per session: verl's 16-row mini-batches would give 960 / 16 = 60 updates
    per_request = plan_mini_batches(960, 64, {"actor": 16}, dp_size=8, micro_batch_sizes={"actor": 2})
    assert per_request.updates == {"actor": 4}
    assert per_request.mini_batch_rows == {"actor": 240} and per_request.padded_rows == 960
    assert per_request.rows_per_session == 15.0
    _verl_rules(per_request, 8, {"actor": 2}, [])


def test_plan_pads_to_a_multiple_every_rule_accepts():
    plan = plan_mini_batches(
        1001, 64, {"actor": 16}, dp_size=8, micro_batch_sizes={"actor": 2}, forward_micro_batch_sizes=[3]
    )
    assert plan.updates == {"actor": 4}
    assert plan.batch_multiple == 192  # lcm(8, 4 * 8 * 2, 8 * 3)
    assert plan.padded_rows == 1152 and plan.mini_batch_rows == {"actor": 288}
    _verl_rules(plan, 8, {"actor": 2}, [3])


def test_plan_counts_merged_padding_and_each_role():
    # 60 sessions (a failed group): verl pads the merged batch to 64 rows -> still 4 updates
    assert plan_mini_batches(700, 60, {"actor": 16}, dp_size=8).updates == {"actor": 4}
    # actor and critic with their own mini-batch sizes
    plan = plan_mini_batches(
        900, 64, {"actor": 16, "critic": 32}, dp_size=4, micro_batch_sizes={"actor": 1, "critic": 2}
    )
    assert plan.updates == {"actor": 4, "critic": 2}
    _verl_rules(plan, 4, {"actor": 1, "critic": 2}, [])


def test_plan_satisfies_verls_rules_on_random_steps():
    import random

    rng = random.Random(0)
    for _ in range(500):
        dp = rng.choice([1, 2, 4, 8])
        n = rng.choice([1, 4, 8])
        mini = rng.choice([1, 2, 4]) * dp * n
        sessions = rng.randint(1, 8) * mini - rng.randint(0, n)
        sessions = max(sessions, 1)
        rows = sessions * rng.randint(1, 20) + rng.randint(0, 7)
        micro = {"actor": rng.choice([1, 2, 4])}
        forward = [rng.choice([1, 2, 3])]
        plan = plan_mini_batches(rows, sessions, {"actor": mini}, dp, micro, forward)
        merged_rows = -(-sessions // math.lcm(dp, mini)) * math.lcm(dp, mini)
        assert plan.updates["actor"] == merged_rows // mini
        _verl_rules(plan, dp, micro, forward)


@pytest.mark.parametrize(
    ("rows", "sessions", "sizes", "dp"),
    [(10, 0, {"actor": 4}, 1), (3, 4, {"actor": 4}, 1), (8, 4, {"actor": 0}, 1), (8, 4, {"actor": 4}, 0)],
)
def test_plan_rejects_bad_sizes(rows, sessions, sizes, dp):
    with pytest.raises(ValueError, match="plan_mini_batches"):
        plan_mini_batches(rows, sessions, sizes, dp_size=dp)


# ---- validation rows are tagged for the agent loop -------------------------------------------


def test_validation_batches_tag_every_row_and_keep_the_loader():
    import numpy as np

    raw = np.empty(3, dtype=object)
    raw[:] = [[{"role": "user", "content": str(i)}] for i in range(3)]
    loader = [{"raw_prompt": raw, "index": np.arange(3)}, {"raw_prompt": raw[:1], "index": np.arange(1)}]
    batches = ValidationBatches(loader)
    assert len(batches) == 2 and batches.loader is loader
    tagged = list(batches)
    assert [list(b[VALIDATE_KEY]) for b in tagged] == [[True, True, True], [True]]
    assert all(type(v) is bool for b in tagged for v in b[VALIDATE_KEY])  # Python bools, not numpy
    assert tagged[0][VALIDATE_KEY].dtype == object
    assert VALIDATE_KEY not in loader[0]  # the loader's own batches are not changed
    assert tagged[1]["index"] is loader[1]["index"]
    assert tag_validation_batch({"index": np.arange(2)})[VALIDATE_KEY].tolist() == [True, True]
