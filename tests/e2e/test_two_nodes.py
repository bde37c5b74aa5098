"""Two Ray nodes on one machine: the CPU training of ``recipes/cpu/train.sh`` with ``NNODES=2``.

A head and a second ``ray start --address ...`` (``tests/local_ray_cluster.py``), both on 127.0.0.1,
each with its own resources (6 CPUs: verl's pool bundle takes 3 with the GPU and TransferQueue's two
actors 1 each, on either node; 1 logical GPU; a ``node_a``/``node_b`` marker); the recipe
connects to them (``RAY_ADDRESS``) instead of starting Ray. The run is IAPO for 2 steps on the built-in
service world with the LLM annotator pointed at a loopback stub server that answers uniform graphs
(``tests/openai_stub_server.py --responder uniform-graph``), so the sessions on both nodes call an
endpoint and the start-up probe has one to check from each node. Asserted from what the run left:

* workers on both nodes: the cluster's actor table (dead actors included) has agent-loop workers and
  the FSDP/rollout workers on each node;
* the start-up probe ran on each node (``credit: start-up probe on node ...`` for both node ids, the
  endpoint answering and the checkpoint folder seen) and every session's graph came from the LLM
  annotator (``credit/fallback_rate`` 0: the agent-loop workers of both nodes reached the endpoint);
* training and credit unchanged: the advantages the actor received equal the credit core rebuilt
  offline from the dumps (``verl_credit.verl.cpu.check``), to 1e-6, with non-zero advantages;
* everything the test started (both Ray nodes and their processes, the stub server, the trainer)
  is stopped by PID, and the cluster's folder is gone: the processes below the nodes right after
  they start, and again just before the stop (with the workers the nodes still run then, and any
  process whose command line names the cluster's folder, reparented or not), are all gone after it.

Memory: two vLLM-CPU rollout replicas and two FSDP ranks, about twice the single-node run. Set
``VERL_CREDIT_SKIP_CPU_TRAINING=1`` to skip it (as ``tests/e2e/test_cpu_training.py``); it runs only
with ``VERL_CREDIT_EXTRA_E2E=1`` (not in README's default test command).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import psutil
except ImportError:  # /proc instead
    psutil = None

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from local_ray_cluster import LocalRayCluster, RayNodeSpec, descendants  # noqa: E402

STEPS = 2
PROBE_LINE = re.compile(
    r"credit: start-up probe on node (\S+) \((\S+), Ray node ([0-9a-f]+)\): (\d+) of (\d+) endpoint\(s\) answer(.*)$"
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        os.environ.get("VERL_CREDIT_SKIP_CPU_TRAINING") == "1", reason="VERL_CREDIT_SKIP_CPU_TRAINING=1"
    ),
    # a second training run of its own (it cannot share the smoke's), twice its memory: opt-in, so
    # that README's test command stays inside CI's time on 2 cores
    pytest.mark.skipif(
        os.environ.get("VERL_CREDIT_EXTRA_E2E") != "1", reason="the two-node run needs VERL_CREDIT_EXTRA_E2E=1"
    ),
]


def _run(argv: list[str], timeout: int, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def _start_time(pid: int) -> float | None:
    """When ``pid`` started (psutil's ``create_time``, else ``/proc/<pid>/stat``'s start time in clock
    ticks), ``None`` when it is gone or a zombie: a PID and its start time name one process, even
    after the PID is reused."""
    if psutil is not None:
        try:
            process = psutil.Process(pid)
            return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
        except psutil.Error:
            return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else float(fields[19])


def _cluster_processes(roots: list[int], folder: str) -> dict[int, float]:
    """PID -> start time of every live process below ``roots`` and of every one whose command line
    names ``folder`` (the cluster's temp folder: Ray passes it to all its processes)."""
    pids: set[int] = set()
    for root in roots:
        if psutil is not None:
            try:
                pids |= {root, *(child.pid for child in psutil.Process(root).children(recursive=True))}
            except psutil.Error:
                pass
        else:
            pids |= {root, *descendants(root)}
    if folder:
        # the folder itself or a path below it, not another folder that starts with its name
        names = (f"{folder}\0".encode(), f"{folder}/".encode())
        if psutil is not None:
            for process in psutil.process_iter(["cmdline"]):
                cmdline = "\0".join([*(process.info["cmdline"] or ()), ""]).encode(errors="replace")
                if any(name in cmdline for name in names):
                    pids.add(process.pid)
        else:
            for entry in Path("/proc").iterdir():
                try:
                    cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
                except OSError:
                    continue
                if any(name in cmdline for name in names):
                    pids.add(int(entry.name))
    found = {pid: _start_time(pid) for pid in pids - {os.getpid()}}
    return {pid: started for pid, started in found.items() if started is not None}


def _venv() -> Path:
    done = _run(["bash", str(REPO / "recipes" / "cpu" / "setup_env.sh")], timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


class StubAnnotator:
    """``tests/openai_stub_server.py --responder uniform-graph`` in its own process (stopped by PID)."""

    def __init__(self, python: Path):
        self.process = subprocess.Popen(
            [
                str(python),
                str(REPO / "tests" / "openai_stub_server.py"),
                "--responder",
                "uniform-graph",
                "--exit-on-stdin-eof",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line.startswith("READY "), line
        self.base_url = line.removeprefix("READY ")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    venv = _venv()
    python = venv / "bin" / "python"
    out = tmp_path_factory.mktemp("two_nodes")
    model, data, run_dir = out / "model", out / "data", out / "run"
    built = _run([str(python), "-m", "verl_credit.verl.cpu.tiny_policy", "--out", str(model), "--tasks", "4"], 900)
    assert built.returncode == 0, built.stderr[-3000:]
    made = _run([str(python), "-m", "verl_credit.verl.cpu.data", "--out", str(data), "--tasks", "4"], 300)
    assert made.returncode == 0, made.stderr[-3000:]

    stub = StubAnnotator(python)
    cluster = LocalRayCluster(
        str(venv / "bin" / "ray"),
        [RayNodeSpec(6, 1, {"node_a": 1}), RayNodeSpec(6, 1, {"node_b": 1})],
        python=str(python),
        start_timeout_s=180,
    )
    started: list[int] = []
    before_stop: dict[int, float] = {}
    try:
        cluster.start()
        started = [pid for process in cluster.processes for pid in (process.pid, *descendants(process.pid))]
        nodes = cluster.nodes()
        env = {
            **os.environ,
            **cluster.env,
            "VENV": str(venv),
            "MODEL_PATH": str(model),
            "DATA_DIR": str(data),
            "RUN_DIR": str(run_dir),
            "NNODES": "2",
            "RAY_ADDRESS": cluster.address,
            "ESTIMATOR": "iapo",
            "STEPS": str(STEPS),
            "BATCH": "2",
            "ROLLOUT_N": "4",
            "MAX_TURNS": "12",
            "MAX_PROMPT_LENGTH": "256",
            "MAX_RESPONSE_LENGTH": "768",
            "TIMEOUT_S": "1800",
        }
        overrides = [
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "credit.annotator.name=llm",
            f'credit.annotator.base_urls=["{stub.base_url}"]',
            "credit.annotator.model=stub",
            "credit.annotator.max_model_len=0",
        ]
        trained = _run(["bash", str(REPO / "recipes" / "cpu" / "train.sh"), *overrides], timeout=2400, env=env)
        actors = cluster.actors()
        checked = _run(
            [
                str(python),
                "-m",
                "verl_credit.verl.cpu.check",
                "--run",
                f"iapo={run_dir}",
                "--json",
                str(out / "c.json"),
            ],
            600,
        )
    finally:
        # everything below the nodes now (with the workers they still run), not only at start-up
        before_stop = _cluster_processes([process.pid for process in cluster.processes], cluster.temp_dir)
        cluster.stop()
        stub.stop()
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
    return {
        "rc": trained.returncode,
        "stderr": trained.stderr,
        "log": log,
        "nodes": nodes,
        "actors": actors,
        "run_dir": run_dir,
        "check": json.loads((out / "c.json").read_text()) if checked.returncode == 0 else None,
        "check_err": checked.stderr,
        "started": started,
        "before_stop": before_stop,
        "cluster_dir": cluster.temp_dir,
        "stub_pid": stub.process.pid,
    }


def test_the_two_node_run_trains(two_nodes: dict[str, Any]) -> None:
    assert two_nodes["rc"] == 0, two_nodes["log"][-6000:] + two_nodes["stderr"][-2000:]
    assert len(two_nodes["nodes"]) == 2
    assert {node["NodeManagerAddress"] for node in two_nodes["nodes"]} == {"127.0.0.1"}
    assert {name for node in two_nodes["nodes"] for name in node["Resources"] if name.startswith("node_")} == {
        "node_a",
        "node_b",
    }


def test_workers_were_placed_on_both_nodes(two_nodes: dict[str, Any]) -> None:
    node_ids = {node["NodeID"] for node in two_nodes["nodes"]}
    agent_loops = {a["node_id"] for a in two_nodes["actors"] if "AgentLoopWorker" in a["class_name"]}
    assert agent_loops == node_ids, two_nodes["actors"]
    # the FSDP actor / vLLM rollout workers: one logical GPU per node, so one rank on each
    others = {
        a["node_id"]
        for a in two_nodes["actors"]
        if "AgentLoopWorker" not in a["class_name"] and "TaskRunner" not in a["class_name"]
    }
    assert node_ids <= others, two_nodes["actors"]


def test_the_start_up_probe_ran_on_each_node(two_nodes: dict[str, Any]) -> None:
    probes = [PROBE_LINE.search(line) for line in two_nodes["log"].splitlines()]
    found = [match.groups() for match in probes if match]
    assert {node_id for _, _, node_id, *_ in found} == {node["NodeID"] for node in two_nodes["nodes"]}, found
    for address, _, _, answered, total, rest in found:
        assert address == "127.0.0.1" and answered == total == "1" and "sees the checkpoint folder" in rest


def test_every_session_was_annotated_by_the_endpoint(two_nodes: dict[str, Any]) -> None:
    steps: dict[int, dict[str, Any]] = {}
    for line in (Path(two_nodes["run_dir"]) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    training = {step: values for step, values in steps.items() if "timing_s/step" in values}
    assert sorted(training) == list(range(1, STEPS + 1))
    for values in training.values():
        assert values["credit/fallback_rate"] == 0.0 and values["credit/failed_sessions"] == 0.0
        assert values["credit/sessions"] == 8.0


def test_advantages_equal_the_credit_core(two_nodes: dict[str, Any]) -> None:
    check = two_nodes["check"]
    assert check is not None, two_nodes["check_err"][-3000:]
    steps = check["iapo"]["steps"]
    assert [step["step"] for step in steps] == list(range(1, STEPS + 1))
    for step in steps:
        assert step["max_abs_diff"] <= 1e-6 and step["trainer_actor_diff"] == 0.0 and not step["problems"], step
    assert any(step["nonzero_tokens"] > 0 for step in steps)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def test_everything_it_started_is_stopped(two_nodes: dict[str, Any]) -> None:
    def running(pid: int) -> bool:
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"

    assert two_nodes["started"] and not [pid for pid in two_nodes["started"] if running(pid)]
    # the processes of the cluster just before the stop (the nodes' daemons and the workers they still
    # had): none of them (the same PID with the same start time) is left
    before_stop = two_nodes["before_stop"]
    assert before_stop
    left = {pid: started for pid, started in before_stop.items() if _start_time(pid) == started}
    assert not left, {pid: _command(pid) for pid in left}
    assert not running(two_nodes["stub_pid"])
    assert not Path(two_nodes["cluster_dir"]).exists()
