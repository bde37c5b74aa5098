"""Tiny language-model policies over :data:`~verl_credit.bench.token_vocab.VOCAB`: a GRU and a
causal transformer.

One set of parameters writes every token of every action (tool names, argument pointers,
replies), conditioned on the whole token stream so far -- the property of an LLM policy that the
macro-action benchmark lacks. Structural input-only tokens (``<pad>``, ``<act>``, ...) are masked
out of the output distribution.

The two models differ in memory: the GRU must carry what the customer said ~100 tokens earlier in
its state, the transformer attends back to it (how an LLM reads its context). Both expose
``forward(tokens)`` (teacher forcing), ``init_state(batch)`` and ``step(tokens, rows, state)``
(incremental decoding), which is all :func:`sample_episodes` and the trainer use.

:func:`sample_episodes` plays a batch of episodes in lockstep: every tick feeds one token per
running episode (the next observation token, or the token it just wrote) through one batched
step, so a batch costs about (longest episode) steps instead of (sum of lengths). Every running
episode has been fed the same number of tokens, so at tick ``t`` every fed token sits at stream
position ``t`` -- the transformer's key/value cache is one tensor indexed by tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from verl_credit.bench.token_episode import TokenEpisode, TokenEpisodeRunner
from verl_credit.bench.token_vocab import STRUCTURAL, VOCAB

__all__ = [
    "POLICY_MODELS",
    "GRUTokenPolicy",
    "TransformerTokenPolicy",
    "build_token_policy",
    "check_transformer_shape",
    "pad_batch",
    "sample_episodes",
    "sequence_log_probs",
]

POLICY_MODELS: tuple[str, ...] = ("gru", "transformer")


def _output_mask() -> torch.Tensor:
    """``(V,)``: 0, or -1e9 on structural input-only tokens (finite: 0 * log p stays 0 on masked targets)."""
    mask = torch.zeros(len(VOCAB))
    mask[VOCAB.encode(STRUCTURAL)] = -1e9
    return mask


class GRUTokenPolicy(nn.Module):
    """Embedding -> GRU -> linear head over the vocabulary."""

    def __init__(self, hidden: int = 64, embedding: int = 32):
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), embedding)
        self.gru = nn.GRU(embedding, hidden, batch_first=True)
        self.head = nn.Linear(hidden, len(VOCAB))
        self.register_buffer("output_mask", _output_mask())

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens (B, L)`` int64, ``state (1, B, H)`` or None -> ``logits (B, L, V)``."""
        output, _ = self.gru(self.embed(tokens), state)
        return self.head(output) + self.output_mask

    def init_state(self, batch: int) -> torch.Tensor:
        """The decoding state of ``batch`` empty streams: ``(1, B, H)`` zeros."""
        return torch.zeros((1, batch, self.gru.hidden_size))

    def step(self, tokens: torch.Tensor, rows: list[int], state: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens (R,)`` to streams ``rows`` (updating ``state`` in place) -> ``logits (R, V)``."""
        output, new_state = self.gru(self.embed(tokens).unsqueeze(1), state[:, rows])
        state[:, rows] = new_state
        return self.head(output[:, -1]) + self.output_mask


def _sinusoid(positions: torch.Tensor, width: int) -> torch.Tensor:
    """``positions (L,)`` -> ``(L, width)`` fixed sinusoidal position codes (no length limit)."""
    frequencies = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10_000.0) / width))
    angles = positions.float().unsqueeze(-1) * frequencies
    codes = torch.zeros((len(positions), width))
    codes[:, 0::2] = torch.sin(angles)
    codes[:, 1::2] = torch.cos(angles)
    return codes


class _Block(nn.Module):
    """Pre-norm causal self-attention + MLP (GPT-2's block, no dropout)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(B, L, W)`` -> query, key, value each ``(B, heads, L, W / heads)``."""
        batch, length, width = x.shape
        qkv = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, width // self.heads)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def _merge(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        batch, _, length, _ = attended.shape
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, -1))
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, L, W)`` -> ``(B, L, W)``, each position attending to itself and earlier ones."""
        query, key, value = self._split(x)
        return self._merge(x, functional.scaled_dot_product_attention(query, key, value, is_causal=True))

    def step(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: int) -> torch.Tensor:
        """One new position per stream: ``x (B, 1, W)``; ``keys, values (B, heads, capacity, W / heads)``
        caches, written at ``position`` -> ``(B, 1, W)``."""
        query, key, value = self._split(x)
        keys[:, :, position] = key[:, :, 0]
        values[:, :, position] = value[:, :, 0]
        attended = functional.scaled_dot_product_attention(
            query, keys[:, :, : position + 1], values[:, :, : position + 1]
        )
        return self._merge(x, attended)


class _Cache:
    """Key/value caches of every block for ``batch`` streams fed in lockstep (see the module doc)."""

    def __init__(self, layers: int, batch: int, heads: int, head_width: int, capacity: int = 256):
        self.keys = [torch.zeros((batch, heads, capacity, head_width)) for _ in range(layers)]
        self.values = [torch.zeros((batch, heads, capacity, head_width)) for _ in range(layers)]
        self.position = 0  # the stream position of the next fed token

    def reserve(self) -> None:
        """Double the capacity when the next position does not fit."""
        capacity = self.keys[0].shape[2]
        if self.position < capacity:
            return
        self.keys = [torch.cat([k, torch.zeros_like(k)], dim=2) for k in self.keys]
        self.values = [torch.cat([v, torch.zeros_like(v)], dim=2) for v in self.values]


def check_transformer_shape(width: int, layers: int, heads: int) -> None:
    """Raise ``ValueError`` unless ``width`` splits into ``heads`` heads of an even width and ``layers >= 1``."""
    if layers < 1 or heads < 1 or width % heads or (width // heads) % 2:
        raise ValueError(
            f"transformer width {width} must be a multiple of heads {heads} with an even head width,"
            f" and layers {layers} >= 1"
        )


class TransformerTokenPolicy(nn.Module):
    """Embedding + sinusoidal positions -> ``layers`` pre-norm causal transformer blocks -> linear head."""

    def __init__(self, width: int = 64, layers: int = 2, heads: int = 2):
        super().__init__()
        check_transformer_shape(width, layers, heads)
        self.width, self.heads = width, heads
        self.embed = nn.Embedding(len(VOCAB), width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(VOCAB))
        self.register_buffer("output_mask", _output_mask())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens (B, L)`` int64 -> ``logits (B, L, V)`` (position ``l`` sees tokens ``0..l``)."""
        x = self.embed(tokens) + _sinusoid(torch.arange(tokens.shape[1]), self.width)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)) + self.output_mask

    def init_state(self, batch: int) -> _Cache:
        """Empty key/value caches for ``batch`` streams."""
        return _Cache(len(self.blocks), batch, self.heads, self.width // self.heads)

    def step(self, tokens: torch.Tensor, rows: list[int], state: _Cache) -> torch.Tensor:
        """Feed ``tokens (R,)`` to streams ``rows`` at the shared position ``state.position`` -> ``logits (R, V)``.

        Finished streams are fed ``<pad>`` (their cache is never read again): every row is
        computed so the caches are sliced, not gathered, each tick.
        """
        state.reserve()
        batch = state.keys[0].shape[0]
        full = torch.zeros(batch, dtype=torch.long)  # <pad> is token 0
        full[rows] = tokens
        x = self.embed(full).unsqueeze(1) + _sinusoid(torch.tensor([state.position]), self.width)
        for block, keys, values in zip(self.blocks, state.keys, state.values, strict=True):
            x = block.step(x, keys, values, state.position)
        state.position += 1
        return self.head(self.norm(x[rows, -1])) + self.output_mask


def build_token_policy(model: str, hidden: int, embedding: int, layers: int = 2, heads: int = 2) -> nn.Module:
    """``"gru"``: :class:`GRUTokenPolicy` (``hidden``, ``embedding``); ``"transformer"``:
    :class:`TransformerTokenPolicy` (width ``hidden``, ``layers``, ``heads``)."""
    if model == "gru":
        return GRUTokenPolicy(hidden, embedding)
    if model == "transformer":
        return TransformerTokenPolicy(hidden, layers, heads)
    raise ValueError(f"unknown policy model {model!r}; models: {POLICY_MODELS}")


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


def sequence_log_probs(policy: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``log pi(x_{t+1} | x_<=t)`` for ``tokens (B, N)`` -> ``(B, N - 1)`` (teacher forcing)."""
    logits = policy(tokens[:, :-1])
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample_episodes(
    policy: nn.Module,
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
    state = policy.init_state(len(runners))
    fed = [0] * len(runners)  # tokens of each stream already fed to the policy
    active = list(range(len(runners)))
    while active:
        inputs = torch.tensor([runners[i].tokens[fed[i]] for i in active])
        logits = policy.step(inputs, active, state)
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
            cumulative = torch.softmax(logits[writing].double(), dim=-1).cumsum(-1)
            uniform = torch.rand((len(writing), 1), generator=generator, dtype=torch.float64) * cumulative[:, -1:]
            drawn = (cumulative < uniform).sum(-1).clamp_max(cumulative.shape[1] - 1).tolist()
            for k, token in zip(writing, drawn, strict=True):
                runner = runners[active[k]]
                if runner.write(token):
                    runner.step()
        active = [i for i in active if not runners[i].done]
    return [runner.finish() for runner in runners]
