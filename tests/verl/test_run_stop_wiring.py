"""The trainer's own wiring of the run stop and of the start-up cluster check, without Ray or workers.

* ``CreditTrainerSync._compute_advantage`` runs for real on a trainer built without ``__init__``:
  TransferQueue's ``kv_batch_get`` / ``kv_batch_put`` are an in-memory store that hands back what
  TransferQueue does (jagged masks and scores, ``uid`` and ``extra_fields`` as non-tensor stacks),
  and only verl's own ``_save_checkpoint`` (the workers' part) is a recorder. The credit core, the
  run guards, ``_stop_run`` and the trainer's ``_save_checkpoint`` (``credit_state.json``) are the
  real ones: removing the guard call or the stop from ``_compute_advantage`` fails these tests.
* ``CreditTrainerSync.__init__`` probes the cluster (``check_cluster``) with the validated settings
  before verl's trainer builds any worker, and a failed probe builds none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from verl_helpers import compose_credit_config

from verl_credit.graph import InfluenceGraph
from verl_credit.verl.session_failures import SessionFailure, failed_session_output

#: slow: verl trainer wiring on a tiny model
pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "user", "content": "refund please"},
    {"role": "assistant", "content": "checking"},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "done"},
]
#: one merged row per session: actions [0, 2) and [3, 5) of 6 tokens, the reward on token 4
MASK = [1, 1, 0, 1, 1, 0]


def _session(reward: float, *, failed: bool = False, fallback: bool = False) -> dict[str, Any]:
    """One stored row: a session with a uniform graph (annotated by the LLM, or its fallback), or
    the agent loop's placeholder row of a session whose user simulator failed."""
    if failed:
        fields = failed_session_output(SessionFailure("user", "down"), 0, global_steps=1, with_log_probs=False)
        return {"mask": [0], "scores": [0.0], "extra": fields["extra_fields"]}
    annotation = {"source": "fallback:rules" if fallback else "llm", "fallback": fallback}
    payload = {
        "spans": [[0, 0, 2], [1, 3, 5]],
        "num_actions": 2,
        "messages": MESSAGES,
        "graph": InfluenceGraph.uniform(2).to_json(),
        "annotation": annotation,
    }
    scores = [0.0] * len(MASK)
    scores[4] = reward
    return {"mask": MASK, "scores": scores, "extra": {"credit": payload}}


class FakeQueue:
    """``transfer_queue``'s two calls the advantage step makes, on rows held in memory."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.written: list[list[str]] = []

    def store(self, uids: list[str], sessions: list[dict[str, Any]], step: int):
        from transfer_queue import KVBatchMeta

        keys = [f"{uid}_{number}_0" for number, uid in enumerate(uids)]
        for key, uid, session in zip(keys, uids, sessions, strict=True):
            self.rows[f"{step}/{key}"] = {"uid": uid, **session}
        return KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id=f"train_{step}")

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]):
        from tensordict import NonTensorData, NonTensorStack, TensorDict

        step = partition_id.removeprefix("train_")
        rows = [self.rows[f"{step}/{key}"] for key in keys]

        def jagged(name: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.nested.as_nested_tensor(
                [torch.tensor(r[name], dtype=dtype) for r in rows], layout=torch.jagged
            )

        fields = {
            "uid": NonTensorStack(*(NonTensorData(r["uid"]) for r in rows)),
            "response_mask": jagged("mask", torch.int64),
            "rm_scores": jagged("scores", torch.float32),
            "extra_fields": NonTensorStack(*(NonTensorData(r["extra"]) for r in rows)),
        }
        return TensorDict(
            {name: value for name, value in fields.items() if name in select_fields}, batch_size=[len(rows)]
        )

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any) -> str:
        assert "advantages" in fields.keys()
        self.written.append(list(keys))
        return "written"


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> FakeQueue:
    import verl_credit.verl.trainer as trainer_module

    fake = FakeQueue()
    monkeypatch.setattr(trainer_module, "tq", fake)
    return fake


@pytest.fixture
def verl_saves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``global_steps`` each call of verl's own ``_save_checkpoint`` saw (it would save the workers)."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    saved: list[int] = []
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: saved.append(int(self.global_steps)))
    return saved


def _trainer(tmp_path: Path, *overrides: str):
    """A CreditTrainerSync without workers, configured as ``python -m verl_credit.main`` would be."""
    from verl_credit.verl.trainer import CreditTrainerSync

    trainer = object.__new__(CreditTrainerSync)
    trainer.config = compose_credit_config(
        [
            "algorithm.adv_estimator=iapo",
            "credit.viz.every_n_steps=0",
            f"trainer.default_local_dir={tmp_path}",
            *overrides,
        ]
    )
    return trainer


def _step(trainer: Any, queue: FakeQueue, step: int, uids: list[str], sessions: list[dict[str, Any]]):
    trainer.global_steps = step
    metrics: dict[str, float] = {}
    return trainer._compute_advantage(queue.store(uids, sessions, step), metrics), metrics


UIDS = ["a", "a", "b", "b"]


def test_failed_sessions_above_the_share_stop_the_run_after_a_checkpoint(
    tmp_path: Path, queue: FakeQueue, verl_saves: list[int]
) -> None:
    trainer = _trainer(tmp_path, "credit.session.max_failed_share=0.25")
    # step 2: one of four sessions failed -- 25%, not more than the share: the group is dropped, the step goes on
    sessions = [_session(1.0), _session(0.0, failed=True), _session(1.0), _session(0.0)]
    result, metrics = _step(trainer, queue, 2, UIDS, sessions)
    assert result == "written" and len(queue.written) == 1
    assert metrics["credit/failed_session_share"] == 0.25 and metrics["credit/dropped_groups"] == 1.0
    assert verl_saves == []
    # step 3: two of four failed -- 50%: stop, after saving step 2 (the last one that updated the actor)
    sessions = [_session(1.0), _session(0.0, failed=True), _session(1.0, failed=True), _session(0.0)]
    with pytest.raises(RuntimeError) as stopped:
        _step(trainer, queue, 3, UIDS, sessions)
    message = str(stopped.value)
    assert message.startswith("credit: stopping the run: step 3: 2 sessions (50%) failed (user 2)")
    assert "credit.session.max_failed_share=0.25" in message
    assert f"saved the last trained step's checkpoint: {tmp_path}/global_step_2" in message
    assert verl_saves == [2] and trainer.global_steps == 3
    assert json.loads((tmp_path / "global_step_2" / "credit_state.json").read_text()) is not None
    assert len(queue.written) == 1  # the stopped step wrote no advantages


def test_stop_on_fallback_stops_once_the_window_is_full(
    tmp_path: Path, queue: FakeQueue, verl_saves: list[int]
) -> None:
    overrides = ["credit.annotator.fallback_window=2", "credit.annotator.max_fallback_rate=0.2"]
    every_session_fell_back = [_session(1.0, fallback=True), _session(0.0, fallback=True)] * 2
    trainer = _trainer(tmp_path, *overrides, "credit.annotator.stop_on_fallback=true")
    # step 1: past the rate, but the window (2 steps) is not full: a warning, the step goes on
    result, metrics = _step(trainer, queue, 1, UIDS, every_session_fell_back)
    assert result == "written"
    assert metrics["credit/fallback_rate_window"] == 1.0 and metrics["credit/fallback_limit_exceeded"] == 1.0
    # step 2: the window is full (the guards are kept on the trainer across steps): stop after saving step 1
    with pytest.raises(RuntimeError) as stopped:
        _step(trainer, queue, 2, UIDS, every_session_fell_back)
    message = str(stopped.value)
    assert "step 2: 100% of the sessions of the last 2 step(s) got a fallback graph" in message
    assert "credit.annotator.stop_on_fallback=true" in message
    assert f"saved the last trained step's checkpoint: {tmp_path}/global_step_1" in message
    assert verl_saves == [1] and (tmp_path / "global_step_1" / "credit_state.json").is_file()

    # without stop_on_fallback the same steps only warn
    lenient = _trainer(tmp_path / "lenient", *overrides)
    for step in (1, 2, 3):
        result, metrics = _step(lenient, queue, step, UIDS, every_session_fell_back)
        assert result == "written" and metrics["credit/fallback_limit_exceeded"] == 1.0
    assert verl_saves == [1]


# -- the start-up cluster check ----------------------------------------------------------------------


def test_init_checks_the_cluster_before_verl_builds_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    import verl_credit.verl.trainer as trainer_module
    from verl_credit.verl.settings import CreditSettings

    calls: list[tuple[str, Any]] = []

    def check_cluster(config: Any, settings: Any) -> list[Any]:
        calls.append(("check_cluster", (config, settings)))
        return []

    def verl_init(self: Any, config: Any) -> None:
        calls.append(("verl_init", config))

    monkeypatch.setattr(trainer_module, "check_cluster", check_cluster)
    monkeypatch.setattr(PPOTrainerSync, "__init__", verl_init)
    config = compose_credit_config(["algorithm.adv_estimator=iapo", "credit.session.probe_timeout=3"])
    trainer = trainer_module.CreditTrainerSync(config)

    assert [name for name, _ in calls] == ["check_cluster", "verl_init"]
    checked_config, settings = calls[0][1]
    assert checked_config is config and calls[1][1] is config
    assert isinstance(settings, CreditSettings) and settings.session.probe_timeout == 3.0
    assert trainer.credit_settings is settings  # the settings the cluster was checked with are the run's

    # a cluster that fails its check: no worker is built
    def unreachable(config: Any, settings: Any) -> list[Any]:
        raise RuntimeError("node 10.0.0.2 cannot reach http://node-b:8100/v1")

    calls.clear()
    monkeypatch.setattr(trainer_module, "check_cluster", unreachable)
    with pytest.raises(RuntimeError, match="cannot reach"):
        trainer_module.CreditTrainerSync(compose_credit_config(["algorithm.adv_estimator=iapo"]))
    assert calls == []
