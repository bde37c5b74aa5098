"""Fast tests of the token-level learning benchmark (verl_credit/bench/token_policy*.py)."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from verl_credit.bench.token_episode import run_token_episode, scripted_chooser
from verl_credit.bench.token_policy import (
    TokenBenchConfig,
    TokenCreditMap,
    behaviour_clone,
    expert_written_mask,
    mixed_episodes,
    new_policy,
    refund_accuracy,
    scripted_episodes,
    token_advantages,
    warm_start_key,
    written_nll,
)
from verl_credit.bench.token_policy_model import GRUTokenPolicy, TransformerTokenPolicy, pad_batch, sample_episodes
from verl_credit.bench.token_vocab import EOS, STRUCTURAL, VOCAB, macro_tokens, render_action
from verl_credit.envs.service.agent import MACROS, DialogueState, LinearSoftmaxPolicy, render_macro, run_episode
from verl_credit.envs.service.env import ServiceEpisode


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _state_with_order() -> DialogueState:
    state = DialogueState()
    state.observe_user("I'd like to return the item from order #W1234567 and get a refund.", 0)
    state.observe_user("Please refund it to my gift card.", 1)
    return state


def test_tokenizer_round_trip_of_actions() -> None:
    state = _state_with_order()
    for macro in MACROS:
        words = macro_tokens(macro, state)
        assert words[-1] == EOS
        ids = VOCAB.encode(words)
        assert VOCAB.ids["<unk>"] not in ids, (macro, words)
        assert VOCAB.decode(ids) == words
        ours = render_action(words[:-1], state, 3).message
        theirs = render_macro(macro, state, 3).message
        if "tool_calls" in theirs:
            assert ours["tool_calls"] == theirs["tool_calls"]
        else:
            assert ours["content"].lower() == theirs["content"].lower()  # the policy writes lower case


def test_scripted_agent_in_token_form_matches_run_episode() -> None:
    agent = LinearSoftmaxPolicy()
    for seed in range(12):
        spec = {"variant": "error_repair", "seed": seed}
        a = run_episode(ServiceEpisode(spec), lambda phi, turn, r=np.random.default_rng(seed): agent.sample(phi, r))
        b = run_token_episode(spec, scripted_chooser(agent, np.random.default_rng(seed)))
        assert (a.reward, a.causal, a.mistakes) == (b.reward, b.causal, b.mistakes)
        assert len(b.action_lengths) == len(a.macros) and min(b.action_lengths) >= 2


def test_refund_target_is_read_from_the_world() -> None:
    """A successful delayed episode refunded where the customer asked; a refund to the other
    method is flagged; exchange tasks have no refund target."""
    episodes = scripted_episodes("delayed", 48, seed=4)
    assert {e.refund_wanted for e in episodes} == {"original", "gift_card"}
    for episode in episodes:
        if episode.reward > 0:
            assert episode.refund_to_wanted is True
    wrong = [e for e in episodes if e.refund_to_wanted is False]
    assert wrong and all(e.reward == 0 for e in wrong)
    accuracy = refund_accuracy(episodes)
    hits = [e.refund_to_wanted for e in episodes if e.refund_wanted == "gift_card" and e.refund_to_wanted is not None]
    assert accuracy["gift_card"] == pytest.approx(sum(hits) / len(hits))


@pytest.mark.slow
def test_behaviour_cloning_improves_likelihood() -> None:
    config = dataclasses.replace(TokenBenchConfig(), bc_episodes=64, bc_epochs=8, bc_keep_failures=1.0)
    held_out = scripted_episodes("delayed", 8, seed=3)
    torch.manual_seed(0)
    before = written_nll(GRUTokenPolicy(config.hidden, config.embedding), held_out)
    policy = GRUTokenPolicy(config.hidden, config.embedding)
    policy.load_state_dict(behaviour_clone("delayed", config))
    after = written_nll(policy, held_out)
    assert after < 0.6 * before


def _batch(seed: int = 0) -> tuple[list, torch.Tensor, list[str]]:
    episodes = scripted_episodes("delayed", 8, seed=seed)
    uids = ["a"] * 4 + ["b"] * 4
    scores = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
    if float(scores[:4].std()) == 0 or float(scores[4:].std()) == 0:  # make both groups mixed
        scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    return episodes, scores, uids


@pytest.mark.parametrize("arm", ["grpo", "iapo", "call_credit", "gigpo", "oracle", "oracle_pos"])
def test_token_expansion_conserves_action_values(arm: str) -> None:
    from verl_credit.annotate.factory import build_annotator

    episodes, scores, uids = _batch()
    credit = TokenCreditMap(arm, build_annotator("rules") if arm == "iapo" else None).batch_credit(
        episodes, scores, uids
    )
    tokens, _, action = pad_batch(episodes)
    advantages = token_advantages(credit, episodes, tokens.shape[1] - 1)
    target_action = action[:, 1:]
    assert torch.all(advantages[target_action < 0] == 0)  # observation tokens carry nothing
    for row, episode in enumerate(episodes):
        for a in range(episode.num_actions):
            values = advantages[row][target_action[row] == a]
            assert values.numel() == episode.action_lengths[a]
            assert torch.allclose(values, credit.action_advantage[row, a].to(values.dtype).expand_as(values))
    if arm in ("grpo", "iapo", "call_credit", "oracle", "oracle_pos"):  # multiplicative: token mass = A_tau * L
        for row, episode in enumerate(episodes):
            expected = float(credit.trajectory_advantage[row]) * len([x for x in episode.action_of if x >= 0])
            assert float(advantages[row].sum()) == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_arms_differ_only_in_advantages() -> None:
    """Same batch: the grpo and oracle per-token advantages differ, the tokens and mask do not,
    and the grpo arm is the flat group-normalized advantage on every written token."""
    episodes, scores, uids = _batch(1)
    tokens, written, _ = pad_batch(episodes)
    flat = token_advantages(TokenCreditMap("grpo").batch_credit(episodes, scores, uids), episodes, tokens.shape[1] - 1)
    routed = token_advantages(
        TokenCreditMap("oracle").batch_credit(episodes, scores, uids), episodes, tokens.shape[1] - 1
    )
    mask = written[:, 1:]
    assert not torch.allclose(flat, routed)
    assert torch.all((flat != 0) <= mask) and torch.all((routed != 0) <= mask)
    a_tau = TokenCreditMap("grpo").batch_credit(episodes, scores, uids).trajectory_advantage
    assert torch.allclose(flat, a_tau.unsqueeze(1).expand_as(flat) * mask)


def test_sampled_episodes_are_consistent() -> None:
    torch.manual_seed(0)
    policy = GRUTokenPolicy()
    episodes = sample_episodes(policy, [{"variant": "delayed", "seed": s} for s in range(3)], torch.Generator())
    for episode in episodes:
        assert len(episode.tokens) == len(episode.action_of)
        assert sum(episode.action_lengths) == sum(1 for a in episode.action_of if a >= 0)
        assert episode.num_actions == len([m for m in episode.messages if m["role"] == "assistant"])


def test_mixed_rollouts_clone_only_the_experts_actions() -> None:
    """DAgger rollouts: the expert writes about ``expert_share`` of the actions (recorded per
    episode), the policy the rest; the cloning mask covers exactly the expert's written tokens,
    and a scripted episode's mask covers every written token."""
    torch.manual_seed(0)
    policy = GRUTokenPolicy()
    episodes = mixed_episodes(policy, "delayed", 16, 0.5, seed=1, generator=torch.Generator().manual_seed(1))
    expert_total = sum(len(e.expert_actions) for e in episodes)
    actions_total = sum(e.num_actions for e in episodes)
    assert 0.3 < expert_total / actions_total < 0.7
    tokens, written, action = pad_batch(episodes)
    mask = expert_written_mask(episodes, tokens.shape[1] - 1)
    for row, episode in enumerate(episodes):
        target_action = action[row, 1:]
        by_expert = torch.tensor([int(a) in episode.expert_actions for a in target_action.tolist()])
        assert torch.equal(mask[row].bool(), by_expert & (target_action >= 0))
    assert 0 < mask.sum() < written[:, 1:].sum()  # the random policy wrote some actions too
    scripted = scripted_episodes("delayed", 4, seed=2)
    tokens, written, _ = pad_batch(scripted)
    assert torch.equal(expert_written_mask(scripted, tokens.shape[1] - 1).bool(), written[:, 1:])


@pytest.mark.slow
def test_dagger_warm_start_is_deterministic_and_all_expert_rollouts_are_scripted() -> None:
    """The warm-start cache relies on cloning being deterministic; with expert_share 1 a mixed
    rollout is the scripted agent's own episode (every action the expert's)."""
    config = dataclasses.replace(
        TokenBenchConfig(), bc_episodes=32, bc_epochs=1, bc_dagger_rounds=1, bc_dagger_episodes=8, bc_dagger_epochs=1
    )
    first, second = behaviour_clone("delayed", config), behaviour_clone("delayed", config)
    assert all(torch.equal(first[k], second[k]) for k in first)
    policy = GRUTokenPolicy()
    for episode in mixed_episodes(policy, "delayed", 4, 1.0, seed=0, generator=torch.Generator()):
        assert episode.expert_actions == tuple(range(episode.num_actions))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gru", "transformer"])
def test_quick_end_to_end_final_line(model: str, tmp_path, capsys) -> None:
    from verl_credit.bench.token_policy_main import main

    code = main(
        [
            *("--quick", "--model", model, "--diagnostic-batches", "1"),
            *("--out", str(tmp_path), "--plot", str(tmp_path / "curves.png")),
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"warm start ({model}, delayed)" in lines[0]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"]["config"]["model"] == model
    assert re.fullmatch(
        r"token policy: iapo/grpo rollouts-to-90% ratio \(delayed-use\): (\d+\.\d\d|inf|nan) \(p = (\d\.\d\d|nan)\)",
        lines[-1],
    )
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert (tmp_path / "results.json").exists()


def test_transformer_decoding_matches_teacher_forcing() -> None:
    """Incremental decoding with the key/value cache (grown past its first capacity, a subset of
    streams still running) gives the logits of the full causal forward pass."""
    torch.manual_seed(0)
    policy = TransformerTokenPolicy(32, 2, 4).eval()
    tokens = torch.randint(len(STRUCTURAL), len(VOCAB), (3, 300))
    with torch.no_grad():
        full = policy(tokens)
        state = policy.init_state(3)
        for t in range(300):
            rows = [0, 1, 2] if t < 120 else [0, 2]  # stream 1 ends at 120: fed <pad> from then on
            logits = policy.step(tokens[rows, t], rows, state)
            assert torch.allclose(logits, full[rows, t], atol=1e-4), t
    assert state.keys[0].shape[2] >= 300


def test_both_models_are_causal_and_the_transformer_sees_far_back() -> None:
    """Changing a late token leaves earlier positions alone in both models (causality); changing
    token 5 still moves the transformer's logits at position 199 (attention reaches back; an
    untrained GRU's state has forgotten it to float precision by then, so it is not asserted)."""
    torch.manual_seed(0)
    for policy in (GRUTokenPolicy(), TransformerTokenPolicy(32, 2, 4)):
        tokens = torch.randint(len(STRUCTURAL), len(VOCAB), (1, 200))
        other = (tokens[0, 5] + 1 - len(STRUCTURAL)) % (len(VOCAB) - len(STRUCTURAL)) + len(STRUCTURAL)
        early, late = tokens.clone(), tokens.clone()
        early[0, 5] = other
        late[0, 150] = other
        with torch.no_grad():
            base, early_edit, late_edit = policy(tokens), policy(early), policy(late)
        assert torch.equal(base[0, :150], late_edit[0, :150])
        assert not torch.equal(base[0, 150:], late_edit[0, 150:])
        if isinstance(policy, TransformerTokenPolicy):
            assert float((base[0, 199] - early_edit[0, 199]).abs().max()) > 1e-4


def test_transformer_policy_samples_consistent_episodes_and_is_built_by_config() -> None:
    config = TokenBenchConfig(model="transformer", hidden=32)
    torch.manual_seed(0)
    policy = new_policy(config)
    assert isinstance(policy, TransformerTokenPolicy)
    episodes = sample_episodes(policy, [{"variant": "delayed", "seed": s} for s in range(3)], torch.Generator())
    for episode in episodes:
        assert len(episode.tokens) == len(episode.action_of)
        assert episode.num_actions == len([m for m in episode.messages if m["role"] == "assistant"])
    assert warm_start_key(config) != warm_start_key(TokenBenchConfig())
    with pytest.raises(ValueError, match="unknown model 'lstm'"):
        TokenBenchConfig(model="lstm")
    with pytest.raises(ValueError, match="multiple of heads"):
        TransformerTokenPolicy(30, 2, 4)
    with pytest.raises(ValueError, match="width 30 must be a multiple of heads 4"):
        TokenBenchConfig(model="transformer", hidden=30, heads=4)
