"""``credit_sync``: verl's V1 sync trainer with ``_compute_advantage`` replaced by the credit path.

Per step (``CreditTrainerSync._compute_advantage``), on the batch already in TransferQueue:

1. fetch the fields verl's own ``_compute_advantage`` fetches, plus ``extra_fields``;
2. KL-in-reward and rollout correction exactly as verl does them (same functions);
3. :func:`compute_credit_advantages`: rows -> sessions (``{uid}_{session}_{index}``; padding rows
   skipped), one score per session from its *final* output (verl's multi-output GRPO rule),
   graphs read from ``extra_fields`` (annotated in the rollout) or annotated now (counted),
   ``batch_credit.compute_batch_credit`` + ``batch_credit.route_token_advantages``;
   for call_credit, the optional parts of docs/design.md section 4 between the call weights and the token
   routing (:func:`apply_call_adjustments`; each behind a ``credit.call_credit.*`` switch, off by
   default): counterfactual calibration of the top-|A| AE calls by replaying them through the
   session's environment, IG down-weighting, adaptive role weights (kept on the trainer across
   steps and in checkpoints) and DPO pair export; for info_gain, first one actor forward pass per
   feedback turn with that feedback masked (:mod:`verl_credit.verl.info_gain_step`), the measured
   gains put into the sessions' payloads (so the dump and the offline check see them);
4. write ``advantages``/``returns`` (and verl's optional fields) back, as verl does;
5. docs/design.md section 6 metrics into ``metrics`` (verl's tracker logs them).

With uniform graphs (or ``algorithm.adv_estimator=grpo``) the written advantages equal verl's
GRPO advantages bit-for-bit.

Around the advantage step:

* ``credit.layout=per_request`` (one row per model request): verl sizes actor/critic
  mini-batches in rows (``ppo_mini_batch_size * rollout.n``), which would multiply the optimizer
  updates by the rows per session; ``_balance_batch`` pads the step to the multiple
  :func:`verl_credit.verl.batch.plan_mini_batches` needs and ``_update_actor``/``_update_critic``
  train with its mini-batch size in rows, so a step makes merged's number of updates
  (``credit/optimizer_updates``, ``credit/mini_batch_rows``, ``credit/padding_rows``);
* ``_validate`` tags every validation row ``credit_validate=True`` (it reaches the agent loop's
  ``run(**kwargs)``);
* start-up (``__init__``, before any worker): every endpoint the sessions call answers from every
  Ray node, no loopback URL across hosts, a shared checkpoint folder for ``trainer.nnodes > 1``
  (:func:`verl_credit.verl.cluster_checks.check_cluster`);
* after the credit: :class:`verl_credit.verl.run_guards.RunGuards` -- too many failed sessions
  (``credit.session.max_failed_share``) or a fallback rate past ``credit.annotator.max_fallback_rate``
  with ``stop_on_fallback`` -- saves the last trained step and stops the run (:meth:`_stop_run`);
* ``algorithm.filter_groups`` (DAPO dynamic sampling) is verl's own sampler: ``reward`` or
  ``env_reward`` (:func:`check_filter_groups`); ``credit/zero_adv_groups`` shows what is left;
* ``credit.viz.every_n_steps``: the step's record goes to :class:`verl_credit.verl.viz.CreditViz`,
  which draws a few rollouts in a worker thread; ``_consume_sync_metrics`` logs the finished
  pictures through verl's tracker before verl logs the step (``credit/viz_*``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from verl_credit.estimators.needs import gather_needs
from verl_credit.verl.batch import (
    MiniBatchPlan,
    ValidationBatches,
    count_sessions,
    plan_mini_batches,
)
from verl_credit.verl.call_adjustments_step import (
    CREDIT_STATE_FILE,
    CallAdjustmentsState,
    load_credit_state,
    save_credit_state,
)
from verl_credit.verl.cluster_checks import check_cluster
from verl_credit.verl.credit_dump import write_step_dump
from verl_credit.verl.credit_step import compute_credit_advantages
from verl_credit.verl.info_gain_step import (
    attach_information_gains,
    info_gain_credit_metrics,
    measure_information_gains,
)
from verl_credit.verl.run_guards import RunGuards
from verl_credit.verl.settings import (
    CREDIT_TRAINER_MODE,
    CreditSettings,
    load_settings,
)
from verl_credit.verl.step_record import step_record
from verl_credit.verl.viz import CreditViz, default_viz_dir

__all__ = ["FILTER_GROUPS_METRICS", "CreditTrainerSync", "check_filter_groups"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

#: ``algorithm.filter_groups.metric`` values verl's sampler finds on credit_agent rows with an
#: environment reward: ``reward`` (verl's canonical ``rm_scores``) and ``env_reward``
FILTER_GROUPS_METRICS: tuple[str, ...] = ("reward", "env_reward")


@register_trainer(CREDIT_TRAINER_MODE)
class CreditTrainerSync(PPOTrainerSync):
    """verl's synchronous V1 trainer; only the advantage step differs."""

    #: marks the credit trainer and its subclasses (``settings.check_trainer_selection``)
    is_credit_trainer = True

    def __init__(self, config: DictConfig):
        # The start-up checks of ``python -m verl_credit.main`` again, for verl's own entry point
        # (``verl.trainer.main_ppo --config-name=credit_trainer``): before any worker is built.
        from verl_credit.verl.main import validate

        settings = validate(config)
        check_filter_groups(config, settings)
        with open_dict(config):
            # The mode string also selects the replay buffer, refill and checkpoint behaviour
            # (verl 0.9.1's V1 trainer reads it in several places): keep verl's "sync" semantics.
            config.trainer.v1.trainer_mode = "sync"
        call_adjustments = CallAdjustmentsState.from_settings(settings)  # a bad proposer fails before workers start
        # every endpoint from every Ray node, no loopback URL across hosts, a shared checkpoint folder
        check_cluster(config, settings)
        super().__init__(config)
        self._credit_settings: CreditSettings | None = settings
        self._call_adjustments: CallAdjustmentsState | None = call_adjustments

    @property
    def credit_settings(self) -> CreditSettings:
        if getattr(self, "_credit_settings", None) is None:
            self._credit_settings = load_settings(self.config)
        return self._credit_settings  # type: ignore[return-value]

    @property
    def call_adjustments(self) -> CallAdjustmentsState:
        """State of the optional CALL-CREDIT parts, kept across steps (and in checkpoints)."""
        if getattr(self, "_call_adjustments", None) is None:
            self._call_adjustments = CallAdjustmentsState.from_settings(self.credit_settings)
        return self._call_adjustments  # type: ignore[return-value]

    @property
    def run_guards(self) -> RunGuards:
        """The stop rules (failed sessions, annotator fallbacks), kept across steps."""
        if getattr(self, "_run_guards", None) is None:
            self._run_guards = RunGuards(self.credit_settings.session, self.credit_settings.annotator)
        return self._run_guards  # type: ignore[return-value]

    def _stop_run(self, reason: str) -> None:
        """Save the last trained step (the current one has not updated the actor) and raise.

        Raises:
            RuntimeError: ``reason`` and where the checkpoint is.
        """
        step = int(getattr(self, "global_steps", 0))
        trained = step - 1
        folder = os.path.join(str(self.config.trainer.default_local_dir), f"global_step_{trained}")
        latest = os.path.join(str(self.config.trainer.default_local_dir), "latest_checkpointed_iteration.txt")
        if trained < 1:
            saved = "no step was trained yet: no checkpoint saved"
        elif os.path.exists(latest) and Path(latest).read_text(encoding="utf-8").strip() == str(trained):
            saved = f"the last trained step's checkpoint {folder} was already saved"
        else:
            self.global_steps = trained  # the folder is named after the weights it holds
            try:
                self._save_checkpoint()
            finally:
                self.global_steps = step
            saved = f"saved the last trained step's checkpoint: {folder}"
        raise RuntimeError(f"credit: stopping the run: {reason}; {saved}")

    @property
    def credit_viz(self) -> CreditViz:
        """The live credit pictures (``credit.viz.*``; drawn in a worker thread)."""
        if getattr(self, "_credit_viz", None) is None:
            viz = self.credit_settings.viz
            trainer = self.config.trainer
            folder = viz.dir or default_viz_dir(trainer.project_name, trainer.experiment_name)
            self._credit_viz = CreditViz(viz, folder)
        return self._credit_viz  # type: ignore[return-value]

    def _consume_sync_metrics(self) -> dict:
        """verl's weight-sync stats plus ``credit/viz_*``: the pictures drawn so far are handed to
        verl's tracker (``self.logger``, given with the record) here, on the trainer's thread,
        right before verl logs the step's metrics (all of them at the last step)."""
        metrics = super()._consume_sync_metrics()
        step = int(getattr(self, "global_steps", 0))
        total = getattr(self, "total_training_steps", None)
        final = total is not None and step >= int(total)
        metrics.update(self.credit_viz.drain(step, final=final))
        return metrics

    def _save_checkpoint(self):
        """verl's checkpoint plus ``credit_state.json`` (the adaptive omega), written first so a
        checkpoint verl marks as latest always has it."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        save_credit_state(folder, self.call_adjustments)
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        """verl's resume, then the credit state of the same ``global_step_N`` folder (if any)."""
        result = super()._load_checkpoint()
        folder = self._resumed_folder()
        if folder is not None and not load_credit_state(folder, self.call_adjustments):
            logger.warning("credit: %s has no %s; the credit state starts fresh", folder, CREDIT_STATE_FILE)
        return result

    def _resumed_folder(self) -> str | None:
        """The ``global_step_N`` folder verl's ``_load_checkpoint`` resumed from (None: from scratch)."""
        trainer = self.config.trainer
        if not getattr(self, "global_steps", 0) or trainer.resume_mode == "disable":
            return None
        if trainer.resume_mode == "resume_path":
            folder = str(trainer.resume_from_path)
        else:
            folder = os.path.join(str(trainer.default_local_dir), f"global_step_{self.global_steps}")
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's advantage step with the credit core in place of the estimator call."""
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]
        fetched = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[*fields, "extra_fields"]
        )
        extras = fetched.pop("extra_fields").tolist()
        response_mask = fetched["response_mask"]
        data = DataProto(batch=fetched.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        uids = data.batch.pop("uid").tolist()
        data.non_tensor_batch["uid"] = np.array(uids, dtype=object)
        rollout_mask = data.batch["response_mask"].clone()

        # 1-2: KL penalty in the reward and rollout correction, exactly as verl's trainer
        if self.config.algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        rollout_corr_config = self.config.algorithm.get("rollout_correction", None)
        bypass = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
            metrics.update(is_metrics)

        # 3: credit (for call_credit with replays on, also the rows' extra_info: environment and task;
        # for info_gain, first its masked forward passes through the actor, their gains put in the payloads)
        settings = self.credit_settings

        def measure_information_gains() -> dict[str, float]:
            old_log_probs = data.batch["old_log_probs"] if "old_log_probs" in data.batch.keys() and not bypass else None
            return self._measure_information_gains(batch, uids, extras, rollout_mask, old_log_probs)

        # what the estimator needs that only the trainer can measure (the actor's passes), before
        # the credit step reads it from the payloads
        measured = gather_needs(
            settings.credit.registered_estimator.needs,
            {"information_gains": measure_information_gains},
            estimator=settings.estimator,
            where="the trainer's forward passes",
            partial=True,
        )
        for measurement in measured.values():
            metrics.update(measurement)
        replaying = self.call_adjustments.replays(settings)
        step = compute_credit_advantages(
            batch.keys,
            batch.tags,
            uids,
            extras,
            rollout_mask,
            data.batch["response_mask"],
            data.batch["token_level_rewards"],
            settings,
            call_adjustments=self.call_adjustments,
            extra_infos=_fetch_extra_infos(batch) if replaying else None,
            step=getattr(self, "global_steps", None),
        )
        data.batch["advantages"] = step.advantages
        data.batch["returns"] = step.advantages
        metrics.update(step.metrics)
        stop = self.run_guards.check(metrics, int(getattr(self, "global_steps", 0)))
        if stop is not None:
            self._stop_run(stop)
        if step.credit is not None:
            metrics.update(info_gain_credit_metrics(step.credit.extras, step.credit.lengths))

        # 4: write back like verl
        out_fields = ["advantages", "returns"]
        if self.config.algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = TensorDict(
            {name: response_to_nested(data.batch[name], response_mask) for name in out_fields}, batch_size=len(batch)
        )
        # 5: the step's record, for the dump (written in _update_actor) and the live pictures (credit.viz)
        drawn = self.credit_viz.due(getattr(self, "global_steps", 0))

        def build_record() -> dict[str, Any]:
            return step_record(
                keys=batch.keys,
                tags=batch.tags,
                uids=uids,
                extras=extras,
                rollout_mask=rollout_mask,
                response_mask=data.batch["response_mask"],
                token_level_rewards=data.batch["token_level_rewards"],
                estimator=settings.estimator,
                config=step.config or settings.credit,
                norm_adv_by_std_in_grpo=bool(self.config.algorithm.norm_adv_by_std_in_grpo),
                advantages=step.advantages,
            )

        dumped = build_record() if settings.debug.dump_dir else None
        if dumped is not None:
            self._pending_dump = dumped
        if drawn:  # the pictures get a copy (the dump adds the actor's side to its own dict); the viz
            # builds the record itself when nothing is dumped, so a failure there is counted, not raised
            self.credit_viz.submit(
                int(self.global_steps),
                build_record if dumped is None else (lambda: dict(dumped)),
                getattr(self, "logger", None),
            )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    def _measure_information_gains(
        self, batch: KVBatchMeta, uids: list, extras: list, rollout_mask: torch.Tensor, old_log_probs: Any
    ) -> dict[str, float]:
        """``info_gain``: one actor pass per feedback turn with the feedback masked, called as verl's
        ``_compute_old_log_prob`` calls ``compute_log_prob`` (``verl_credit.verl.info_gain_step``);
        ``old_log_probs`` (``None`` in bypass mode: the rollout engine's) are the unmasked side."""
        rollout = self.config.actor_rollout_ref.rollout
        _, forward = self._micro_batch_sizes()
        measured = measure_information_gains(
            batch.keys,
            batch.tags,
            uids,
            extras,
            rollout_mask,
            old_log_probs,
            tq=tq,
            partition_id=batch.partition_id,
            worker_group=self.actor_rollout_wg,
            tokenizer=self.tokenizer,
            placeholder=self.credit_settings.credit.info_gain.placeholder,
            extra_info={"calculate_entropy": False, "compute_loss": False, "temperature": rollout.temperature},
            micro_batch_size=forward[0],
            chat_template_kwargs=self.config.data.get("apply_chat_template_kwargs", None),
            step_key=f"step{getattr(self, 'global_steps', 0)}",
        )
        attach_information_gains(batch.keys, batch.tags, uids, extras, measured)
        return measured.metrics()

    # -- per_request: optimizer updates per step as in the merged layout ----------------------

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's padding + dp balancing; for ``credit.layout=per_request`` the padding multiple and
        the mini-batch sizes in rows come from :func:`plan_mini_batches` (computed with the dp size
        verl determines here), so the step makes merged's number of optimizer updates."""
        self._mini_batch_plan: MiniBatchPlan | None = None
        sessions = count_sessions(batch.keys, batch.tags) if self.credit_settings.layout == "per_request" else 0
        self._plan_request = (len(batch), sessions) if sessions and self._mini_batch_sessions() else None
        try:
            balanced = super()._balance_batch(
                batch, metrics=metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch
            )
        finally:
            self._plan_request = None
        plan = self._mini_batch_plan
        if plan is not None:
            if len(balanced) != plan.padded_rows:
                raise RuntimeError(
                    f"credit: the balanced batch has {len(balanced)} rows; the mini-batch plan expects "
                    f"{plan.padded_rows}"
                )
            metrics["credit/padding_rows"] = float(plan.padded_rows - plan.rows)
        return balanced

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        request = getattr(self, "_plan_request", None)
        if request is None:
            return super()._get_required_batch_multiple(dp_size)
        rows, sessions = request
        micro, forward = self._micro_batch_sizes()
        plan = plan_mini_batches(rows, sessions, self._mini_batch_sessions(), dp_size, micro, forward)
        self._mini_batch_plan = plan
        return plan.batch_multiple

    def _mini_batch_sessions(self) -> dict[str, int]:
        """Sessions per optimizer update of each role that trains this step (verl's
        ``ppo_mini_batch_size * rollout.n``; the roles verl's ``_get_required_batch_multiple`` counts)."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        sizes: dict[str, int] = {}
        if self.use_critic:
            sizes["critic"] = int(self.config.critic.ppo_mini_batch_size) * n
        if self.config.trainer.critic_warmup <= getattr(self, "global_steps", 0):
            sizes["actor"] = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * n
        return sizes

    def _micro_batch_sizes(self) -> tuple[dict[str, int], list[int]]:
        """Micro-batch sizes per GPU that must divide a mini-batch (training) or a rank's rows
        (forward passes) -- verl's ``prepare_micro_batches`` asserts it without dynamic bsz."""
        ref = self.config.actor_rollout_ref

        def size(node: Any, dynamic: str, key: str) -> int:
            return 1 if node.get(dynamic, False) else int(node.get(key, None) or 1)

        micro = {"actor": size(ref.actor, "use_dynamic_bsz", "ppo_micro_batch_size_per_gpu")}
        forward = [size(ref.rollout, "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu")]
        if self.use_reference_policy:
            forward.append(size(ref.ref, "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu"))
        if self.use_critic:
            critic = self.config.critic
            micro["critic"] = size(critic, "use_dynamic_bsz", "ppo_micro_batch_size_per_gpu")
            forward.append(size(critic, "use_dynamic_bsz", "forward_micro_batch_size_per_gpu"))
        return micro, forward

    def _planned_rows(self, role: str) -> int | None:
        plan = getattr(self, "_mini_batch_plan", None)
        return plan.mini_batch_rows.get(role) if plan is not None else None

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's critic update; per_request: with the planned mini-batch size in rows."""
        rows = self._planned_rows("critic")
        if rows is None:
            return super()._update_critic(batch, metrics)
        self.critic_wg = _MiniBatchRows(self.critic_wg, "train_mini_batch", rows)
        try:
            return super()._update_critic(batch, metrics)
        finally:
            self.critic_wg = self.critic_wg.group

    def _validate(self) -> dict[str, float]:
        """verl's validation with every validation row tagged ``credit_validate=True``: the column
        reaches ``CreditAgentLoop.run(**kwargs)`` (verl passes a batch's columns as kwargs), so the
        agent loop can tell validation episodes from training ones."""
        loader = self.val_dataloader
        self.val_dataloader = ValidationBatches(loader)
        try:
            return super()._validate()
        finally:
            self.val_dataloader = loader

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update; with ``credit.debug.dump_dir`` set, the step's dump is written first,
        with the advantages read back from TransferQueue exactly as the actor is about to read them.
        per_request: the mini-batch size in rows is the planned one (``_balance_batch``), so the
        update count is merged's; ``credit/optimizer_updates`` is logged for both layouts."""
        pending = getattr(self, "_pending_dump", None)
        folder = self.credit_settings.debug.dump_dir
        if folder and pending is not None and list(batch.keys) == pending["keys"]:
            fetched = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages", "response_mask"]
            )
            actor = fetched.to_padded_tensor()["advantages"]
            width = pending["trainer_advantages"].shape[1]
            padded = torch.zeros((actor.shape[0], width), dtype=actor.dtype)
            padded[:, : min(width, actor.shape[1])] = actor[:, :width]
            pending["actor_advantages"] = padded
            pending["credit_state"] = self.call_adjustments.state_dict()
            write_step_dump(folder, int(self.global_steps), pending)
            self._pending_dump = None
        actor = self.config.actor_rollout_ref.actor
        rows = self._planned_rows("actor")
        size = (
            rows if rows is not None else int(actor.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        )
        metrics["credit/mini_batch_rows"] = float(size)
        metrics["credit/optimizer_updates"] = float(len(batch) // size * int(actor.ppo_epochs))
        if rows is None:
            return super()._update_actor(batch, metrics)
        self.actor_rollout_wg = _MiniBatchRows(self.actor_rollout_wg, "update_actor", rows)
        try:
            return super()._update_actor(batch, metrics)
        finally:
            self.actor_rollout_wg = self.actor_rollout_wg.group


class _MiniBatchRows:
    """A worker group whose ``method`` trains with ``mini_batch_size = global_batch_size = rows``
    (set in the batch's ``extra_info`` after verl's own values); everything else is the group's."""

    def __init__(self, group: Any, method: str, rows: int):
        self.group = group
        self.method = method
        self.rows = rows

    def __getattr__(self, name: str) -> Any:
        if name in ("group", "method", "rows"):
            raise AttributeError(name)
        if name != self.method:
            return getattr(self.group, name)
        forward = getattr(self.group, name)

        def train(batch: KVBatchMeta, *args: Any, **kwargs: Any) -> Any:
            batch.extra_info.update(mini_batch_size=self.rows, global_batch_size=self.rows)
            return forward(batch, *args, **kwargs)

        return train


def check_filter_groups(config: Any, settings: CreditSettings) -> None:
    """``algorithm.filter_groups`` (DAPO dynamic sampling) with ``credit_agent`` and an environment
    reward: the agent loop records only ``reward_extra_info.env_reward`` (and ``rm_scores``), so
    verl's sampler can filter on ``env_reward`` or ``reward``; any other metric would fail only
    after the first rollout (``Finished groups are missing DAPO metric``). Raises ``ValueError``."""
    algorithm = config.get("algorithm") or {}
    filter_groups = algorithm.get("filter_groups") or {}
    if not filter_groups.get("enable", False):
        return
    metric = filter_groups.get("metric", None)
    agent = config.get("actor_rollout_ref", {}).get("rollout", {}).get("agent", {}).get("default_agent_loop")
    if settings.env.name and agent == "credit_agent" and metric not in FILTER_GROUPS_METRICS:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: with credit.env.name={settings.env.name!r} the credit_agent "
            f"loop records the environment's reward only as rm_scores and reward_extra_info.env_reward; "
            f"set algorithm.filter_groups.metric to one of {list(FILTER_GROUPS_METRICS)}"
        )


def _fetch_extra_infos(batch: KVBatchMeta) -> list[Mapping[str, Any] | None]:
    """Each row's ``extra_info`` (verl stores the dataset row's fields with every output); rows
    without one get ``None`` (their replays fail, counted)."""
    fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_info"])
    values = fetched.get("extra_info", None) if "extra_info" in fetched.keys() else None
    if values is None:
        logger.warning("credit: the batch has no extra_info field; replays cannot find their tasks")
        return [None] * len(batch.keys)
    return [value if isinstance(value, Mapping) else None for value in values.tolist()]
