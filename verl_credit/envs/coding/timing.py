"""What the sandbox's isolation costs: the wall time of its operations, per jail mode.

``python -m verl_credit.envs.coding.timing [--mode namespace] [--repeats 20]`` prints one JSON
line per mode with the median seconds of: creating a sandbox (``create``), a ``bash`` call that does
nothing (``bash_true``), ``read_file`` and ``write_file`` (``read_file``, ``write_file``),
``snapshot`` + ``restore`` of the task's tree (``snapshot_restore``), an uncached reward
(``reward``: visible + hidden tests) and a whole scripted episode of the ``correct`` agent with its
reward (``episode``). The numbers are for comparing builds on one machine, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence

from verl_credit.envs.coding.jail import namespace_jail_available
from verl_credit.envs.coding.sandbox import CodingSandbox
from verl_credit.envs.coding_agent import run_scripted_agent

__all__ = ["main", "measure_mode"]

_TASK = "slugify_dashes"
_MODULE = "textutil/slug.py"


def _median_seconds(operation: Callable[[], object], repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        operation()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure_mode(mode: str, repeats: int) -> dict[str, float | str]:
    """Median seconds of each sandbox operation in jail ``mode`` (see the module docstring)."""
    figures: dict[str, float | str] = {"mode": mode}
    figures["create"] = _median_seconds(lambda: CodingSandbox(_TASK, jail=mode).close(), max(3, repeats // 4))
    with CodingSandbox(_TASK, jail=mode) as box:
        figures["bash_true"] = _median_seconds(lambda: box.call("bash", {"command": "true"}), repeats)
        figures["read_file"] = _median_seconds(lambda: box.call("read_file", {"path": _MODULE}), repeats)
        content = box.call("read_file", {"path": _MODULE}).content
        figures["write_file"] = _median_seconds(
            lambda: box.call("write_file", {"path": "notes/scratch.py", "content": content}), repeats
        )
        state = box.snapshot()
        figures["snapshot_restore"] = _median_seconds(lambda: box.restore(box.snapshot()), repeats)
        box.restore(state)
        counter = iter(range(10**9))

        def uncached_reward() -> float:
            box.call("write_file", {"path": "notes/bump.py", "content": f"N = {next(counter)}\n"})
            return box.reward()

        figures["reward"] = _median_seconds(uncached_reward, max(3, repeats // 4))
    figures["episode"] = _median_seconds(lambda: run_scripted_agent(_TASK, "correct", jail=mode), max(3, repeats // 4))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("namespace", "fallback"), action="append", help="default: both usable")
    parser.add_argument("--repeats", type=int, default=20, help="calls per median (default 20)")
    args = parser.parse_args(argv)
    modes = args.mode or (["namespace"] if namespace_jail_available() else []) + ["fallback"]
    for mode in modes:
        figures = measure_mode(mode, args.repeats)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
