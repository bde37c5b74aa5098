"""Run benchmark jobs in a process pool (or inline with one worker), reporting each as it ends."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["map_jobs"]

Job = TypeVar("Job")
Result = TypeVar("Result")


def map_jobs(
    function: Callable[[Job], Result],
    jobs: Sequence[Job],
    workers: int,
    progress: Callable[[Result], Any] | None = None,
) -> list[Result]:
    """``[function(job) for job in jobs]`` over ``workers`` processes, in completion order when
    parallel (callers sort); ``progress(result)`` is called as each job ends."""
    results: list[Result] = []
    if workers <= 1:
        for job in jobs:
            results.append(function(job))
            if progress is not None:
                progress(results[-1])
        return results
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(workers) as pool:
        for result in pool.imap_unordered(function, jobs):
            results.append(result)
            if progress is not None:
                progress(result)
    return results
