"""A tiny GRU language-model policy over :data:`~verl_credit.bench.token_vocab.VOCAB`.

One set of parameters writes every token of every action (tool names, argument pointers,
replies), conditioned on the whole token stream so far -- the property of an LLM policy that the
macro-action benchmark lacks. Structural input-only tokens (``<pad>``, ``<act>``, ...) are masked
out of the output distribution.

:func:`sample_episodes` plays a batch of episodes in lockstep: every tick feeds one token per
running episode (the next observation token, or the token it just wrote) through one batched GRU
step, so a batch costs about (longest episode) GRU steps instead of (sum of lengths).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from verl_credit.bench.token_episode import TokenEpisode, TokenEpisodeRunner
from verl_credit.bench.token_vocab import STRUCTURAL, VOCAB

__all__ = ["TokenPolicy", "pad_batch", "sample_episodes", "sequence_log_probs"]


class TokenPolicy(nn.Module):
    """Embedding -> GRU -> linear head over the vocabulary."""

    def __init__(self, hidden: int = 64, embedding: int = 32):
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), embedding)
        self.gru = nn.GRU(embedding, hidden, batch_first=True)
        self.head = nn.Linear(hidden, len(VOCAB))
        mask = torch.zeros(len(VOCAB))
        mask[VOCAB.encode(STRUCTURAL)] = -1e9  # finite: 0 * log p stays 0 on masked targets
        self.register_buffer("output_mask", mask)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens (B, L)`` int64, ``state (1, B, H)`` or None -> ``(logits (B, L, V), state (1, B, H))``."""
        output, state = self.gru(self.embed(tokens), state)
        return self.head(output) + self.output_mask, state


def pad_batch(episodes: Sequence[TokenEpisode]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens (B, N), written (B, N) bool, action (B, N) int64)`` padded with ``<pad>`` / False / -1,
    ``N`` = the longest stream."""
    width = max(len(e.tokens) for e in episodes)
    tokens = torch.zeros((len(episodes), width), dtype=torch.long)
    action = torch.full((len(episodes), width), -1, dtype=torch.long)
    for row, episode in enumerate(episodes):
        tokens[row, : len(episode.tokens)] = torch.tensor(episode.tokens)
        action[row, : len(episode.action_of)] = torch.tensor(episode.action_of)
    return tokens, action >= 0, action


def sequence_log_probs(policy: TokenPolicy, tokens: torch.Tensor) -> torch.Tensor:
    """``log pi(x_{t+1} | x_<=t)`` for ``tokens (B, N)`` -> ``(B, N - 1)`` (teacher forcing)."""
    logits, _ = policy(tokens[:, :-1])
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample_episodes(
    policy: TokenPolicy,
    specs: Sequence[Mapping[str, Any]],
    generator: torch.Generator,
    max_action_tokens: int = 32,
    expert: Callable[[TokenEpisodeRunner], Sequence[str] | None] | None = None,
) -> list[TokenEpisode]:
    """Play one episode per task spec with ``policy`` sampling every written token (temperature 1).

    ``expert`` (mixed rollouts for DAgger-style cloning): asked at the start of every action;
    when it returns an action's words, those are written instead of sampling (recorded in
    ``TokenEpisode.expert_actions``), when it returns None the policy writes.
    """
    runners = [TokenEpisodeRunner(spec, max_action_tokens) for spec in specs]
    hidden = policy.gru.hidden_size
    state = torch.zeros((1, len(runners), hidden))
    fed = [0] * len(runners)  # tokens of each stream already fed to the GRU
    active = list(range(len(runners)))
    while active:
        inputs = torch.tensor([[runners[i].tokens[fed[i]]] for i in active])
        logits, new_state = policy(inputs, state[:, active])
        state[:, active] = new_state
        for i in active:
            fed[i] += 1
        # an episode writes when its stream is fully fed (last input: <act> or its own token)
        writing = [k for k, i in enumerate(active) if fed[i] == len(runners[i].tokens)]
        if expert is not None:  # at an action's first token the expert may write the whole action
            sampled = []
            for k in writing:
                runner = runners[active[k]]
                words = expert(runner) if runner.written == 0 else None
                if words is None:
                    sampled.append(k)
                else:
                    runner.write_expert(words)
            writing = sampled
        if writing:
            # inverse-CDF sampling (one uniform per written token; cheaper than torch.multinomial)
            cumulative = torch.softmax(logits[writing, -1].double(), dim=-1).cumsum(-1)
            uniform = torch.rand((len(writing), 1), generator=generator, dtype=torch.float64) * cumulative[:, -1:]
            drawn = (cumulative < uniform).sum(-1).clamp_max(cumulative.shape[1] - 1).tolist()
            for k, token in zip(writing, drawn, strict=True):
                runner = runners[active[k]]
                if runner.write(token):
                    runner.step()
        active = [i for i in active if not runners[i].done]
    return [runner.finish() for runner in runners]
