"""verl's sync replay buffer, polling for finished rollouts every 0.2 s instead of every 2 s.

On two CPU cores a step takes about 6 s, so verl's 2 s poll of the replay buffer
(``verl/trainer/ppo/v1/replay_buffer.py``, ``ReplayBuffer.poll_interval``) leaves the trainer
idle for up to a third of a step after the last episode finished. Plugged in by the CPU
learning benchmark with

    trainer.v1.sampler.custom_sampler.path=pkg://verl_credit.verl.cpu.fast_poll
    trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer

It changes timing only. verl hands a custom sampler neither ``filter_groups_metric`` nor
``sync_refill_failed_groups`` (``trainer_base.py``: "custom implementations own their filtering
semantics"), so runs that use ``algorithm.filter_groups`` must keep verl's own buffer.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

__all__ = ["POLL_INTERVAL_S", "FastPollReplayBuffer"]

POLL_INTERVAL_S = 0.2


class FastPollReplayBuffer(ReplayBuffer):
    """:class:`ReplayBuffer` with ``poll_interval`` = :data:`POLL_INTERVAL_S` unless given."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("poll_interval", POLL_INTERVAL_S)
        super().__init__(*args, **kwargs)
