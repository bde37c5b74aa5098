"""Cluster readiness of ``CreditTrainerSync``.

* per_request layout: the optimizer updates per step equal merged's. The actor worker group is a
  stub that splits the batch exactly like verl 0.9.1's ``TrainingWorker.train_mini_batch`` (its
  assertions, verl's own ``tu.make_iterator`` and ``prepare_micro_batches``); the reference is
  verl's own ``PPOTrainerSync`` on the same batch.
* ``algorithm.filter_groups`` (DAPO dynamic sampling): verl's own ``ReplayBuffer`` on rows written
  by ``credit_agent`` (merged and per_request) through verl's TransferQueue writer.
* validation rows carry ``credit_validate``: verl's own ``_validate`` runs, with verl's own
  ``AgentLoopWorkerTQ.generate_sequences`` / ``_run_prompt`` / ``_agent_loop_postprocess``; only
  the model call (``_run_agent_loop``'s ``agent_loop.run``) is replaced by a recorder.
* session payload metrics and the fallback of sessions whose annotation passed its deadline.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from verl_helpers import DEFAULT_PLANS, TinyModelServer, compose_credit_config, put_session, run_session

from verl_credit.annotate.base import AnnotationResult
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.verl.batch import VALIDATE_KEY
from verl_credit.verl.settings import load_settings

#: Ray + TransferQueue + a tiny model per module (about 1-2 min on 2 cores): deselect with -m "not slow"
pytestmark = pytest.mark.slow

BASE = [
    "actor_rollout_ref.rollout.prompt_length=512",
    "actor_rollout_ref.rollout.response_length=256",
    "credit.env.name=test_orders",
]


def _trainer(cls_name: str, *overrides: str):
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from verl_credit.verl.trainer import CreditTrainerSync

    config = compose_credit_config([*BASE, *overrides])
    return (CreditTrainerSync if cls_name == "credit" else PPOTrainerSync)(config)


# ---------------------------------------------------------------------------------------------
# per_request: optimizer updates per step
# ---------------------------------------------------------------------------------------------


class VerlSplitActor:
    """Actor worker group whose ``update_actor`` splits the batch as verl 0.9.1's engine worker
    does (``TrainingWorker.train_mini_batch``): the dispatcher gives each of ``dp`` ranks an equal
    share; per rank ``tu.make_iterator`` yields ``mini_batch_size / dp`` rows per optimizer step
    (``epochs`` passes) and ``prepare_micro_batches`` splits each into micro-batches. Records the
    optimizer steps and what each mini-batch held."""

    def __init__(self, dp: int, micro: int):
        self._dispatch_info = {"actor": list(range(dp))}
        self.dp = dp
        self.micro = micro
        self.calls: list[dict[str, Any]] = []

    def update_actor(self, batch):
        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu
        from verl.workers.engine.utils import prepare_micro_batches

        info = dict(batch.extra_info)
        mini_batch_size = info["mini_batch_size"]
        assert len(batch) % self.dp == 0
        assert mini_batch_size % self.dp == 0, (mini_batch_size, self.dp)  # train_mini_batch's assertion
        per_gpu = mini_batch_size // self.dp
        rank_rows = len(batch) // self.dp
        steps, sessions_per_step = 0, []
        for rank in range(self.dp):
            rows = torch.arange(rank * rank_rows, (rank + 1) * rank_rows)
            data = TensorDict({"row": rows}, batch_size=[rank_rows])
            iterator = tu.make_iterator(
                data, mini_batch_size=per_gpu, epochs=info["epochs"], seed=info["seed"] + rank, dataloader_kwargs={}
            )
            for number, mini_batch in enumerate(iterator):
                tu.assign_non_tensor(mini_batch, use_dynamic_bsz=False, micro_batch_size_per_gpu=self.micro)
                prepare_micro_batches(mini_batch)  # asserts micro | mini-batch
                if rank == 0:
                    steps += 1
                    keys = [batch.keys[i] for i in mini_batch["row"].tolist()]
                    sessions_per_step.append(len({k.rsplit("_", 1)[0] for k in keys if not k.startswith("pad")}))
                assert number < rank_rows // per_gpu * info["epochs"]
        self.calls.append(
            {"rows": len(batch), "info": info, "optimizer_steps": steps, "rank0_sessions": sessions_per_step}
        )
        return {"metrics": {"mfu": [0.0], "pg_loss": [0.0]}}


def _pad_without_tq(batch, batch_multiple: int, eos_token_id: int):
    """verl's ``upsample_batch_to_divisible_size`` without its TransferQueue writes: the same
    number of padding rows, keys ``pad{hex}_{i}_0`` and ``is_padding`` tags."""
    from transfer_queue import KVBatchMeta

    remainder = len(batch) % batch_multiple
    if remainder == 0:
        return batch
    pad = f"pad{uuid.uuid4().hex}"
    count = batch_multiple - remainder
    return KVBatchMeta(
        keys=batch.keys + [f"{pad}_{i}_0" for i in range(count)],
        tags=batch.tags + [{"is_padding": True, "seq_len": 128} for _ in range(count)],
        partition_id=batch.partition_id,
        extra_info=batch.extra_info,
    )


def _step_batch(rows_per_session: list[int], prompts: int, n: int):
    from transfer_queue import KVBatchMeta

    keys, tags = [], []
    for prompt in range(prompts):
        uid = f"u{prompt:03d}"
        for session in range(n):
            count = rows_per_session[(prompt * n + session) % len(rows_per_session)]
            for index in range(count):
                keys.append(f"{uid}_{session}_{index}")
                tags.append({"seq_len": 100 + (7 * index + session) % 50})
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train")


def _train_step(trainer, batch, dp: int, micro: int) -> tuple[dict[str, Any], dict[str, float]]:
    """verl's step 3 (``_balance_batch``) and step 9 (``_update_actor``) on ``batch``."""
    trainer.actor_rollout_wg = VerlSplitActor(dp, micro)
    trainer.tokenizer = SimpleNamespace(eos_token_id=0)
    trainer.global_steps = 1
    metrics: dict[str, float] = {}
    balanced = trainer._balance_batch(batch, metrics=metrics)
    trainer._update_actor(balanced, metrics)
    (call,) = trainer.actor_rollout_wg.calls
    return call, metrics


MINI = [
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
]


@pytest.fixture
def no_tq_padding(monkeypatch):
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    monkeypatch.setattr(trainer_base, "upsample_batch_to_divisible_size", _pad_without_tq)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("epochs", [1, 2])
def test_per_request_makes_mergeds_number_of_optimizer_updates(no_tq_padding, epochs):
    """16 prompts x n=4 = 64 sessions of 15 requests (960 rows), ppo_mini_batch_size=4 (16
    sessions per update), 8 dp ranks: merged makes 4 updates per epoch; verl's row-sized
    mini-batches (16 rows) would make 60 with per_request. The credit trainer makes 4."""
    overrides = [*MINI, f"actor_rollout_ref.actor.ppo_epochs={epochs}"]
    merged_call, merged_metrics = _train_step(
        _trainer("credit", *overrides), _step_batch([1], prompts=16, n=4), dp=8, micro=2
    )
    assert merged_call["optimizer_steps"] == 4 * epochs and merged_call["info"]["mini_batch_size"] == 16
    assert merged_metrics["credit/optimizer_updates"] == 4 * epochs

    per_request = _step_batch([15], prompts=16, n=4)
    verl_call, _ = _train_step(_trainer("verl", *overrides, "algorithm.adv_estimator=grpo"), per_request, 8, 2)
    assert verl_call["optimizer_steps"] == 60 * epochs  # the bug: 15x the updates

    call, metrics = _train_step(_trainer("credit", *overrides, "credit.layout=per_request"), per_request, 8, 2)
    assert call["optimizer_steps"] == 4 * epochs
    assert call["info"]["mini_batch_size"] == call["info"]["global_batch_size"] == 240  # 16 sessions x 15 rows
    assert metrics["credit/optimizer_updates"] == 4 * epochs and metrics["credit/mini_batch_rows"] == 240
    assert metrics["credit/padding_rows"] == 0.0
    # rank 0 holds 30 of the 240 rows of each update: rows of several sessions, not one session's
    assert all(count > 1 for count in call["rank0_sessions"])


@pytest.mark.timeout(120)
def test_per_request_pads_to_what_verls_splitting_accepts(no_tq_padding):
    """Uneven sessions (7..20 rows), 4 dp ranks, old-log-prob micro-batch 3: the batch is padded
    so every assertion of verl's splitting holds, with merged's 4 updates per epoch."""
    overrides = [
        *MINI,
        "credit.layout=per_request",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
    ]
    batch = _step_batch([7, 12, 20, 9, 15], prompts=16, n=4)
    rows = len(batch)
    call, metrics = _train_step(_trainer("credit", *overrides), batch, dp=4, micro=2)
    assert call["optimizer_steps"] == 4
    assert (call["rows"] // 4) % 3 == 0  # each rank's rows split into old-log-prob micro-batches of 3
    assert metrics["credit/padding_rows"] == call["rows"] - rows > 0
    assert metrics["credit/padding_rows"] < 4 * 4 * 2 * 3  # below the padding multiple lcm(4*3, 4*4*2)
    # what verl alone does with the same batch: 16-row mini-batches
    verl_call, _ = _train_step(_trainer("verl", *overrides, "algorithm.adv_estimator=grpo"), batch, dp=4, micro=2)
    assert verl_call["optimizer_steps"] == verl_call["rows"] // 16 > 40


@pytest.mark.timeout(120)
def test_mini_batch_plan_is_per_step(no_tq_padding):
    """A plan holds for its own step only: a merged-sized batch afterwards trains with verl's sizes."""
    trainer = _trainer("credit", *MINI, "credit.layout=per_request")
    first, _ = _train_step(trainer, _step_batch([15], prompts=16, n=4), dp=8, micro=2)
    second, _ = _train_step(trainer, _step_batch([1], prompts=16, n=4), dp=8, micro=2)
    assert first["info"]["mini_batch_size"] == 240 and second["info"]["mini_batch_size"] == 16
    assert first["optimizer_steps"] == second["optimizer_steps"] == 4
    assert type(trainer.actor_rollout_wg) is VerlSplitActor  # the worker group is restored after the update


class RecordingCritic:
    """Critic worker group: ``train_mini_batch`` records the batch's ``extra_info``."""

    def __init__(self):
        self.infos: list[dict[str, Any]] = []

    def train_mini_batch(self, batch):
        self.infos.append(dict(batch.extra_info))
        return SimpleNamespace(get=lambda: {"metrics": {"mfu": [0.0], "vf_loss": [0.0]}})


@pytest.mark.timeout(120)
def test_per_request_critic_gets_its_own_planned_mini_batches(no_tq_padding):
    """critic.enable with critic.ppo_mini_batch_size=8 (32 sessions per update, merged: 2 updates):
    the critic trains with 960 / 2 = 480-row mini-batches, the actor with 240."""
    trainer = _trainer(
        "credit", *MINI, "credit.layout=per_request", "critic.enable=true", "critic.ppo_mini_batch_size=8"
    )
    assert trainer.use_critic
    trainer.critic_wg = critic = RecordingCritic()
    call, _ = _train_step(trainer, _step_batch([15], prompts=16, n=4), dp=8, micro=2)
    metrics: dict[str, float] = {}
    trainer._update_critic(SimpleNamespace(extra_info={}, keys=[]), metrics)
    assert call["optimizer_steps"] == 4 and call["info"]["mini_batch_size"] == 240
    assert critic.infos[0]["mini_batch_size"] == critic.infos[0]["global_batch_size"] == 480
    assert trainer.critic_wg is critic


# ---------------------------------------------------------------------------------------------
# algorithm.filter_groups (DAPO) with verl's own ReplayBuffer
# ---------------------------------------------------------------------------------------------

#: groups (uids without "_": verl's sampler takes the uid as key.split("_")[0])
DAPO_GROUPS = {
    "dapoflat": ("per_request", [1.0, 1.0, 1.0]),  # no signal: evicted
    "dapomixed": ("per_request", [1.0, 0.0, 0.5]),  # kept
    "dapozero": ("merged", [0.0, 0.0, 0.0]),  # no signal: evicted
}
USER_REPLIES = [["card", "yes please"], ["card"], []]


def _store_dapo_groups(ray_tq, chatml_tokenizer, tiny_model, suffix: str) -> dict[str, str]:
    """Roll out and store every group under ``{name}{suffix}``, with its prompt marked finished
    the way ``AgentLoopWorkerTQ._run_prompt`` marks it; returns ``{name: uid}``."""
    uids = {name: f"{name}{suffix}" for name in DAPO_GROUPS}

    async def go():
        for name, (layout, rewards) in DAPO_GROUPS.items():
            config = compose_credit_config([*BASE, "actor_rollout_ref.rollout.n=3", f"credit.layout={layout}"])
            server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
            for sid, (reward, replies) in enumerate(zip(rewards, USER_REPLIES, strict=True)):
                task = {"user_replies": replies, "reward": reward}
                outputs, kwargs = await run_session(config, server, chatml_tokenizer, uids[name], sid, task)
                await put_session(outputs, kwargs)
            await ray_tq.async_kv_put(
                key=uids[name], partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": 1}
            )

    asyncio.run(go())
    return uids


def _keys_of(ray_tq, uids) -> list[str]:
    listing = ray_tq.kv_list("train")["train"]
    return [k for k in listing if k.split("_")[0] in set(uids) and not listing[k].get("is_prompt")]


def _advantage_metrics(ray_tq, trainer, keys) -> dict[str, float]:
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta

    listing = ray_tq.kv_list("train")["train"]
    meta = KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id="train")
    log_probs = ray_tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rollout_log_probs"])
    fields = TensorDict({"old_log_probs": log_probs["rollout_log_probs"]}, batch_size=len(keys))
    ray_tq.kv_batch_put(keys=keys, partition_id="train", fields=fields)
    metrics: dict[str, float] = {}
    trainer._compute_advantage(meta, metrics)
    return metrics


@pytest.mark.timeout(300)
@pytest.mark.parametrize("metric", ["env_reward", "reward"])
def test_filter_groups_drops_zero_variance_groups(ray_tq, chatml_tokenizer, tiny_model, orders_env_cls, metric):
    """filter_groups.enable with metric env_reward (credit_agent's reward_extra_info) or reward
    (verl's rm_scores): verl's sampler evicts the two groups whose sessions all scored the same
    (per_request: every row of a session carries the session's reward, verl copies it) and
    samples the mixed one; credit/zero_adv_groups is 2/3 before and 0 after filtering."""
    uids = _store_dapo_groups(ray_tq, chatml_tokenizer, tiny_model, suffix=metric.replace("_", ""))
    overrides = [
        "actor_rollout_ref.rollout.n=3",
        "data.train_batch_size=1",
        "algorithm.filter_groups.enable=true",
        f"algorithm.filter_groups.metric={metric}",
        "credit.layout=per_request",
    ]
    trainer = _trainer("credit", *overrides)
    refills: list[int] = []
    trainer.replay_buffer.refill_fn = refills.append
    assert trainer.replay_buffer.filter_groups_metric == metric

    before = _advantage_metrics(ray_tq, trainer, _keys_of(ray_tq, uids.values()))
    assert before["credit/zero_adv_groups"] == pytest.approx(2 / 3) and before["credit/sessions"] == 9

    batch, sample_metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert {k.split("_")[0] for k in batch.keys} == {uids["dapomixed"]}
    assert sample_metrics["training/filter_groups/evicted_samples"] == 2
    assert sorted(sample_metrics["_dapo_filtered_reward_counts"].items()) == [(0.0, 1), (1.0, 1)]
    assert refills == []  # enough groups were sampleable: no refill needed
    assert _keys_of(ray_tq, [uids["dapoflat"], uids["dapozero"]]) == []  # evicted from TransferQueue

    after = _advantage_metrics(ray_tq, trainer, list(batch.keys))
    assert after["credit/zero_adv_groups"] == 0.0 and after["credit/sessions"] == 3
    ray_tq.kv_clear(keys=list(batch.keys), partition_id="train")


def test_filter_groups_metric_must_exist_on_credit_agent_rows():
    """With an environment reward, credit_agent rows carry only env_reward / reward: any other
    metric is refused at start-up instead of failing after the first rollout."""
    with pytest.raises(ValueError, match=r"algorithm.filter_groups.metric='acc'.*\['reward', 'env_reward'\]"):
        _trainer("credit", "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc")
    # verl's own reward function (no environment): its reward_extra_info keys are unknown here
    trainer = _trainer(
        "credit", "credit.env.name=null", "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"
    )
    assert trainer.replay_buffer.filter_groups_metric == "acc"


# ---------------------------------------------------------------------------------------------
# validation rows carry credit_validate into AgentLoop.run(**kwargs)
# ---------------------------------------------------------------------------------------------


def _object_column(values: list[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


class RecordingAgentLoops:
    """Stands in for verl's ``AgentLoopManagerTQ``: ``generate_sequences`` runs verl's own
    ``AgentLoopWorkerTQ.generate_sequences`` (-> ``_run_prompt`` -> ``_run_agent_loop(**prompt)``)
    in one worker; ``_run_agent_loop`` records the kwargs ``agent_loop.run`` would get and stores a
    one-row output through verl's own ``_agent_loop_postprocess``."""

    def __init__(self, config):
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

        worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
        worker.config = config
        worker.processor = None
        worker.reward_loop_worker_handles = None
        worker.distillation_enabled = False
        worker.background_tasks = set()
        worker._run_agent_loop = self._run_agent_loop
        self.worker = worker
        self.kwargs: list[dict[str, Any]] = []

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        self.kwargs.append(dict(kwargs, agent_name=agent_name, validate=trajectory["validate"]))
        reward = float(kwargs["session_id"])
        output = AgentLoopOutput(
            prompt_ids=[1, 2, 3],
            response_ids=[4, 5],
            response_mask=[1, 1],
            reward_score=reward,
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": {"env_reward": reward}},
        )
        return await self.worker._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    def generate_sequences(self, batch) -> None:
        async def run():
            await self.worker.generate_sequences(batch)
            await asyncio.gather(*list(self.worker.background_tasks))

        asyncio.run(run())


@pytest.mark.timeout(180)
def test_validation_rows_reach_the_agent_loop_tagged(ray_tq, chatml_tokenizer):
    """verl's own ``_validate`` (through the credit trainer's override) with a 2-prompt loader and
    val_kwargs.n=2: every session's kwargs carry credit_validate=True, verl stores the column
    with the rows and computes its validation metrics, and the loader is restored afterwards."""
    trainer = _trainer("credit", "actor_rollout_ref.rollout.val_kwargs.n=2")
    loader = [
        {
            "raw_prompt": _object_column([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]),
            "index": np.array([0, 1]),
            "data_source": _object_column(["orders", "orders"]),
            "reward_model": _object_column([{"ground_truth": None}] * 2),
            "extra_info": _object_column([{"task": {"reward": 1.0}}, {"task": {"reward": 0.0}}]),
        }
    ]
    agent_loops = RecordingAgentLoops(trainer.config)
    trainer.val_dataloader = loader
    trainer.agent_loop_manager = agent_loops
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=["streaming"])
    trainer.tokenizer = chatml_tokenizer
    trainer.global_steps = 0

    metrics = trainer._validate()

    assert len(agent_loops.kwargs) == 4  # 2 prompts x val_kwargs.n=2
    for kwargs in agent_loops.kwargs:
        assert kwargs[VALIDATE_KEY] is True and kwargs["validate"] is True
        assert kwargs["agent_name"] == "credit_agent" and "uid" in kwargs and "raw_prompt" in kwargs
    assert metrics["val-core/orders/reward/mean@2"] == pytest.approx(0.5)  # rewards 0 and 1 per prompt
    assert trainer.val_dataloader is loader and VALIDATE_KEY not in loader[0]
    assert not ray_tq.kv_list("val").get("val")  # verl cleared its validation rows


@pytest.mark.timeout(60)
def test_validation_column_is_stored_with_the_rows(ray_tq):
    """verl's TransferQueue writer stores a row's kwargs as fields: credit_validate is one more
    column (read back as True), next to uid/session_id."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    output = AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[3],
        response_mask=[1],
        reward_score=1.0,
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={"reward_extra_info": {"env_reward": 1.0}},
    )
    kwargs = {"uid": "valcol", "session_id": 0, "global_steps": 0, "raw_prompt": [], VALIDATE_KEY: True}
    asyncio.run(put_session([output], kwargs))
    fields = ray_tq.kv_batch_get(keys=["valcol_0_0"], partition_id="train", select_fields=[VALIDATE_KEY, "uid"])
    assert fields.get(VALIDATE_KEY).tolist() == [True] and fields.get("uid").tolist() == ["valcol"]
    ray_tq.kv_clear(keys=["valcol_0_0"], partition_id="train")


# ---------------------------------------------------------------------------------------------
# session payload metrics, annotation deadline fallback
# ---------------------------------------------------------------------------------------------

MESSAGES = [
    {"role": "user", "content": "refund please"},
    {"role": "assistant", "content": "checking"},
    {"role": "user", "content": "thanks"},
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


class RecordingAnnotate:
    """The trainer's synchronous annotator: records (annotator name, trajectory ids)."""

    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, trajectories, settings):
        self.calls.append((settings.name, [t.id for t in trajectories]))
        return [
            AnnotationResult(InfluenceGraph.uniform(t.num_actions), GraphValidation(), settings.name)
            for t in trajectories
        ]


def _settings(fallback: str):
    return load_settings(
        {
            "estimator": "iapo",
            "annotator": {"name": "llm", "base_urls": ["http://annotator:8000/v1"], "model": "m", "fallback": fallback},
        }
    )


@pytest.mark.parametrize("fallback", ["rules", "uniform"])
def test_timed_out_sessions_get_the_fallback_not_the_llm(fallback):
    """Session 0's in-rollout annotation passed its deadline, session 1 has no graph, session 2
    has one: the LLM annotator sees session 1 only; session 0 gets the rule annotator (rules) or
    the uniform graph (uniform), counted as a fallback and in credit/annotation_timeouts."""
    from verl_credit.verl.credit_step import compute_credit_advantages

    graph = InfluenceGraph.uniform(2).to_json()
    payloads = [
        {"annotation_timeout": True, "annotation_error": "deadline", "dropped_tool_calls": 2},
        {"dropped_tool_calls": 1},
        {"graph": graph, "annotation": {"source": "llm"}},
    ]
    annotate = RecordingAnnotate()
    step = compute_credit_advantages(
        *_session_rows(payloads, [1.0, 0.0, 0.5], ["g", "g", "g"]), _settings(fallback), annotate=annotate
    )
    llm_calls = [ids for name, ids in annotate.calls if name == "llm"]
    assert llm_calls == [["g_1"]]
    assert annotate.calls[1:] == ([("rules", ["g_0"])] if fallback == "rules" else [])
    metrics = step.metrics
    assert metrics["credit/annotation_timeouts"] == 1.0
    assert metrics["credit/fallback_rate"] == pytest.approx(1 / 3)
    assert metrics["credit/annotated_in_trainer"] == 1.0
    assert metrics["credit/dropped_tool_calls"] == 3.0
    assert metrics["credit/zero_adv_groups"] == 0.0


def test_payload_metrics_without_timeouts():
    from verl_credit.verl.credit_step import compute_credit_advantages

    graph = InfluenceGraph.uniform(2).to_json()
    payloads = [
        {"graph": graph, "malformed_tool_calls": 3},
        {"graph": graph},
        {"graph": graph, "dropped_tool_calls": 4, "malformed_tool_calls": 2},
        {"graph": graph, "malformed_tool_calls": "many"},  # not a count: ignored
    ]
    step = compute_credit_advantages(
        *_session_rows(payloads, [1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"]),
        _settings("rules"),
        annotate=RecordingAnnotate(),
    )
    assert step.metrics["credit/annotation_timeouts"] == 0.0
    assert step.metrics["credit/dropped_tool_calls"] == 4.0
    assert step.metrics["credit/malformed_tool_calls"] == 5.0  # the step's sum over sessions
    assert step.metrics["credit/zero_adv_groups"] == 0.5  # group a: both sessions scored 1
    assert step.metrics["credit/fallback_rate"] == 0.0
