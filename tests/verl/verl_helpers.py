"""Helpers for the verl-integration tests (imported by the tests and by ``conftest.py``).

* :class:`TinyModelServer`: the agent loop's server manager. Every request runs the tiny model
  (``model.generate``); a request with a *plan* is constrained to the planned text (a logits
  processor that only allows the next planned token, the way guided decoding constrains a
  server), a request without a plan is decoded freely (greedy). Log-probs are the model's own
  (unconstrained) log-probs of the returned tokens.
* ``OrdersEnv`` (registered as ``test_orders``): a tiny scripted
  :class:`verl_credit.envs.base.Environment`.
* :func:`compose_credit_config` (the real Hydra config), :func:`run_session` (one
  ``credit_agent`` episode), :func:`put_session` (verl's own TransferQueue writer),
  :func:`batch_meta` (a batch as the trainer samples it, optionally with verl's padding rows).
* :class:`FixedGraphAnnotator` and friends: test annotators registered per test.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from verl_credit.annotate.base import AnnotationResult, Annotator
from verl_credit.graph import validate_graph


class _ForcePlan:
    """Logits processor: only the next planned token is allowed (constrained decoding)."""

    def __init__(self, plan: list[int], prompt_length: int):
        self.plan = plan
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_length
        allowed = torch.full_like(scores, float("-inf"))
        allowed[:, self.plan[min(step, len(self.plan) - 1)]] = 0.0
        return scores + allowed


class TinyModelServer:
    """Stands in for verl's LLM server manager: ``generate`` runs the tiny model for real.

    ``plans[k]`` is the text the k-th request *of a session* (verl keeps one ``request_id`` per
    session) is constrained to (``<|im_end|>`` appended), or ``None`` for free decoding of at
    most ``max_new_tokens`` tokens. ``calls`` records every request's session, prompt and tokens.
    """

    def __init__(self, model, tokenizer, plans: list[str | None], max_new_tokens: int = 6, do_sample: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.plans = list(plans)
        self.max_new_tokens = max_new_tokens
        self.do_sample = do_sample
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any):
        from transformers import LogitsProcessorList
        from verl.workers.rollout.replica import TokenOutput

        step = sum(1 for call in self.calls if call["request_id"] == request_id)
        plan = self.plans[step] if step < len(self.plans) else None
        eos = self.tokenizer.eos_token_id
        prompt = torch.tensor([prompt_ids])
        processors = LogitsProcessorList()
        if plan is not None:
            target = [*self.tokenizer.encode(plan, add_special_tokens=False), eos]
            processors.append(_ForcePlan(target, len(prompt_ids)))
            max_new = len(target)
        else:
            max_new = self.max_new_tokens
        with torch.no_grad():
            sequences = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new,
                do_sample=self.do_sample,
                logits_processor=processors,
                eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            tokens = sequences[0, len(prompt_ids) :].tolist()
            logits = self.model(sequences).logits[0, len(prompt_ids) - 1 : -1]
            log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "token_ids": tokens,
                "plan": plan,
                "time": time.perf_counter(),
            }
        )
        await asyncio.sleep(0)
        return TokenOutput(
            token_ids=tokens, log_probs=log_probs.tolist(), extra_fields={"min_global_steps": 1, "max_global_steps": 1}
        )


def register_test_env() -> type:
    from verl_credit.envs.base import (
        ENVIRONMENTS,
        Environment,
        EpisodeStart,
        ToolResult,
        UserTurn,
        register_environment,
    )

    if "test_orders" in ENVIRONMENTS:
        return ENVIRONMENTS["test_orders"]

    @register_environment("test_orders")
    class OrdersEnv(Environment):
        """One order lookup tool; the user replies from ``task["user_replies"]``; reward from task.
        ``shown`` collects every transcript the user was shown (class-wide, for tests)."""

        shown: ClassVar[list[list[dict[str, Any]]]] = []

        def __init__(self, greeting: str = "refund order #W12 please"):
            self.greeting = greeting
            self.task: Mapping[str, Any] = {}
            self.turns = 0
            self.tool_calls: list[tuple[str, dict]] = []
            self.closed = False

        async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
            self.task = task
            if "turn_rewards" in task:  # per-action rewards, as the service world's turn_rewards=true
                pending = iter(task["turn_rewards"])
                self.turn_reward = lambda: float(next(pending, 0.0))
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": "get_order",
                        "description": "Look up an order.",
                        "parameters": {
                            "type": "object",
                            "properties": {"order_id": {"type": "string", "description": "order id"}},
                            "required": ["order_id"],
                        },
                    },
                }
            ]
            return EpisodeStart("You are a support agent.", tools, self.greeting, {"task_id": task.get("task_id")})

        async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
            self.tool_calls.append((name, dict(arguments)))
            if arguments.get("order_id") != "#W12":
                return ToolResult("order not found", is_error=True)
            return ToolResult(json.dumps({"order_id": "#W12", "status": "delivered"}))

        async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
            OrdersEnv.shown.append([dict(m) for m in messages])
            replies = list(self.task.get("user_replies", []))
            if self.turns >= len(replies):
                return UserTurn(None, done=True)
            self.turns += 1
            return UserTurn(replies[self.turns - 1])

        async def reward(self) -> float:
            return float(self.task.get("reward", 0.0))

        async def close(self) -> None:
            self.closed = True

    return OrdersEnv


CONFIG_OVERRIDES = [
    "actor_rollout_ref.rollout.prompt_length=512",
    "actor_rollout_ref.rollout.response_length=256",
    "credit.env.name=test_orders",
]


def compose_credit_config(overrides: list[str] | None = None):
    """The real ``credit_trainer`` config composed through Hydra, plus overrides."""
    from hydra import compose, initialize_config_dir

    from verl_credit.verl.main import CONFIG_DIR, CONFIG_NAME

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides or []))


def make_agent_loop(config, server, tokenizer, hf_model_type: str = "qwen2"):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_credit.verl.agent_loop import CreditAgentLoop

    return CreditAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        hf_model_type=hf_model_type,
        tools=ToolListWrap([]),
    )


TOOL_PLAN = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W12"}}\n</tool_call>'
#: request plans of one session: a tool call, a free (model-sampled) turn, a closing text turn
DEFAULT_PLANS: list[str | None] = [TOOL_PLAN, None, "Refund to card done."]


async def run_session(config, server, tokenizer, uid: str, session_id: int, task: dict[str, Any]):
    """One ``credit_agent`` episode; returns (outputs list, the kwargs verl passes per row)."""
    loop = make_agent_loop(config, server, tokenizer)
    kwargs = {
        "raw_prompt": [{"role": "user", "content": "unused: the environment opens the episode"}],
        "extra_info": {"task": task},
        "uid": uid,
        "session_id": session_id,
        "global_steps": 1,
    }
    output = await loop.run({"temperature": 0.0}, **kwargs)
    return (output if isinstance(output, list) else [output]), kwargs


async def put_session(outputs, kwargs) -> None:
    """Store outputs in TransferQueue with verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess``
    (keys ``{uid}_{session}_{index}``, fields and tags exactly as a rollout worker writes them)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor = None
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    await worker._agent_loop_postprocess(outputs if len(outputs) > 1 else outputs[0], False, **kwargs)


def batch_meta(tq, prefixes: list[str], pad_to: int | None = None, eos_token_id: int = 0):
    """A ``KVBatchMeta`` of the stored rows whose key starts with one of ``prefixes`` (in storage
    order), optionally padded with verl's own ``upsample_batch_to_divisible_size``; also sets
    ``old_log_probs = rollout_log_probs`` (what the actor's old-log-prob step would write)."""
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    listing = tq.kv_list("train")["train"]
    keys = [k for k in listing if any(k.startswith(p) for p in prefixes)]
    meta = KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id="train")
    if pad_to:
        meta = upsample_batch_to_divisible_size(meta, pad_to, eos_token_id)
    log_probs = tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["rollout_log_probs"])
    tq.kv_batch_put(
        keys=meta.keys,
        partition_id="train",
        fields=TensorDict({"old_log_probs": log_probs["rollout_log_probs"]}, batch_size=len(meta.keys)),
    )
    return meta


class FixedGraphAnnotator(Annotator):
    """Test annotator: a ``+`` edge from the first to the last action and an error mark on action 1
    (for trajectories with at least 2 actions); ``delay_s`` sleeps first (an LLM's latency)."""

    delay_s = 0.0

    async def annotate_one(self, trajectory) -> AnnotationResult:
        await asyncio.sleep(self.delay_s)
        n = trajectory.num_actions
        raw: dict[str, Any] = {"num_actions": n, "edges": [], "errors": [], "direct_user_inputs": {}}
        if n >= 2:
            raw["edges"].append({"src": 0, "dst": n - 1, "sign": "+", "type": "input", "unit": "order_id=#W12"})
            raw["errors"].append({"action": 1, "kind": "tool_error", "evidence": "test"})
        graph, validation = validate_graph(raw, n)
        return AnnotationResult(graph, validation, "test_fixed")


class SleepyAnnotator(FixedGraphAnnotator):
    """:class:`FixedGraphAnnotator` that takes 1 s per trajectory."""

    delay_s = 1.0


# ------------------------------------------------------------------ Qwen3-like chat template
#
# A rendition of the behaviours of Qwen3's chat template that matter to a multi-turn rollout
# (written for these tests; same rendered text as Qwen3's for the messages they use):
#
# * tools: listed in the system turn inside ``<tools></tools>`` (one JSON schema a line), after
#   the system message, with the hermes calling instructions;
# * assistant tool calls: ``<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`` (a
#   newline before every call but a first one that directly follows empty content);
# * tool messages: ``<|im_start|>user\n<tool_response>\n...\n</tool_response><|im_end|>``, a run of
#   consecutive tool messages merged into one user turn;
# * reasoning: from ``reasoning_content`` or, failing that, from ``<think>...</think>`` at the start
#   of ``content``; rendered (``<think>\n...\n</think>\n\n``) only for assistant turns *after the
#   last user query* (a user message that is not a wrapped tool response), and there only for the
#   last message or when it is non-empty; dropped for every earlier turn;
# * generation prompt: ``<|im_start|>assistant\n``, plus an empty ``<think>\n\n</think>\n\n`` block
#   when ``enable_thinking`` is false.

QWEN3_TEMPLATE = """
{%- macro render_call(call, needs_newline) -%}
    {%- set fn = call.function if call.function is defined else call -%}
    {%- if needs_newline %}{{- '\\n' }}{% endif -%}
    {{- '<tool_call>\\n{"name": "' ~ fn.name ~ '", "arguments": ' -}}
    {%- if fn.arguments is string %}{{- fn.arguments }}{% else %}{{- fn.arguments | tojson }}{% endif -%}
    {{- '}\\n</tool_call>' -}}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if messages[0].role == 'system' %}{{- messages[0].content ~ '\\n\\n' }}{% endif -%}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for schema in tools %}{{- '\\n' ~ (schema | tojson) }}{% endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
        'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\\n' ~ messages[0].content ~ '<|im_end|>\\n' -}}
{%- endif -%}
{%- set state = namespace(query=messages | length - 1, searching=true) -%}
{%- for position in range(messages | length - 1, -1, -1) -%}
    {%- set m = messages[position] -%}
    {%- if state.searching and m.role == 'user' and m.content is string
          and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
        {%- set state.searching = false -%}
        {%- set state.query = position -%}
    {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- set text = m.content if m.content is string else '' -%}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' ~ m.role ~ '\\n' ~ text ~ '<|im_end|>\\n' -}}
    {%- elif m.role == 'assistant' -%}
        {%- set thought = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set thought = m.reasoning_content -%}
        {%- elif '</think>' in text -%}
            {%- set thought = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}
            {%- set text = text.split('</think>')[-1].lstrip('\\n') -%}
        {%- endif -%}
        {%- if loop.index0 > state.query and (loop.last or thought) -%}
            {{- '<|im_start|>assistant\\n<think>\\n' ~ thought.strip('\\n') ~ '\\n</think>\\n\\n'
                ~ text.lstrip('\\n') -}}
        {%- else -%}
            {{- '<|im_start|>assistant\\n' ~ text -}}
        {%- endif -%}
        {%- for call in (m.tool_calls or []) -%}
            {{- render_call(call, not loop.first or text) -}}
        {%- endfor -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{% endif -%}
        {{- '\\n<tool_response>\\n' ~ text ~ '\\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{% endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{% endif -%}
{%- endif -%}
""".strip()

#: Qwen3's control tokens: ChatML ones special, the tool/think tags single ids but *not* special
QWEN3_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN3_TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

_QWEN3_CORPUS = (
    "You are a support agent. refund order #W12 please. Look up an order. order id get_order order_id "
    'status delivered "name": "arguments": {"order_id": "#W12"} not found card store credit yes thanks '
    "Your order #W12 is delivered. Refund to card or store credit? Refund to card done. "
    "The user wants a refund, so I should look up the order first. The order is delivered; ask how to "
    "refund. The user chose card, so I confirm the refund. # Tools You may call one or more functions "
    "to assist with the user query. function signatures within XML tags json object with function name"
    "\n\nsummary:\n\n the order\n"
)


def qwen3_tokenizer():
    """A byte-level BPE tokenizer (Qwen2/3's pre-tokenizer regex) trained in code, with Qwen3's
    control tokens (:data:`QWEN3_SPECIAL_TOKENS` special, :data:`QWEN3_TAG_TOKENS` plain added
    tokens, as in Qwen3's tokenizer) and :data:`QWEN3_TEMPLATE`; eos ``<|im_end|>``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=list(QWEN3_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_QWEN3_CORPUS] * 20, trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_TAG_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = QWEN3_TEMPLATE
    return hf


class ScriptedTokenServer:
    """A server manager that returns scripted text: the k-th request of a session gets
    ``encode(plans[k]) + [eos]`` with made-up log-probs, distinct per token (``-(n + 1) / 1000`` for
    the n-th token this server returned), so misplaced log-probs show. ``calls`` records every
    request's session, prompt, tokens and log-probs."""

    def __init__(self, tokenizer, plans: list[str]):
        self.tokenizer = tokenizer
        self.plans = list(plans)
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        step = sum(1 for call in self.calls if call["request_id"] == request_id)
        tokens = [*self.tokenizer.encode(self.plans[step], add_special_tokens=False), self.tokenizer.eos_token_id]
        issued = sum(len(call["token_ids"]) for call in self.calls)
        log_probs = [-(issued + n + 1) / 1000 for n in range(len(tokens))]
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "token_ids": tokens,
                "log_probs": log_probs,
                "plan": self.plans[step],
            }
        )
        await asyncio.sleep(0)
        return TokenOutput(
            token_ids=tokens, log_probs=log_probs, extra_fields={"min_global_steps": 1, "max_global_steps": 1}
        )


async def run_session_as(config, server, tokenizer, task: dict[str, Any], hf_model_type: str, uid: str = "q3"):
    """:func:`run_session` with a chosen root ``model_type`` (selects verl's Continuous-Token builder)."""
    loop = make_agent_loop(config, server, tokenizer, hf_model_type)
    kwargs = {
        "raw_prompt": [{"role": "user", "content": "unused: the environment opens the episode"}],
        "extra_info": {"task": task},
        "uid": uid,
        "session_id": 0,
        "global_steps": 1,
    }
    output = await loop.run({"temperature": 0.0}, **kwargs)
    return (output if isinstance(output, list) else [output]), loop
