"""A Ray cluster of several nodes on this machine, all on 127.0.0.1, started and stopped by PID.

Each node is one ``ray start --block`` process in its own session (the head first, then
``ray start --address LOCALHOST:<port>`` for the others), with its own explicit resources and its
own ports (the defaults -- dashboard agent 52365, client server 10001 -- would collide with each
other and with any other Ray on the machine). Everything lives under one short temporary folder.

The address: Ray rewrites ``127.0.0.1`` and ``localhost`` -- in ``--node-ip-address``, in ``ray start
--address`` and in ``ray.init(address=...)`` -- to the machine's outward address (``resolve_ip_for_localhost``),
which this cluster must not use. So:

* the head runs with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's switch that makes it take the
  loopback address as its own (the switch only refuses to *join* a cluster, which a head does not);
* everything else names the head ``LOCALHOST:<port>`` (:attr:`LocalRayCluster.address`): the same
  127.0.0.1 from ``/etc/hosts`` (name lookups ignore case), but not a spelling Ray rewrites; a node
  that joins through it takes the address it reaches the head from, 127.0.0.1 again.

Every node (``ray.nodes()``' ``NodeManagerAddress``) and every worker is then on 127.0.0.1. The
cluster's processes run with ``RAY_AUTH_MODE=disabled`` (a token left by another Ray on the machine
would otherwise switch token authentication on for the head only).

:meth:`LocalRayCluster.stop` stops only what :meth:`start` started: it sends SIGTERM to every node's
``ray start`` process and to all their descendants (read from ``/proc``: gcs_server, raylet, agents,
workers), waits, then SIGKILLs whatever is left of those PIDs, and removes the folder. Nothing is
looked up by name, and ``ray stop`` (which stops every Ray of the machine) is never called.

Typical use::

    with LocalRayCluster("ray", [RayNodeSpec(num_cpus=1), RayNodeSpec(num_cpus=1)]) as cluster:
        subprocess.run([python, "-c", f"import ray; ray.init(address={cluster.address!r})"])
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LocalRayCluster", "RayNodeSpec", "descendants", "free_port"]


@dataclass(frozen=True)
class RayNodeSpec:
    """One node's resources (``num_gpus`` are logical: the CPU platform schedules on them)."""

    num_cpus: int
    num_gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children() -> dict[int, list[int]]:
    """parent PID -> child PIDs, from ``/proc/<pid>/stat``."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    tree = _children()
    found: list[int] = []
    stack = list(tree.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(tree.get(child, []))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class LocalRayCluster:
    """``specs[0]`` is the head; every node listens on 127.0.0.1 only."""

    def __init__(
        self,
        ray_bin: str,
        specs: list[RayNodeSpec],
        *,
        python: str | None = None,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 60.0,
    ):
        if not specs:
            raise ValueError("a cluster needs at least one node")
        self.ray_bin = ray_bin
        self.python = python or str(Path(ray_bin).with_name("python"))
        self.specs = list(specs)
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.address = f"LOCALHOST:{self.port}"  # 127.0.0.1 (module docstring)
        self.temp_dir = ""
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def __enter__(self) -> LocalRayCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _node_args(self, spec: RayNodeSpec) -> list[str]:
        args = [
            "--block",
            f"--num-cpus={spec.num_cpus}",
            f"--num-gpus={spec.num_gpus}",
            f"--temp-dir={self.temp_dir}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
        ]
        if spec.resources:
            args.append(f"--resources={json.dumps(spec.resources)}")
        return args

    def start(self) -> None:
        """Start the head, then the other nodes; return once every node is alive in the cluster."""
        # short: Ray's unix socket paths under it must stay below 107 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="vcray", dir="/tmp")
        head = [
            self.ray_bin,
            "start",
            "--head",
            f"--port={self.port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-port={free_port()}",
            "--include-dashboard=false",
            *self._node_args(self.specs[0]),
        ]
        try:
            self._launch(head, "head", {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
            self.wait_for_nodes(1)
            for number, spec in enumerate(self.specs[1:], start=1):
                self._launch(
                    [self.ray_bin, "start", f"--address={self.address}", *self._node_args(spec)], f"node{number}"
                )
            self.wait_for_nodes(len(self.specs))
        except BaseException:
            self.stop()
            raise

    def _launch(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        log = Path(self.temp_dir) / f"{name}.log"
        self.logs.append(log)
        with log.open("w") as handle:
            self.processes.append(
                subprocess.Popen(
                    argv,
                    env={**self.env, **(env or {})},
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def query(self, code: str, timeout_s: float = 60.0) -> Any:
        """Run ``code`` (which prints one JSON value last) in a driver connected to the cluster."""
        program = f"import json, ray\nray.init(address={self.address!r}, logging_level='ERROR')\n{code}\n"
        done = subprocess.run(
            [self.python, "-c", program], env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"query failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def nodes(self) -> list[dict[str, Any]]:
        """``ray.nodes()`` of the alive nodes: NodeID, address, resources."""
        return self.query(
            "print(json.dumps([{'NodeID': n['NodeID'], 'NodeManagerAddress': n['NodeManagerAddress'], "
            "'Resources': n['Resources']} for n in ray.nodes() if n['Alive']]))"
        )

    def actors(self) -> list[dict[str, Any]]:
        """Every actor the cluster ran (dead ones included): class name, node id, state."""
        return self.query(
            "from ray._private.state import actors\n"
            "print(json.dumps([{'class_name': a['ActorClassName'], 'node_id': a['Address']['NodeID'], "
            "'state': a['State']} for a in actors().values()]))"
        )

    def wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"ray start exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                if len(self.nodes()) >= count:
                    return
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                last = exc
            time.sleep(1.0)
        raise TimeoutError(f"{count} Ray node(s) not alive within {self.start_timeout_s:.0f} s: {last}")

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every process the nodes started (module docstring) and remove the folder."""
        pids: list[int] = []
        for process in self.processes:
            pids += [process.pid, *descendants(process.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            for process in self.processes:
                process.poll()
            time.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sys.stderr.write(f"ray start {process.pid} did not exit\n")
        self.processes = []
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
