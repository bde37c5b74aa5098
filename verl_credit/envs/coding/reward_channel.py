"""The hidden-test verdict travels over a pipe held by the trainer, never through a file.

The agent's sources run inside the hidden-test pytest process, so anything that process writes to
its working tree (a JUnit XML report, its stdout) is writable by the code under test -- an
``atexit`` hook in an edited module could rewrite it. Instead, :data:`RUNNER_SOURCE` (passed with
``python -c``; no file the agent could edit) runs pytest with a small reporter plugin that sends one
JSON line per test phase down the fd ``$VC_CHANNEL_OUT`` (a pipe whose read end only the trainer
holds; see :func:`~verl_credit.envs.coding.jail.run_jailed`'s ``channel_input``). Each record
carries a nonce that the runner read from ``$VC_CHANNEL_IN`` before pytest (and so any agent code)
was imported. When pytest returns, the runner sends a ``done`` record, closes the pipe and leaves
with ``os._exit`` -- ``atexit`` hooks and object finalizers of the agent's code never run.

:func:`parse_channel` accepts the records only when they are well formed, carry the nonce, name
each (test, phase) at most once and end with exactly one ``done`` record with nothing after it;
anything else (a record appended by a background thread or a forked child, a second report of a
test, garbage) makes the run *tampered*, and a tampered run scores zero.

The channel alone cannot stop code that runs *inside* the tested process (it can patch pytest or
the reporter in memory, or find the nonce): that is why the reward's hidden tests never import the
agent's code in-process (:mod:`.hidden_tests`); the channel carries their verdict, and the visible
tests' counts, which are not the reward.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["RUNNER_SOURCE", "ChannelVerdict", "new_nonce", "parse_channel"]

RUNNER_SOURCE = r"""
import json, os, sys
_out = int(os.environ.pop("VC_CHANNEL_OUT"))
_in = int(os.environ.pop("VC_CHANNEL_IN"))
_nonce = os.read(_in, 256).decode("ascii", "replace")
os.close(_in)
os.set_inheritable(_out, False)

def _send(record, _out=_out, _nonce=_nonce, _dumps=json.dumps, _write=os.write):
    record["nonce"] = _nonce
    data = (_dumps(record) + "\n").encode()
    while data:
        data = data[_write(_out, data):]

class _VcReporter:
    def pytest_runtest_logreport(self, report):
        _send({"kind": "test", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
               "xfail": hasattr(report, "wasxfail")})

    def pytest_collectreport(self, report):
        if report.failed:
            _send({"kind": "collect_error", "nodeid": report.nodeid})

import pytest
try:
    _code = int(pytest.main(sys.argv[1:], plugins=[_VcReporter()]))
except BaseException:
    _code = 3
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    pass
_send({"kind": "done", "exit": _code})
os.close(_out)
os._exit(_code)
"""


def new_nonce() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class ChannelVerdict:
    """Per-bucket ``[passed, total]`` counts, or why the channel cannot be trusted."""

    hidden: tuple[int, int]
    visible: tuple[int, int]
    problem: str | None = None  # tampered / incomplete: the run scores zero
    exit_code: int | None = None


_FAILED = ChannelVerdict((0, 0), (0, 0))


def parse_channel(
    data: bytes | None, nonce: str, hidden_files: Iterable[str], *, overflow: bool = False
) -> ChannelVerdict:
    """Count passed/total tests per bucket from the runner's records (see the module docstring).

    Args:
        data: the channel bytes (None: the run had no channel).
        nonce: the nonce sent to this run.
        hidden_files: node-id file parts of the hidden tests (``tests/test_hidden_x.py``).
        overflow: the channel exceeded its byte budget.
    """
    if data is None or overflow:
        return _problem("no reward channel" if data is None else "reward channel overflow")
    hidden = set(hidden_files)
    phases: dict[str, dict[str, dict]] = {}
    collect_errors: list[str] = []
    done: dict | None = None
    if data and not data.endswith(b"\n"):
        return _problem("reward channel ends inside a record")
    for number, line in enumerate(data.split(b"\n")[:-1] if data else [], start=1):
        try:
            record = json.loads(line)
        except ValueError:
            return _problem(f"reward channel record {number} is not JSON")
        if not isinstance(record, dict) or record.get("nonce") != nonce:
            return _problem(f"reward channel record {number} lacks the run's nonce")
        if done is not None:
            return _problem("reward channel has records after the final one")
        kind = record.get("kind")
        if kind == "done":
            done = record
        elif kind == "test":
            nodeid, when = str(record.get("nodeid")), str(record.get("when"))
            seen = phases.setdefault(nodeid, {})
            if when in seen:
                return _problem(f"reward channel reports {nodeid} ({when}) twice")
            seen[when] = record
        elif kind == "collect_error":
            collect_errors.append(str(record.get("nodeid")))
        else:
            return _problem(f"reward channel record {number} has unknown kind {kind!r}")
    if done is None:
        return _problem("reward channel has no final record (the test process died or was cut short)")
    counts = {"hidden": [0, 0], "visible": [0, 0]}

    def bucket(nodeid: str) -> list[int]:
        return counts["hidden" if nodeid.split("::")[0] in hidden else "visible"]

    for nodeid, seen in phases.items():
        entry = bucket(nodeid)
        entry[1] += 1
        call = seen.get("call")
        clean = all(r.get("outcome") == "passed" and not r.get("xfail") for r in seen.values())
        if call is not None and clean:
            entry[0] += 1
    for nodeid in collect_errors:
        bucket(nodeid)[1] += 1
    exit_code = done.get("exit")
    return ChannelVerdict(
        (counts["hidden"][0], counts["hidden"][1]),
        (counts["visible"][0], counts["visible"][1]),
        None,
        exit_code if isinstance(exit_code, int) else None,
    )


def _problem(reason: str) -> ChannelVerdict:
    return ChannelVerdict(_FAILED.hidden, _FAILED.visible, reason)
