"""Start-up checks of the cluster, run by the credit trainer before any worker is built.

verl places the agent-loop workers -- where every session calls the annotator and the simulated
user -- round-robin on every alive Ray node with CPUs (``AgentLoopManager._init_agent_loop_workers``),
so an endpoint that answers on the launching host may not answer on another node, and a
``127.0.0.1`` URL sends each node to its own loopback. :func:`check_cluster`:

1. lists the endpoints the run's sessions call (:func:`run_endpoints`: the LLM annotator's
   ``credit.annotator.base_urls``, the environment's simulated user ``credit.env.options.user.base_urls``,
   the ``llm`` user's ``credit.user.base_url``);
2. refuses a loopback URL when the nodes have more than one IP address (:func:`check_loopback`);
3. runs one tiny Ray task pinned to each of those nodes (``NodeAffinitySchedulingStrategy``, not
   soft) that GETs ``{base_url}/models`` of every endpoint, and fails naming the node and the URL
   that did not answer (:func:`probe_nodes`);
4. with ``trainer.nnodes > 1``, checks in the same task that every node sees a file the trainer
   wrote into ``trainer.default_local_dir``: every node writes its checkpoint shards there and a
   resume reads them back, so the folder must be on storage all nodes share.

Each node's result is logged (``credit: start-up probe on node ...``). Without Ray (unit tests that
build the trainer directly) nothing runs. ``credit.session.probe_endpoints=false`` switches 2-4 off.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from verl_credit.verl.settings import CreditSettings

__all__ = [
    "Endpoint",
    "NodeProbe",
    "RayNode",
    "alive_nodes",
    "check_cluster",
    "check_loopback",
    "check_probes",
    "is_loopback_url",
    "probe_endpoint",
    "probe_node",
    "probe_nodes",
    "run_endpoints",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

#: how long a probe task may wait for a worker process on a busy node, on top of the requests
TASK_START_S = 60.0
#: the file the trainer writes into the checkpoint folder for the other nodes to find
SHARED_MARKER_PREFIX = ".verl_credit_node_check_"
#: the tau2 environment's simulated-user endpoint when its options name none (``UserSimConfig``)
TAU2_DEFAULT_USER_URL = "http://127.0.0.1:8000/v1"


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible server the sessions call."""

    role: str  # "annotator" | "simulated user"
    url: str  # base URL, ``.../v1``
    key: str  # the config key that names it
    trust_env: bool = False  # whether its client honours HTTP(S)_PROXY (the probe does the same)


@dataclass(frozen=True)
class RayNode:
    """An alive Ray node that can run agent-loop workers (it has CPUs)."""

    node_id: str
    address: str  # NodeManagerAddress: the node's IP as Ray sees it
    hostname: str


@dataclass(frozen=True)
class NodeProbe:
    """What the probe task found on one node."""

    node: RayNode
    answered: tuple[str, ...] = ()
    failures: tuple[tuple[str, str], ...] = ()  # (url, why)
    shared_dir_seen: bool | None = None  # None: not checked
    error: str | None = None  # the task itself did not run or finish


def run_endpoints(settings: CreditSettings) -> list[Endpoint]:
    """The endpoints the run's sessions call, each once (first key wins)."""
    found: list[Endpoint] = []
    annotator = settings.annotator
    if annotator.name in ("llm", "hybrid"):
        key = "credit.annotator.base_urls"
        found += [Endpoint("annotator", url, key, annotator.trust_env) for url in annotator.base_urls]
    user_options = settings.env.options.get("user") if isinstance(settings.env.options, Mapping) else None
    if isinstance(user_options, Mapping) and user_options.get("base_urls"):
        urls = user_options["base_urls"]
        urls = [urls] if isinstance(urls, str) else list(urls)
        trust = bool(user_options.get("trust_env", False))
        found += [Endpoint("simulated user", str(url), "credit.env.options.user.base_urls", trust) for url in urls]
    elif settings.env.name == "tau2" and settings.user.name == "env":
        found.append(Endpoint("simulated user", TAU2_DEFAULT_USER_URL, "credit.env.options.user.base_urls (default)"))
    user = settings.user
    if user.name == "llm" and user.base_url:
        found.append(Endpoint("simulated user", user.base_url, "credit.user.base_url", user.trust_env))
    unique: dict[str, Endpoint] = {}
    for endpoint in found:
        unique.setdefault(endpoint.url.rstrip("/"), endpoint)
    return list(unique.values())


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names this machine itself: ``localhost``, ``127.0.0.0/8``, ``::1``, ``0.0.0.0``."""
    host = (urlparse(url).hostname or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def alive_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[RayNode]:
    """The nodes of ``ray.nodes()`` that verl places agent-loop workers on: alive, with CPUs."""
    return [
        RayNode(str(node["NodeID"]), str(node.get("NodeManagerAddress", "")), str(node.get("NodeManagerHostname", "")))
        for node in nodes
        if node.get("Alive") and float((node.get("Resources") or {}).get("CPU", 0)) > 0
    ]


def check_loopback(endpoints: Sequence[Endpoint], nodes: Sequence[RayNode]) -> None:
    """Refuse a loopback endpoint when the nodes do not all share one IP address: each node would
    call its own loopback, where no server (or a different one) listens.

    Raises:
        ValueError: naming the key, the URL and the nodes' addresses.
    """
    addresses = sorted({node.address for node in nodes})
    if len(addresses) < 2:
        return
    for endpoint in endpoints:
        if is_loopback_url(endpoint.url):
            raise ValueError(
                f"{endpoint.key}: the {endpoint.role} endpoint {endpoint.url} is a loopback address, but the run's Ray "
                f"nodes have {len(addresses)} addresses ({', '.join(addresses)}); agent-loop workers run on every "
                f"node and each would call its own loopback. Use the server's hostname or IP as every node reaches it "
                f"(recipes: ANNOTATOR_BASE_URL / USER_BASE_URL, docs/cluster.md)"
            )


def probe_endpoint(url: str, timeout_s: float, trust_env: bool = False) -> str | None:
    """``None`` if ``GET {url}/models`` answers (2xx, or 401/403: the server is there and wants the
    client's key), else why not."""
    import httpx

    target = url.rstrip("/") + "/models"
    try:
        # only the status line matters: the body is never read (a server that answers with a huge
        # or gzip-bomb body costs nothing)
        with httpx.Client(timeout=timeout_s, trust_env=trust_env) as client, client.stream("GET", target) as response:
            status = response.status_code
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if 200 <= status < 300 or status in (401, 403):
        return None
    return f"GET {target} answered HTTP {status} (is the base URL right, ending in /v1?)"


def probe_node(urls: Sequence[tuple[str, bool]], timeout_s: float, marker: str | None) -> dict[str, Any]:
    """The probe task's body (runs on one node): every URL, and whether ``marker`` exists here."""
    import ray

    results = [(url, probe_endpoint(url, timeout_s, trust_env)) for url, trust_env in urls]
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "results": results,
        "marker_seen": os.path.exists(marker) if marker else None,
    }


#: runs :func:`probe_node` on each node, returns {node_id: result or an exception}
Runner = Callable[[Sequence[RayNode], Sequence[tuple[str, bool]], float, str | None], Mapping[str, Any]]


def _run_on_ray(
    nodes: Sequence[RayNode], urls: Sequence[tuple[str, bool]], timeout_s: float, marker: str | None
) -> dict[str, Any]:
    """One :func:`probe_node` task per node, pinned there (no CPU reserved: it runs even on a node
    whose CPUs the workers hold), all at once; a task that does not finish in time is an error."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(probe_node)
    refs = {
        node.node_id: task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)
        ).remote(list(urls), timeout_s, marker)
        for node in nodes
    }
    budget = TASK_START_S + timeout_s * (len(urls) + 1)
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=budget)
    done = set(ready)
    results: dict[str, Any] = {}
    for node_id, ref in refs.items():
        if ref not in done:
            ray.cancel(ref, force=True)
            results[node_id] = TimeoutError(f"the probe task did not finish within {budget:.0f} s")
            continue
        try:
            results[node_id] = ray.get(ref)
        except Exception as exc:  # the task could not run there: reported with the node
            results[node_id] = exc
    return results


def probe_nodes(
    endpoints: Sequence[Endpoint],
    nodes: Sequence[RayNode],
    *,
    timeout_s: float,
    marker: str | None = None,
    run: Runner = _run_on_ray,
) -> list[NodeProbe]:
    """Probe every endpoint from every node (``run``: on Ray by default; tests pass their own)."""
    urls = [(endpoint.url, endpoint.trust_env) for endpoint in endpoints]
    raw = run(nodes, urls, timeout_s, marker)
    probes = []
    for node in nodes:
        result = raw.get(node.node_id)
        if not isinstance(result, Mapping):
            error = result if isinstance(result, BaseException) else RuntimeError("no result")
            probes.append(NodeProbe(node, error=f"{type(error).__name__}: {error}"))
            continue
        answered = tuple(url for url, why in result["results"] if why is None)
        failures = tuple((url, str(why)) for url, why in result["results"] if why is not None)
        probes.append(NodeProbe(node, answered, failures, result.get("marker_seen")))
    return probes


def check_probes(probes: Sequence[NodeProbe], endpoints: Sequence[Endpoint], shared_dir: str | None) -> None:
    """Raise naming every node and URL that failed.

    Raises:
        RuntimeError: an endpoint did not answer on a node, a node did not run its probe, or a
            node does not see the shared checkpoint folder.
    """
    roles = {endpoint.url: f"{endpoint.role} endpoint {endpoint.url} ({endpoint.key})" for endpoint in endpoints}
    problems = []
    for probe in probes:
        where = f"node {probe.node.address} ({probe.node.hostname}, Ray node {probe.node.node_id})"
        if probe.error is not None:
            problems.append(f"{where}: the probe did not run: {probe.error}")
            continue
        problems += [f"{where}: {roles.get(url, url)} does not answer: {why}" for url, why in probe.failures]
        if shared_dir is not None and probe.shared_dir_seen is False:
            problems.append(
                f"{where}: does not see the file the trainer wrote into trainer.default_local_dir={shared_dir}; "
                f"with trainer.nnodes > 1 every node writes its checkpoint shards there and a resume reads them "
                f"back, so it must be a folder all nodes share (recipes: CKPT_DIR on a shared filesystem)"
            )
    if problems:
        raise RuntimeError("credit: start-up probe failed:\n  " + "\n  ".join(problems))


def _log_probe(probe: NodeProbe, shared_dir: str | None) -> None:
    shared = ""
    if shared_dir is not None:
        shared = ", sees the checkpoint folder" if probe.shared_dir_seen else ", does NOT see the checkpoint folder"
    logger.warning(
        "credit: start-up probe on node %s (%s, Ray node %s): %d of %d endpoint(s) answer%s",
        probe.node.address,
        probe.node.hostname,
        probe.node.node_id,
        len(probe.answered),
        len(probe.answered) + len(probe.failures),
        shared,
    )


def check_cluster(
    config: Any,
    settings: CreditSettings,
    *,
    nodes: Sequence[Mapping[str, Any]] | None = None,
    run: Runner = _run_on_ray,
) -> list[NodeProbe]:
    """Steps 2-4 of the module docstring on the running Ray cluster; returns each node's probe.

    ``nodes`` (default ``ray.nodes()``) and ``run`` (the per-node tasks) are for tests. Nothing runs without Ray, with
    ``credit.session.probe_endpoints=false``, or when there is no endpoint and one node.

    Raises:
        ValueError: a loopback endpoint on nodes with several addresses.
        RuntimeError: an endpoint that does not answer on some node, or an unshared checkpoint folder.
    """
    import ray

    if not settings.session.probe_endpoints or (nodes is None and not ray.is_initialized()):
        return []
    found = alive_nodes(ray.nodes() if nodes is None else nodes)
    endpoints = run_endpoints(settings)
    check_loopback(endpoints, found)
    trainer = config.get("trainer") or {}
    nnodes = int(trainer.get("nnodes", 1) or 1)
    shared_dir = str(Path(str(trainer.get("default_local_dir"))).expanduser().absolute()) if nnodes > 1 else None
    if not found or (not endpoints and shared_dir is None):
        return []
    marker = None
    if shared_dir is not None:
        os.makedirs(shared_dir, exist_ok=True)
        marker = os.path.join(shared_dir, f"{SHARED_MARKER_PREFIX}{uuid.uuid4().hex}")
        Path(marker).write_text(socket.gethostname(), encoding="utf-8")
    try:
        probes = probe_nodes(endpoints, found, timeout_s=settings.session.probe_timeout, marker=marker, run=run)
    finally:
        if marker is not None:
            Path(marker).unlink(missing_ok=True)
    for probe in probes:
        _log_probe(probe, shared_dir)
    check_probes(probes, endpoints, shared_dir)
    return probes
