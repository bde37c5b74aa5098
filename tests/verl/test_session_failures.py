"""Sessions that fail outside the policy (``verl_credit.verl.session_failures``, ``run_guards``).

Agent loop: the real ``credit_agent`` loop on the ``test_orders`` environment with a server that
fails, one that hangs past ``credit.session.deadline``, and an ``llm`` user whose endpoint is a closed
port -- each training session becomes one placeholder row (nothing trainable, ``session_failed``), a
validation session raises. Trainer: the groups of failed sessions are dropped from the step (their
rows get 0, the other groups exactly what they get without them), counted; too large a share stops
the run after a checkpoint of the last trained step; the annotator's fallback rate over a window of
steps warns every step and, if asked, stops.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from verl_helpers import ScriptedTokenServer, compose_credit_config, make_agent_loop

from verl_credit.annotate.base import AnnotationResult
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.verl.session_failures import (
    FAILED_KEY,
    SessionFailure,
    drop_failed_groups,
    failed_session_output,
    run_within_deadline,
)
from verl_credit.verl.settings import load_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openai_stub_server import unused_port

#: slow: agent-loop sessions against scripted servers
pytestmark = pytest.mark.slow

TASK = {"user_replies": ["card"], "reward": 1.0}
PLANS = [
    '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W12"}}\n</tool_call>',
    "Which refund?",
    "Done.",
]


class FailingServer(ScriptedTokenServer):
    """The rollout server answers the first ``ok`` requests, then raises (a dead vLLM replica)."""

    def __init__(self, tokenizer, ok: int = 1):
        super().__init__(tokenizer, PLANS)
        self.ok = ok

    async def generate(self, request_id: str, **kwargs: Any):
        if len(self.calls) >= self.ok:
            raise ConnectionError("rollout replica 3 is gone")
        return await super().generate(request_id, **kwargs)


class HangingServer(ScriptedTokenServer):
    """The rollout server never answers its second request."""

    async def generate(self, request_id: str, **kwargs: Any):
        if self.calls:
            await asyncio.sleep(3600)
        return await super().generate(request_id, **kwargs)


def _run(config, server, tokenizer, validate: bool = False) -> list[Any]:
    kwargs: dict[str, Any] = {
        "raw_prompt": [{"role": "user", "content": "unused"}],
        "extra_info": {"task": TASK},
        "uid": "g",
        "session_id": 3,
        "global_steps": 7,
    }
    if validate:
        kwargs["credit_validate"] = True

    async def play() -> Any:  # the loop is built on the event loop it runs on, as verl builds it
        return await make_agent_loop(config, server, tokenizer).run({"temperature": 0.0}, **kwargs)

    output = asyncio.run(play())
    return output if isinstance(output, list) else [output]


def _config(*overrides: str):
    return compose_credit_config(
        [
            "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=256",
            "credit.env.name=test_orders",
            "credit.annotator.in_rollout=false",
            *overrides,
        ]
    )


def _assert_placeholder(output: Any, kind: str) -> dict[str, Any]:
    assert output.response_mask == [0] and len(output.response_ids) == 1 and output.reward_score == 0.0
    payload = output.extra_fields["credit"]
    assert payload["spans"] == [] and payload["final"] and payload["num_actions"] == 0
    assert payload[FAILED_KEY]["kind"] == kind
    # what verl's metrics read from every row, and what it stores: ints, and a well-formed row
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 7
    assert output.extra_fields["reward_extra_info"] == {"env_reward": 0.0}
    row = output.as_dict()
    assert row["response_mask"].tolist() == [0] and float(row["rm_scores"].sum()) == 0.0
    return payload[FAILED_KEY]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["merged", "per_request"])
def test_a_rollout_server_that_fails_gives_a_placeholder_row(chatml_tokenizer, orders_env_cls, layout):
    outputs = _run(_config(f"credit.layout={layout}"), FailingServer(chatml_tokenizer, ok=1), chatml_tokenizer)
    (output,) = outputs  # one row, even per_request: nothing of the session is trained
    failure = _assert_placeholder(output, "policy")
    assert "rollout server's generate failed" in failure["reason"] and "replica 3 is gone" in failure["reason"]


@pytest.mark.timeout(120)
def test_one_deadline_bounds_the_whole_session(chatml_tokenizer, orders_env_cls):
    """The second request hangs: the session ends at credit.session.deadline (not after the
    request's own timeout times its retries), the environment is closed, the row is a placeholder."""
    before = len(orders_env_cls.shown)
    (output,) = _run(_config("credit.session.deadline=0.5"), HangingServer(chatml_tokenizer, PLANS), chatml_tokenizer)
    failure = _assert_placeholder(output, "deadline")
    assert "credit.session.deadline=0.5s" in failure["reason"]
    assert len(orders_env_cls.shown) == before  # the user was never asked: the episode stopped mid-way


@pytest.mark.timeout(120)
def test_a_dead_user_simulator_fails_the_session_not_the_worker(chatml_tokenizer, orders_env_cls):
    dead = f"http://127.0.0.1:{unused_port()}/v1"
    config = _config(
        "credit.user.name=llm", f"credit.user.base_url={dead}", "credit.user.model=u", "credit.user.max_retries=0"
    )
    (output,) = _run(config, ScriptedTokenServer(chatml_tokenizer, PLANS[1:]), chatml_tokenizer)
    failure = _assert_placeholder(output, "user")
    assert "simulated user's reply failed" in failure["reason"] and dead in failure["reason"]


@pytest.mark.timeout(120)
def test_a_validation_session_still_raises(chatml_tokenizer, orders_env_cls):
    """verl's validation skips failed sessions itself; a placeholder would score 0 and bias it."""
    with pytest.raises(SessionFailure, match="policy"):
        _run(_config(), FailingServer(chatml_tokenizer, ok=0), chatml_tokenizer, validate=True)


def test_run_within_deadline_and_kinds():
    async def slow() -> int:
        await asyncio.sleep(10)
        return 1

    async def quick() -> int:
        return 2

    with pytest.raises(SessionFailure, match=r"deadline: the episode passed credit\.session\.deadline=0\.05s"):
        asyncio.run(run_within_deadline(slow(), 0.05))
    assert asyncio.run(run_within_deadline(quick(), None)) == 2
    with pytest.raises(ValueError, match="kind must be one of"):
        SessionFailure("network", "x")


# -- the trainer: failed groups dropped, counted ------------------------------------------------------

MESSAGES = [
    {"role": "user", "content": "refund please"},
    {"role": "assistant", "content": "checking"},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "done"},
]


def _rows(uids: list[str], rewards: list[float], failed: set[int]):
    """One merged row per session (actions [0, 2) and [3, 5) of 6 tokens); sessions in ``failed`` are
    the agent loop's placeholder rows."""
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]] * len(uids))
    scores = torch.zeros(mask.shape)
    scores[:, 4] = torch.tensor(rewards)
    graph = InfluenceGraph.uniform(2).to_json()
    extras = []
    for number in range(len(uids)):
        if number in failed:
            fields = failed_session_output(SessionFailure("user", "down"), 0, global_steps=1, with_log_probs=False)
            extras.append(fields["extra_fields"])
            mask[number] = 0
            scores[number] = 0.0
        else:
            payload = {"spans": [[0, 0, 2], [1, 3, 5]], "num_actions": 2, "messages": MESSAGES, "graph": graph}
            extras.append({"credit": payload})
    keys = [f"{uid}_{n}_0" for n, uid in enumerate(uids)]
    return keys, [{}] * len(keys), uids, extras, mask, mask.clone(), scores


def _settings(**annotator: Any):
    return load_settings({"estimator": "iapo", "annotator": annotator})


def test_groups_of_failed_sessions_are_dropped_and_counted():
    from verl_credit.verl.credit_step import compute_credit_advantages

    uids = ["a", "a", "a", "b", "b", "b"]
    rewards = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0]
    step = compute_credit_advantages(*_rows(uids, rewards, failed={1}), _settings())
    # group a lost a member: no baseline, all its rows 0; group b as if a were not in the batch
    assert torch.count_nonzero(step.advantages[:3]) == 0
    alone = compute_credit_advantages(*_rows(uids[3:], rewards[3:], failed=set()), _settings())
    assert torch.equal(step.advantages[3:], alone.advantages)
    assert torch.count_nonzero(alone.advantages) > 0
    metrics = step.metrics
    assert metrics["credit/failed_sessions"] == 1.0 and metrics["credit/failed_sessions_user"] == 1.0
    assert metrics["credit/failed_session_share"] == pytest.approx(1 / 6)
    assert metrics["credit/dropped_groups"] == 1.0 and metrics["credit/dropped_sessions"] == 3.0
    assert metrics["credit/sessions"] == 3.0  # the sessions credit was computed for


def test_a_step_whose_every_group_failed_still_reports():
    from verl_credit.verl.credit_step import compute_credit_advantages

    step = compute_credit_advantages(*_rows(["a", "a", "b", "b"], [1, 0, 1, 0], failed={0, 3}), _settings())
    assert step.credit is None and torch.count_nonzero(step.advantages) == 0
    assert step.metrics["credit/failed_session_share"] == 0.5 and step.metrics["credit/dropped_groups"] == 2.0


def test_drop_failed_groups_renumbers_rows():
    from verl_credit.verl.batch import group_sessions

    keys, tags, uids, extras, *_ = _rows(["a", "b", "b", "c"], [0, 0, 0, 0], failed={1})
    sessions, row_session = group_sessions([*keys, "pad_0_0"], [*tags, {"is_padding": True}], [*uids, "a"])
    kept, rows, summary = drop_failed_groups(sessions, row_session, [*extras, {}])
    assert [s.uid for s in kept] == ["a", "c"] and rows == [0, -1, -1, 1, -1]
    assert summary.reasons == ["b_1: user: down"]


# -- stopping the run ----------------------------------------------------------------------------------


def _guards(**session: Any):
    from verl_credit.verl.run_guards import RunGuards

    settings = load_settings(
        {"estimator": "iapo", "session": session, "annotator": {"fallback_window": 3, "max_fallback_rate": 0.2}}
    )
    return RunGuards(settings.session, settings.annotator)


def test_too_many_failed_sessions_stop_the_run():
    guards = _guards(max_failed_share=0.25)
    below = {"credit/failed_session_share": 0.25, "credit/failed_sessions": 2.0}
    assert guards.check(dict(below), step=3) is None  # not more than the share
    above = {
        "credit/failed_session_share": 0.5,
        "credit/failed_sessions": 4.0,
        "credit/failed_sessions_user": 3.0,
        "credit/failed_sessions_policy": 1.0,
        "credit/failed_sessions_deadline": 0.0,
    }
    reason = guards.check(above, step=4)
    assert reason is not None and reason.startswith("step 4: 4 sessions (50%) failed (policy 1, user 3)")
    assert "credit.session.max_failed_share=0.25" in reason


def test_the_fallback_rate_over_the_window_warns_every_step_and_stops_only_if_asked(caplog):
    def step(rate: float) -> dict[str, float]:
        return {"credit/fallback_rate": rate, "credit/sessions": 10.0}

    guards = _guards()
    with caplog.at_level(logging.WARNING, logger="verl_credit.verl.run_guards"):
        first = step(1.0)
        assert guards.check(first, 1) is None  # a dead annotator: warned at once, never stopped
        assert first["credit/fallback_rate_window"] == 1.0 and first["credit/fallback_limit_exceeded"] == 1.0
        for number in (2, 3, 4):
            assert guards.check(step(1.0), number) is None
    warnings = [r.getMessage() for r in caplog.records if "max_fallback_rate=0.2" in r.getMessage()]
    assert len(warnings) == 4 and "100% of the sessions of the last 3 step(s)" in warnings[-1]
    # the window: (0 + 0 + 3) / 30 = 10% is within the limit
    calm = _guards()
    for rate in (0.0, 0.0):
        calm.check(step(rate), 1)
    last = step(0.3)
    assert calm.check(last, 3) is None and last["credit/fallback_rate_window"] == pytest.approx(0.1)
    assert last["credit/fallback_limit_exceeded"] == 0.0

    from verl_credit.verl.run_guards import RunGuards

    settings = load_settings(
        {"estimator": "iapo", "annotator": {"fallback_window": 2, "max_fallback_rate": 0.2, "stop_on_fallback": True}}
    )
    strict = RunGuards(settings.session, settings.annotator)
    assert strict.check(step(1.0), 1) is None  # the window is not full yet
    reason = strict.check(step(1.0), 2)
    assert reason is not None and "stop_on_fallback=true" in reason


def _bare_trainer(tmp_path: Path, global_steps: int):
    """A CreditTrainerSync without workers: what ``_stop_run`` reads."""
    from omegaconf import OmegaConf

    from verl_credit.verl.trainer import CreditTrainerSync

    trainer = object.__new__(CreditTrainerSync)
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
    trainer.global_steps = global_steps
    trainer.saved = []
    trainer._save_checkpoint = lambda: trainer.saved.append(trainer.global_steps)
    return trainer


def test_stopping_saves_the_last_trained_step_once(tmp_path: Path):
    trainer = _bare_trainer(tmp_path, global_steps=5)
    with pytest.raises(RuntimeError, match=rf"stopping the run: why; saved .*{tmp_path}/global_step_4"):
        trainer._stop_run("why")
    assert trainer.saved == [4] and trainer.global_steps == 5  # step 5 never updated the actor
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    with pytest.raises(RuntimeError, match="already saved"):
        trainer._stop_run("why")
    assert trainer.saved == [4]
    first = _bare_trainer(tmp_path, global_steps=1)
    with pytest.raises(RuntimeError, match="no step was trained yet"):
        first._stop_run("why")
    assert first.saved == []


# -- the trainer's own annotation is bounded ----------------------------------------------------------


class SlowOrBroken:
    """An annotator: trajectory ``slow`` never finishes, ``broken`` raises, the others get a graph."""

    async def annotate_batch(self, trajectories):
        (trajectory,) = trajectories
        if trajectory.id == "slow":
            await asyncio.sleep(3600)
        if trajectory.id == "broken":
            raise RuntimeError("boom")
        return [AnnotationResult(InfluenceGraph.uniform(trajectory.num_actions), GraphValidation(), "llm")]


@pytest.mark.parametrize("fallback", ["rules", "uniform"])
def test_the_trainers_annotation_gives_up_at_the_deadline(fallback: str):
    from verl_credit.trajectory import Trajectory
    from verl_credit.verl.annotation import TRAINER_DEADLINE_ERROR, annotate_within_deadline

    settings = _settings(name="rules", deadline=0.2, fallback=fallback)
    trajectories = [Trajectory.from_messages(MESSAGES, id=name, uid="g") for name in ("ok", "slow", "broken")]
    results = asyncio.run(annotate_within_deadline(SlowOrBroken(), trajectories, settings.annotator))
    assert [r.source for r in results] == ["llm", f"fallback:{fallback}", f"fallback:{fallback}"]
    assert results[1].error == TRAINER_DEADLINE_ERROR and "boom" in results[2].error
    assert all(r.fallback for r in results[1:]) and not results[0].fallback


def test_trainer_annotation_timeouts_are_counted():
    from verl_credit.verl.annotation import TRAINER_DEADLINE_ERROR
    from verl_credit.verl.credit_step import compute_credit_advantages

    def annotate(trajectories, settings):
        return [
            AnnotationResult(
                InfluenceGraph.uniform(t.num_actions),
                GraphValidation(fallback=True),
                "fallback:rules",
                error=TRAINER_DEADLINE_ERROR,
            )
            for t in trajectories
        ]

    keys, tags, uids, extras, mask, response_mask, scores = _rows(["a", "a"], [1.0, 0.0], failed=set())
    for extra in extras:
        del extra["credit"]["graph"]  # no graph from the rollout: the trainer annotates
    step = compute_credit_advantages(
        keys, tags, uids, extras, mask, response_mask, scores, _settings(), annotate=annotate
    )
    assert step.metrics["credit/trainer_annotation_timeouts"] == 2.0 and step.metrics["credit/fallback_rate"] == 1.0
