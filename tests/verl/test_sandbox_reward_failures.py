"""A policy must not crash its reward: the agent loop scores a failing reward 0 and counts it
(``reward_failures`` in the session payload), and the trainer sums the counts into
``credit/reward_failures``. With the real coding sandbox, a policy that builds a 1,100-level tree
(which made the reward raise ``RecursionError``) gets an ordinary reward of 0 and no failure."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch
from verl_helpers import DEFAULT_PLANS, TinyModelServer, compose_credit_config, run_session

from verl_credit.annotate.base import AnnotationResult
from verl_credit.envs.base import ENVIRONMENTS, register_environment
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.verl.settings import load_settings

#: slow: agent-loop sessions in the coding sandbox
pytestmark = pytest.mark.slow

TASK = {"user_replies": ["card", "yes please"], "reward": 1.0}


def _config(env: str, *overrides: str):
    return compose_credit_config(
        [
            "actor_rollout_ref.rollout.prompt_length=1024",
            "actor_rollout_ref.rollout.response_length=512",
            f"credit.env.name={env}",
            "credit.annotator.in_rollout=false",
            *overrides,
        ]
    )


@pytest.fixture
def broken_grader_env(orders_env_cls: type) -> type:
    """``test_orders`` whose ``reward()`` (task ``reward_raises``) and ``close()`` (task
    ``close_raises``) raise, as a grader a policy broke would."""
    if "test_broken_grader" in ENVIRONMENTS:
        return ENVIRONMENTS["test_broken_grader"]

    @register_environment("test_broken_grader")
    class BrokenGrader(orders_env_cls):
        async def reward(self) -> float:
            if self.task.get("reward_raises"):
                raise RecursionError("maximum recursion depth exceeded while walking the workspace")
            return await super().reward()

        async def close(self) -> None:
            await super().close()
            if self.task.get("close_raises"):
                raise OSError(39, "Directory not empty")

    return BrokenGrader


@pytest.mark.timeout(120)
def test_a_failing_reward_scores_zero_and_is_counted(chatml_tokenizer, tiny_model, broken_grader_env) -> None:
    tok = chatml_tokenizer
    config = _config("test_broken_grader")

    async def sessions():
        tasks = [
            {**TASK, "reward_raises": True},
            {**TASK, "reward_raises": True, "close_raises": True},
            {**TASK, "close_raises": True},
            TASK,
        ]
        return await asyncio.gather(
            *(
                run_session(config, TinyModelServer(tiny_model, tok, DEFAULT_PLANS), tok, f"u{n}", 0, task)
                for n, task in enumerate(tasks)
            )
        )

    results = asyncio.run(sessions())
    finals = [outputs[-1] for outputs, _ in results]
    counts = [output.extra_fields["credit"]["reward_failures"] for output in finals]
    assert counts == [1, 2, 1, 0]
    # a reward that raised scores 0; a reward computed before a failing close() stands
    assert [output.reward_score for output in finals] == [0.0, 0.0, 1.0, 1.0]
    assert all(output.extra_fields["credit"]["num_actions"] >= 1 for output in finals)  # real sessions


@pytest.mark.timeout(300)
def test_a_hostile_tree_in_the_coding_sandbox_is_an_ordinary_zero(chatml_tokenizer, tiny_model) -> None:
    """One bash call that builds a 1,100-level directory tree, then a closing answer: the episode
    ends with the sandbox's real reward (0: the task is unfixed) and no reward failure."""
    command = (
        'python -c \'import os\nfor _ in range(1100):\n    os.mkdir("d")\n    os.chdir("d")\n'
        'open("deep.py", "w").write("X = 1")\''
    )
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    plans = [f"<tool_call>\n{call}\n</tool_call>", "Done."]
    tok = chatml_tokenizer
    config = _config("coding", "+credit.env.options.jail=fallback")
    outputs, _ = asyncio.run(
        run_session(config, TinyModelServer(tiny_model, tok, plans), tok, "deep", 0, {"task": "slugify_dashes"})
    )
    credit = outputs[-1].extra_fields["credit"]
    tool_messages = [m for m in credit["messages"] if m["role"] == "tool"]
    assert tool_messages and "nested deeper than" in tool_messages[0]["content"], tool_messages
    assert credit["reward_failures"] == 0
    assert outputs[-1].reward_score == 0.0


MESSAGES = [
    {"role": "user", "content": "fix the bug"},
    {"role": "assistant", "content": "looking"},
    {"role": "user", "content": "ok"},
    {"role": "assistant", "content": "done"},
]


def _session_rows(payloads: list[dict[str, Any]], rewards: list[float], uids: list[str]):
    """One merged row per session: actions [0, 2) and [3, 5) of a 6-token response."""
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]] * len(payloads))
    scores = torch.zeros(mask.shape)
    scores[:, 4] = torch.tensor(rewards)
    extras = [
        {"credit": {"spans": [[0, 0, 2], [1, 3, 5]], "num_actions": 2, "messages": MESSAGES, **p}} for p in payloads
    ]
    keys = [f"{uid}_{n}_0" for n, uid in enumerate(uids)]
    return keys, [{}] * len(keys), uids, extras, mask, mask, scores


def _uniform_annotate(trajectories, settings):
    return [
        AnnotationResult(InfluenceGraph.uniform(t.num_actions), GraphValidation(), settings.name) for t in trajectories
    ]


def test_the_trainer_sums_reward_failures_into_a_metric() -> None:
    from verl_credit.verl.credit_step import compute_credit_advantages

    graph = InfluenceGraph.uniform(2).to_json()
    payloads = [
        {"graph": graph, "reward_failures": 1},
        {"graph": graph},  # an older payload without the field: 0
        {"graph": graph, "reward_failures": 2},
        {"graph": graph, "reward_failures": "crashed"},  # not a count: ignored
    ]
    settings = load_settings({"estimator": "iapo", "annotator": {"name": "rules"}})
    step = compute_credit_advantages(
        *_session_rows(payloads, [0.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"]), settings, annotate=_uniform_annotate
    )
    assert step.metrics["credit/reward_failures"] == 3.0
