"""Rows -> sessions -> spans (pure bookkeeping; no TransferQueue)."""

from __future__ import annotations

import pytest
import torch

from verl_credit.verl.batch import build_span_tensors, group_sessions, session_lengths, session_spans, split_key


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
