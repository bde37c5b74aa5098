"""The ``verl.plugins`` entry point registers verl-credit in every process that imports verl:
a fresh interpreter, a Ray actor, and it reports a failed registration loudly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: slow: Ray actor and fresh interpreters
pytestmark = pytest.mark.slow

PROBE = """
import json, sys
{prelude}
import verl
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
print("PROBE" + json.dumps({{
    "trainer": TRAINER_REGISTRY["credit_sync"].__name__ if "credit_sync" in TRAINER_REGISTRY else None,
    "estimators": sorted(n for n in ("iapo", "call_credit") if n in ADV_ESTIMATOR_REGISTRY),
    "agent_loop": _agent_loop_registry.get("credit_agent", {{}}).get("_target_"),
}}))
"""


def _start(prelude: str = "") -> subprocess.Popen:
    code = PROBE.format(prelude=prelude)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[dict, str]:
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-3000:]
    line = next(line for line in out.splitlines() if line.startswith("PROBE"))
    return json.loads(line[len("PROBE") :]), err


@pytest.fixture(scope="module")
def probes() -> dict[str, tuple[dict, str]]:
    """Two fresh interpreters run concurrently: a plain ``import verl``, and one whose trainer
    module cannot be imported (verl swallows the plugin's exception at DEBUG level, so the
    plugin itself must say on stderr what failed)."""
    started = {"plain": _start(), "broken": _start(prelude="sys.modules['verl_credit.verl.trainer'] = None")}
    return {name: _finish(process) for name, process in started.items()}


@pytest.mark.timeout(200)
def test_import_verl_registers_everything_in_a_fresh_process(probes):
    seen, _ = probes["plain"]
    assert seen == {
        "trainer": "CreditTrainerSync",
        "estimators": ["call_credit", "iapo"],
        "agent_loop": "verl_credit.verl.agent_loop.CreditAgentLoop",
    }


@pytest.mark.timeout(200)
def test_plugin_failure_is_printed_loudly(probes):
    seen, stderr = probes["broken"]
    assert seen["trainer"] is None
    assert "[verl_credit] ERROR: the verl plugin failed to register" in stderr
    assert "Traceback" in stderr and "verl_credit.verl.trainer" in stderr


@pytest.mark.timeout(200)
def test_registration_inside_a_ray_actor(ray_tq):
    import ray

    # num_cpus=0: the session's TransferQueue actors hold both of the 2 CPUs given to Ray.
    @ray.remote(num_cpus=0)
    class Probe:
        def registered(self) -> dict:
            import verl  # noqa: F401  (the entry point runs here, in the actor's process)
            from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
            from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
            from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

            return {
                "trainer": TRAINER_REGISTRY["credit_sync"].__name__ if "credit_sync" in TRAINER_REGISTRY else None,
                "estimators": sorted(n for n in ("iapo", "call_credit") if n in ADV_ESTIMATOR_REGISTRY),
                "agent_loop": _agent_loop_registry.get("credit_agent", {}).get("_target_"),
            }

    probe = Probe.remote()
    try:
        assert ray.get(probe.registered.remote(), timeout=180) == {
            "trainer": "CreditTrainerSync",
            "estimators": ["call_credit", "iapo"],
            "agent_loop": "verl_credit.verl.agent_loop.CreditAgentLoop",
        }
    finally:
        ray.kill(probe)
