"""Fast tests of the token-level learning benchmark (verl_credit/bench/token_policy*.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from verl_credit.bench.token_episode import run_token_episode, scripted_chooser
from verl_credit.bench.token_policy import (
    TokenBenchConfig,
    TokenCreditMap,
    behaviour_clone,
    scripted_episodes,
    token_advantages,
    written_nll,
)
from verl_credit.bench.token_policy_model import TokenPolicy, pad_batch, sample_episodes
from verl_credit.bench.token_vocab import EOS, VOCAB, macro_tokens, render_action
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


def test_behaviour_cloning_improves_likelihood() -> None:
    config = dataclasses.replace(TokenBenchConfig(), bc_episodes=64, bc_epochs=8, bc_keep_failures=1.0)
    held_out = scripted_episodes("delayed", 8, seed=3)
    torch.manual_seed(0)
    before = written_nll(TokenPolicy(config.hidden, config.embedding), held_out)
    policy = TokenPolicy(config.hidden, config.embedding)
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


@pytest.mark.parametrize("arm", ["grpo", "iapo", "call_credit", "gigpo", "oracle"])
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
    if arm in ("grpo", "iapo", "call_credit", "oracle"):  # multiplicative: token mass = A_tau * L
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
    policy = TokenPolicy()
    episodes = sample_episodes(policy, [{"variant": "delayed", "seed": s} for s in range(3)], torch.Generator())
    for episode in episodes:
        assert len(episode.tokens) == len(episode.action_of)
        assert sum(episode.action_lengths) == sum(1 for a in episode.action_of if a >= 0)
        assert episode.num_actions == len([m for m in episode.messages if m["role"] == "assistant"])


def test_quick_end_to_end_final_line(tmp_path, capsys) -> None:
    from verl_credit.bench.token_policy_main import main

    code = main(
        ["--quick", "--diagnostic-batches", "1", "--out", str(tmp_path), "--plot", str(tmp_path / "curves.png")]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(
        r"token policy: iapo/grpo rollouts-to-90% ratio \(delayed-use\): (\d+\.\d\d|inf|nan) \(p = (\d\.\d\d|nan)\)",
        lines[-1],
    )
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert (tmp_path / "results.json").exists()
