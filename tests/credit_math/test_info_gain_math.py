"""The ``info_gain`` estimator (InfoPO): hand-computed cases, the literal reference, properties,
the feedback masking and the information gain of a tiny real model.

Layout of the hand cases (rewards, group, tokens per action, gains; ``-``: no gain)::

    a0  R=1  group a  L=[1, 1]  IG=[0.3, -]
    a1  R=0  group a  L=[1, 1]  IG=[-,   -]
    b0  R=0  group b  L=[2, 2]  IG=[0.4, -]
    b1  R=0  group b  L=[1, 2]  IG=[0.1, -]

GRPO: group a has mean 0.5, Bessel std sqrt(0.5) = 0.70711, so A = +-0.5 / (0.70711 + 1e-6);
group b has all rewards 0: A = 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from verl_credit.batch_credit import compute_batch_credit
from verl_credit.config import CreditConfig, InfoGainConfig
from verl_credit.credit_math.info_gain import (
    compute_feedback_gain,
    compute_info_gain_advantage,
    compute_info_gain_advantage_reference,
    compute_intrinsic_token_rewards,
    compute_magnitude_ratio,
    compute_variance_gate,
    mask_feedback_tokens,
    normalize_intrinsic_rewards,
)
from verl_credit.estimators import get_estimator

SCORES = [1.0, 0.0, 0.0, 0.0]
UIDS = ["a", "a", "b", "b"]
LENGTHS = [[1, 1], [1, 1], [2, 2], [1, 2]]
GAINS = [[0.3, None], [None, None], [0.4, None], [0.1, None]]
A = 0.5 / (math.sqrt(0.5) + 1e-6)  # 0.70711 (group a)
GATE_A = 1.0 / (1.0 + math.exp(math.sqrt(0.5) / 0.05))  # sigmoid(-0.70711 / 0.05) = 7.2e-7
GATE_B = 0.5  # sigmoid(0): group b's rewards are all equal


def _credit(gains=GAINS, **info):
    config = CreditConfig(estimator="info_gain", info_gain=InfoGainConfig(**info))
    return compute_batch_credit(torch.tensor(SCORES), UIDS, LENGTHS, config, information_gains=gains)


def test_hand_case_normalized() -> None:
    """Token rewards r = IG / L: a0 0.3 (1 token), b0 0.2 (2 tokens), b1 0.1 (1 token).
    Group b's non-zero tokens {0.2, 0.2, 0.1}: mean 0.5/3 = 0.16667, deviations (1/30, 1/30, -2/30),
    Bessel var (1 + 1 + 4)/900 / 2 = 1/300, std 0.057735 -> Ahat(b0) = (1/30)/0.057735 = 0.57735,
    Ahat(b1) = -1.1547. Group a has one token: mean = 0.3, std = 1 -> Ahat(a0) = 0.
    Ratio: the batch has 11 tokens; outcome tokens 2 x A, 2 x -A, 7 x 0 -> std sqrt(4 A^2 / 10) =
    0.44721, so the target is max(0.44721, 1) = 1; intrinsic tokens 2 x 0.57735, 1 x -1.1547, 8 x 0
    -> mean 0, std sqrt((2/3 + 4/3) / 10) = 0.44721 -> rho = min(1, 1 / 0.44721) = 1.
    A(b0, 0) = 0 + 0.1 * 0.5 * 1 * 0.57735 = 0.028868; A(b1, 0) = -0.057735; the rest is GRPO."""
    credit = _credit()
    std_b = math.sqrt((2 * (1 / 30) ** 2 + (2 / 30) ** 2) / 2)
    ahat_b0, ahat_b1 = (1 / 30) / (std_b + 1e-6), (-2 / 30) / (std_b + 1e-6)
    assert ahat_b0 == pytest.approx(0.57735, abs=1e-5) and ahat_b1 == pytest.approx(-1.1547, abs=1e-4)
    expected = [
        [A + 0.1 * GATE_A * 1.0 * 0.0, A],
        [-A, -A],
        [0.1 * GATE_B * 1.0 * ahat_b0, 0.0],
        [0.1 * GATE_B * 1.0 * ahat_b1, 0.0],
    ]
    assert credit.additive
    assert torch.allclose(
        credit.action_advantage.to(torch.float64), torch.tensor(expected, dtype=torch.float64), atol=1e-6
    )
    assert credit.action_advantage[2, 0] == pytest.approx(0.028868, abs=1e-6)
    assert float(credit.extras["information_gain_ratio"][0, 0]) == 1.0
    assert credit.extras["information_gain_gate"][:, 0].tolist() == pytest.approx([GATE_A, GATE_A, 0.5, 0.5])


def test_hand_case_raw_gains_shrunk_by_the_magnitude_ratio() -> None:
    """normalize=false, gains x100 in group b: token rewards b0 20 (x2), b1 10, a0 0.3, 7 zeros.
    Mean 50.3 / 11 = 4.5727; sum of squares 800 + 100 + 0.09 = 900.09; Bessel var
    (900.09 - 11 * 4.5727^2) / 10 = 67.008 -> std 8.1859; rho = 1 / 8.1859 = 0.12216.
    A(b0, 0) = 0.1 * 0.5 * 0.12216 * 20 = 0.12216; A(b1, 0) = 0.061081."""
    gains = [[0.3, None], [None, None], [40.0, None], [10.0, None]]
    credit = _credit(gains, normalize=False)
    tokens = [20.0, 20.0, 10.0, 0.3] + [0.0] * 7
    mean = sum(tokens) / 11
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 10)
    rho = 1.0 / (std + 1e-6)
    assert rho == pytest.approx(0.12216, abs=1e-5)
    assert float(credit.extras["information_gain_ratio"][0, 0]) == pytest.approx(rho, rel=1e-12)
    assert float(credit.action_advantage[2, 0]) == pytest.approx(0.1 * 0.5 * rho * 20, rel=1e-6)
    assert float(credit.action_advantage[3, 0]) == pytest.approx(0.1 * 0.5 * rho * 10, rel=1e-6)
    assert float(credit.action_advantage[0, 0]) == pytest.approx(A + 0.1 * GATE_A * rho * 0.3, rel=1e-6)


def test_dr_grpo_only_centres_the_gains() -> None:
    """norm_adv_by_std_in_grpo=false: Ahat = r - mean of the group (b0: 0.2 - 1/6 = 1/30), and
    GRPO's A is not divided either (group a: +-0.5)."""
    config = CreditConfig(estimator="info_gain", norm_adv_by_std_in_grpo=False)
    credit = compute_batch_credit(torch.tensor(SCORES), UIDS, LENGTHS, config, information_gains=GAINS)
    # intrinsic tokens 2 x 1/30, 1 x -2/30: std sqrt((2/900 + 4/900) / 10) = 0.02582 -> rho = 1
    assert float(credit.action_advantage[2, 0]) == pytest.approx(0.1 * 0.5 * (1 / 30), rel=1e-6)
    assert float(credit.action_advantage[3, 0]) == pytest.approx(0.1 * 0.5 * (-2 / 30), rel=1e-6)
    assert float(credit.action_advantage[0, 1]) == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize(("seed", "norm_by_std", "normalize"), [(0, True, True), (1, False, True), (2, True, False)])
def test_reference_equals_batched(seed: int, norm_by_std: bool, normalize: bool) -> None:
    """Random batches: the per-token literal transcription and the batched tensors agree."""
    generator = torch.Generator().manual_seed(seed)
    rows = 9
    counts = torch.randint(1, 5, (rows,), generator=generator).tolist()
    lengths = [torch.randint(0, 5, (n,), generator=generator).tolist() for n in counts]
    gains = [
        [
            float(torch.randn((), generator=generator)) if bool(torch.rand((), generator=generator) < 0.6) else None
            for _ in range(n)
        ]
        for n in counts
    ]
    uids = [f"g{r % 3}" for r in range(rows)]
    scores = torch.randint(0, 2, (rows,), generator=generator).to(torch.float32)
    config = CreditConfig(
        estimator="info_gain",
        norm_adv_by_std_in_grpo=norm_by_std,
        info_gain=InfoGainConfig(weight=0.7, gate_temperature=0.3, normalize=normalize),
    )
    credit = compute_batch_credit(scores, uids, lengths, config, information_gains=gains)
    from verl_credit.credit_math.grpo import compute_group_statistics

    _, std = compute_group_statistics(scores.to(torch.float64), uids)
    reference = compute_info_gain_advantage_reference(
        credit.trajectory_advantage.to(torch.float64).tolist(),
        gains,
        lengths,
        uids,
        std.tolist(),
        weight=0.7,
        gate_temperature=0.3,
        norm_by_std=norm_by_std,
        normalize=normalize,
    )
    for row in range(rows):
        got = credit.action_advantage[row, : counts[row]].to(torch.float64).tolist()
        assert got == pytest.approx(reference[row], rel=1e-5, abs=1e-6), row
    assert int(credit.extras["has_information_gain"].sum()) == sum(g is not None for r in gains for g in r)


@pytest.mark.parametrize("case", ["no_gains", "weight_zero", "no_field"])
def test_without_a_gain_signal_the_advantage_is_grpos(case: str) -> None:
    """No gains, weight 0, or no ``information_gains`` at all: exactly GRPO's token values."""
    grpo = compute_batch_credit(torch.tensor(SCORES), UIDS, LENGTHS, CreditConfig(estimator="grpo"))
    if case == "no_gains":
        credit = _credit([[None, None]] * 4)
    elif case == "weight_zero":
        credit = _credit(weight=0.0)
    else:
        credit = _credit(None)
    expected = grpo.trajectory_advantage.unsqueeze(-1).expand(4, 2).to(credit.action_advantage.dtype)
    assert torch.equal(credit.action_advantage, expected)


def test_gate_and_ratio_pieces() -> None:
    gate = compute_variance_gate(torch.tensor([0.0, 1.0]), 0.05)
    assert gate.tolist() == pytest.approx([0.5, 1.0 / (1.0 + math.exp(20.0))])
    with pytest.raises(ValueError, match="temperature"):
        compute_variance_gate(torch.tensor([0.0]), 0.0)
    # one token: no std (torch.std would be NaN) -> rho = min(1, 1 / eps) = 1
    ratio = compute_magnitude_ratio(torch.tensor([2.0]), torch.tensor([[5.0]]), torch.tensor([[1.0]]))
    assert float(ratio) == 1.0
    rewards = compute_intrinsic_token_rewards(
        torch.tensor([[0.6, 0.5, 7.0]]), torch.tensor([[True, True, False]]), torch.tensor([[3.0, 0.0, 2.0]])
    )
    assert rewards[0].tolist() == pytest.approx([0.2, 0.0, 0.0])  # no tokens, or no gain: 0
    # one group, one token with a gain: centred on itself -> 0
    alone = normalize_intrinsic_rewards(torch.tensor([[0.2, 0.0]]), torch.tensor([[1.0, 4.0]]), torch.tensor([0]))
    assert alone.tolist() == [[0.0, 0.0]]


def test_padding_actions_get_nothing() -> None:
    advantage, parts = compute_info_gain_advantage(
        torch.tensor([1.0]),
        torch.tensor([[0.5, 9.0]], dtype=torch.float64),
        torch.tensor([[True, True]]),
        torch.tensor([[2.0, 3.0]]),
        torch.tensor([[True, False]]),
        torch.tensor([0]),
        torch.tensor([1.0]),
    )
    assert advantage[0, 1] == 0.0 and parts.rewards[0, 1] == 0.0


def test_feedback_masking_follows_the_placeholder_rule() -> None:
    """Same length always: a shorter placeholder repeats its last token, a longer one is cut."""
    ids = torch.arange(10)
    assert mask_feedback_tokens(ids, 3, 8, [91, 92]).tolist() == [0, 1, 2, 91, 92, 92, 92, 92, 8, 9]
    assert mask_feedback_tokens(ids, 3, 5, [91, 92, 93]).tolist() == [0, 1, 2, 91, 92, 5, 6, 7, 8, 9]
    assert mask_feedback_tokens(ids, 2, 2, [91]).tolist() == ids.tolist()
    assert ids.tolist() == list(range(10))  # the input is not modified
    with pytest.raises(ValueError, match="outside"):
        mask_feedback_tokens(ids, 8, 11, [1])
    with pytest.raises(ValueError, match="no tokens"):
        mask_feedback_tokens(ids, 1, 2, [])


def test_feedback_gain_by_hand() -> None:
    """Two pairs: (-1 - -3 + -2 - -2) / 2 = 1.0 over the masked tokens; a pair without tokens: 0."""
    with_feedback = torch.tensor([[-1.0, -2.0, -9.0], [-1.0, -1.0, -1.0]])
    without = torch.tensor([[-3.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    assert compute_feedback_gain(with_feedback, without, mask).tolist() == [1.0, 0.0]


@pytest.fixture(scope="module")
def tiny_lm():
    """A random 2-layer Qwen2 from a config (nothing downloaded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(config).eval()


def _token_log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """verl's layout: value t = log p(token t + 1 | tokens <= t); the last position 0."""
    with torch.no_grad():
        logits = model(ids.unsqueeze(0)).logits[0].to(torch.float64)
    values = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
    return torch.cat([values, values.new_zeros(1)])


def test_information_gain_of_a_tiny_model(tiny_lm) -> None:
    """prompt | a0 | feedback | a1 | feedback' | a2. The gain of a0 is the mean over a1's tokens of
    the log-prob difference with and without a0's feedback (computed here token by token); masking
    a0's feedback leaves every log-prob before it unchanged (a causal model), so the same
    computation on a0's own tokens gives exactly 0; a placeholder equal to the feedback gives 0."""
    ids = torch.tensor([1, 2, 3, 10, 11, 12, 20, 21, 22, 23, 30, 31, 40, 41])
    a0, feedback, a1 = (3, 6), (6, 9), (9, 12)
    placeholder = [50, 51]
    masked = mask_feedback_tokens(ids, *feedback, placeholder)
    assert masked[6:9].tolist() == [50, 51, 51]
    lp_with, lp_without = _token_log_probs(tiny_lm, ids), _token_log_probs(tiny_lm, masked)
    # verl's value t predicts token t + 1: a1's tokens 9..11 are predicted at positions 8..10
    by_hand = sum(float(lp_with[t - 1] - lp_without[t - 1]) for t in range(*a1)) / 3
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[a1[0] - 1 : a1[1] - 1] = True
    gain = compute_feedback_gain(lp_with.unsqueeze(0), lp_without.unsqueeze(0), mask.unsqueeze(0))
    assert float(gain) == pytest.approx(by_hand, rel=1e-12) and abs(float(gain)) > 1e-6
    before = torch.zeros_like(mask)
    before[a0[0] - 1 : a0[1] - 1] = True
    assert float(compute_feedback_gain(lp_with[None], lp_without[None], before[None])) == 0.0
    same = mask_feedback_tokens(ids, *feedback, ids[6:9].tolist())
    assert float(compute_feedback_gain(lp_with[None], _token_log_probs(tiny_lm, same)[None], mask[None])) == 0.0


def test_registered_with_its_needs_and_settings() -> None:
    estimator = get_estimator("info_gain")
    assert estimator.needs == {"information_gains"} and estimator.couples_groups
    assert InfoGainConfig() == InfoGainConfig(0.1, 0.05, True, "No information found.", 1e-6)
    config = CreditConfig.from_mapping({"estimator": "info_gain", "info_gain": {"weight": 0.3, "normalize": False}})
    assert config.info_gain.weight == 0.3 and config.info_gain.normalize is False


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"weight": -0.1}, "credit.info_gain.weight"),
        ({"weight": "0.1"}, "credit.info_gain.weight"),
        ({"gate_temperature": 0.0}, "credit.info_gain.gate_temperature"),
        ({"normalize": "false"}, "credit.info_gain.normalize"),
        ({"placeholder": ""}, "credit.info_gain.placeholder"),
        ({"placeholder": "   "}, "credit.info_gain.placeholder"),
        ({"eps": 0.0}, "credit.info_gain.eps"),
        ({"bogus": 1}, "credit.info_gain.bogus"),
    ],
)
def test_bad_settings_name_the_key(values: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        CreditConfig.from_mapping({"estimator": "info_gain", "info_gain": values})
