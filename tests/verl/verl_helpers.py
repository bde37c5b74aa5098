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


def make_agent_loop(config, server, tokenizer):
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
        hf_model_type="qwen2",
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
