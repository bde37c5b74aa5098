"""The bookkeeping of the ``info_gain`` trainer step (``verl_credit.verl.info_gain_step``) on hand-built
rows: where the feedback is (merged and per_request layouts), the masked rows sent to the actor,
the gains put into the payloads. The TransferQueue + actor path is in tests/verl/test_info_gain_trainer.py."""

from __future__ import annotations

import pytest
import torch

from verl_credit.batch_credit import compute_batch_credit
from verl_credit.config import CreditConfig
from verl_credit.verl.info_gain_step import (
    FeedbackPair,
    InformationGains,
    attach_information_gains,
    build_variant_rows,
    find_feedback_pairs,
    generation_prompt_ids,
    info_gain_credit_metrics,
)

OPENER = [7, 8]  # the generation prompt ("<|im_start|>assistant\n")
#: prompt 1 2 3 | a0: 11 12 | feedback 21 22, opener 7 8 | a1: 13 14
MERGED = torch.tensor([1, 2, 3, 11, 12, 21, 22, 7, 8, 13, 14])


def test_merged_row_feedback_is_the_gap_without_the_opener() -> None:
    pairs, unmatched = find_feedback_pairs([{0: [(0, 0, 2), (1, 6, 8)]}], {0: 3}, {0: MERGED}, OPENER)
    assert unmatched == 0
    assert pairs == [FeedbackPair(session=0, action=0, row=0, start=5, end=7, next_spans=((6, 8),), cut=8)]
    assert MERGED[5:7].tolist() == [21, 22]
    # without a known opener the whole gap is the feedback
    pairs, _ = find_feedback_pairs([{0: [(0, 0, 2), (1, 6, 8)]}], {0: 3}, {0: MERGED})
    assert (pairs[0].start, pairs[0].end) == (5, 9)


def test_per_request_rows_find_the_feedback_in_the_next_prompt() -> None:
    """Row 0: prompt 1 2 3, response a0; row 1: prompt = row 0 + feedback + opener, response a1."""
    row0 = torch.tensor([1, 2, 3, 11, 12])
    row1 = torch.tensor([1, 2, 3, 11, 12, 21, 22, 7, 8, 13, 14])
    spans = [{0: [(0, 0, 2)], 1: [(1, 0, 2)]}]
    pairs, unmatched = find_feedback_pairs(spans, {0: 3, 1: 9}, {0: row0, 1: row1}, OPENER)
    assert unmatched == 0
    assert pairs == [FeedbackPair(session=0, action=0, row=1, start=5, end=7, next_spans=((0, 2),), cut=2)]
    # a re-tokenized history (row 0 is no prefix of row 1): the feedback cannot be located, counted
    changed = row1.clone()
    changed[3] = 99
    pairs, unmatched = find_feedback_pairs(spans, {0: 3, 1: 9}, {0: row0, 1: changed}, OPENER)
    assert pairs == [] and unmatched == 1


def test_no_pair_without_feedback_or_next_action() -> None:
    # two actions separated only by the opener (no feedback), and a last action: nothing to measure
    ids = torch.tensor([1, 11, 7, 8, 12])
    pairs, unmatched = find_feedback_pairs([{0: [(0, 0, 1), (1, 3, 4)]}], {0: 1}, {0: ids}, OPENER)
    assert pairs == [] and unmatched == 0
    pairs, unmatched = find_feedback_pairs([{0: [(0, 0, 2)]}], {0: 3}, {0: MERGED[:5]}, OPENER)
    assert pairs == [] and unmatched == 0


def test_variant_rows_mask_the_feedback_and_stop_after_the_next_action() -> None:
    """merged, one more action after a1 (cut away); per_request (the masked tokens are in the prompt)."""
    merged = torch.cat([MERGED, torch.tensor([31, 32, 15])])
    mask = torch.tensor([1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1])
    pair = FeedbackPair(0, 0, 0, 5, 7, ((6, 8),), 8)
    (row,) = build_variant_rows([pair], {0: 3}, {0: merged}, {0: torch.arange(14)}, {0: mask}, [91, 92, 93])
    assert row["input_ids"].tolist() == [1, 2, 3, 11, 12, 91, 92, 7, 8, 13, 14]
    assert row["prompts"].tolist() == [1, 2, 3] and row["responses"].tolist() == [11, 12, 91, 92, 7, 8, 13, 14]
    assert row["response_mask"].tolist() == [1, 1, 0, 0, 0, 0, 1, 1] == row["loss_mask"].tolist()
    assert row["position_ids"].tolist() == list(range(11))
    assert merged[5:7].tolist() == [21, 22]  # the batch's own tokens are untouched
    (unmasked,) = build_variant_rows([pair], {0: 3}, {0: merged}, {0: torch.arange(14)}, {0: mask}, None)
    assert unmasked["input_ids"].tolist() == merged[:11].tolist()

    per_request = FeedbackPair(0, 0, 1, 5, 7, ((0, 2),), 2)
    ids = MERGED
    (row,) = build_variant_rows([per_request], {1: 9}, {1: ids}, {1: torch.arange(11)}, {1: torch.tensor([1, 1])}, [91])
    assert row["prompts"].tolist() == [1, 2, 3, 11, 12, 91, 91, 7, 8] and row["responses"].tolist() == [13, 14]


def test_gains_go_into_each_sessions_final_payload() -> None:
    keys = ["u_0_0", "u_0_1", "u_1_0", "pad_0_0"]
    tags = [{}, {}, {}, {"is_padding": True}]
    extras = [
        {"credit": {"spans": [[0, 0, 2]]}},
        {"credit": {"spans": [[1, 0, 2]], "num_actions": 3}},
        {"credit": {"spans": [[0, 0, 2]], "num_actions": 1}},
        None,
    ]
    gains = InformationGains(by_session={"u_0": [0.25, None], "u_1": [None]})
    assert attach_information_gains(keys, tags, ["u", "u", "u", "pad"], extras, gains) == 2
    assert extras[1]["credit"]["information_gains"] == [0.25, None, None]  # the payload's 3 actions
    assert "information_gains" not in extras[0]["credit"]  # not the session's final row
    assert extras[2]["credit"]["information_gains"] == [None]


class _Template:
    """A tokenizer stub: ``apply_chat_template`` renders a prefix and, on request, the opener."""

    def __init__(self, opener: list[int], fail: bool = False, mapping: bool = False):
        self.opener = opener
        self.fail = fail
        self.mapping = mapping

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict=True, **kwargs):
        if self.fail:
            raise ValueError("no chat template")
        ids = [1, 2, 3] + (self.opener if add_generation_prompt else [])
        return {"input_ids": ids} if self.mapping else ids


def test_generation_prompt_is_what_the_template_appends() -> None:
    assert generation_prompt_ids(_Template([7, 8])) == [7, 8]
    assert generation_prompt_ids(_Template([])) == []
    assert generation_prompt_ids(_Template([7], fail=True)) == []
    assert generation_prompt_ids(_Template([7, 8], mapping=True)) == [7, 8]  # a BatchEncoding-like mapping


def test_step_metrics_of_the_estimator_terms() -> None:
    config = CreditConfig(estimator="info_gain")
    credit = compute_batch_credit(
        torch.tensor([0.0, 0.0]), ["g", "g"], [[2, 1], [1, 1]], config, information_gains=[[0.4, None], [0.1, None]]
    )
    metrics = info_gain_credit_metrics(credit.extras, credit.lengths)
    assert metrics["credit/info_gain_actions"] == 2.0
    assert metrics["credit/info_gain_gate_mean"] == pytest.approx(0.5)  # equal rewards: no GRPO signal
    assert metrics["credit/info_gain_ratio"] == 1.0
    bonus = credit.extras["information_gain_bonus"].abs()
    assert metrics["credit/info_gain_bonus_abs_mean"] == pytest.approx(float((bonus * credit.lengths).sum()) / 5)
    assert info_gain_credit_metrics({}, credit.lengths) == {}
    gains = InformationGains(by_session={"a": [0.5, None], "b": [-0.1]}, pairs=2, forward_tokens=30, batch_tokens=20)
    step = gains.metrics()
    assert step["credit/info_gain_mean"] == pytest.approx(0.2) and step["credit/info_gain_token_ratio"] == 1.5
