"""Environment registry and the task a dataset row hands to ``Environment.start``."""

from __future__ import annotations

import pytest

from verl_credit.envs.base import build_environment, episode_task


def test_episode_task_accepts_a_mapping_or_a_bare_name() -> None:
    assert episode_task({"env": "coding", "task": {"task": "median_even"}}) == {"task": "median_even"}
    # a bare task name: the whole extra_info is the task (the coding env reads extra_info["task"])
    row = {"env": "coding", "task": "median_even", "index": 3}
    assert episode_task(row) is row
    assert episode_task({"env": "service", "variant": "refund", "seed": 1})["variant"] == "refund"


@pytest.mark.asyncio
async def test_bare_task_name_starts_the_coding_sandbox() -> None:
    env = build_environment("coding")
    try:
        start = await env.start(episode_task({"env": "coding", "task": "median_even"}))
        assert start.info["task"] == "median_even"
        assert any(tool["function"]["name"] == "run_tests" for tool in start.tools)
    finally:
        await env.close()


def test_unknown_environment_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown environment 'nope'.*coding"):
        build_environment("nope")
