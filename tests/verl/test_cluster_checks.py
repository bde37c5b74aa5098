"""Start-up checks of the cluster (``verl_credit.verl.cluster_checks``): which endpoints, loopback URLs
on nodes with several addresses, every endpoint probed from every node, a shared checkpoint folder.

The node lists are faked (``ray.nodes()``'s shape) and the per-node task is an injected runner,
except in the last test: a real two-node Ray cluster on 127.0.0.1 (``tests/local_ray_cluster.py``)
where the probe task runs on each node against a loopback stub server.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from verl_credit.verl.cluster_checks import (
    Endpoint,
    NodeProbe,
    RayNode,
    alive_nodes,
    check_cluster,
    check_loopback,
    check_probes,
    is_loopback_url,
    probe_endpoint,
    probe_nodes,
    run_endpoints,
)
from verl_credit.verl.settings import load_settings

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from openai_stub_server import OpenAIStubServer, unused_port  # noqa: E402


def _node(node_id: str, address: str, cpus: float = 8.0, alive: bool = True) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": address,
        "NodeManagerHostname": f"host-{node_id}",
        "Resources": {"CPU": cpus, "GPU": 8.0},
    }


def _settings(**credit: Any):
    return load_settings({"estimator": "iapo", **credit})


LLM_ANNOTATOR = {"name": "llm", "base_urls": ["http://annot-a:8000/v1", "http://annot-b:8001/v1"], "model": "m"}
TAU2_USER = {"name": "tau2", "options": {"user": {"base_urls": ["http://127.0.0.1:8100/v1"], "model": "u"}}}


def test_run_endpoints_lists_the_annotator_and_the_simulated_user() -> None:
    endpoints = run_endpoints(_settings(annotator=LLM_ANNOTATOR, env=TAU2_USER))
    assert [(e.role, e.url, e.key) for e in endpoints] == [
        ("annotator", "http://annot-a:8000/v1", "credit.annotator.base_urls"),
        ("annotator", "http://annot-b:8001/v1", "credit.annotator.base_urls"),
        ("simulated user", "http://127.0.0.1:8100/v1", "credit.env.options.user.base_urls"),
    ]
    # the rule annotator calls nothing; tau2 without a URL calls its default; the llm user its own URL
    assert [e.url for e in run_endpoints(_settings(env={"name": "tau2"}))] == ["http://127.0.0.1:8000/v1"]
    user = {"name": "llm", "base_url": "http://user:9/v1", "model": "u", "trust_env": True}
    (endpoint,) = run_endpoints(_settings(user=user))
    assert endpoint.key == "credit.user.base_url" and endpoint.trust_env
    # one endpoint serving both roles is probed once
    shared = {"name": "llm", "base_urls": ["http://127.0.0.1:8100/v1"], "model": "m"}
    assert len(run_endpoints(_settings(annotator=shared, env=TAU2_USER))) == 1


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.4.5.6/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://0.0.0.0:8000/v1", True),
        ("http://10.0.0.7:8000/v1", False),
        ("http://node-b.cluster:8000/v1", False),
    ],
)
def test_is_loopback_url(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_alive_nodes_are_those_verl_places_agent_loop_workers_on() -> None:
    nodes = alive_nodes([_node("a", "10.0.0.1"), _node("b", "10.0.0.2", alive=False), _node("c", "10.0.0.3", cpus=0)])
    assert nodes == [RayNode("a", "10.0.0.1", "host-a")]


def test_a_loopback_url_is_refused_when_the_nodes_have_different_addresses() -> None:
    endpoints = run_endpoints(_settings(annotator=LLM_ANNOTATOR, env=TAU2_USER))
    two_hosts = alive_nodes([_node("a", "10.0.0.1"), _node("b", "10.0.0.2")])
    with pytest.raises(
        ValueError, match=r"credit\.env\.options\.user\.base_urls: .*127\.0\.0\.1:8100.*10\.0\.0\.1, 10\.0\.0\.2"
    ):
        check_loopback(endpoints, two_hosts)
    # one address (one machine, even with two Ray nodes): the loopback reaches the same server
    check_loopback(endpoints, alive_nodes([_node("a", "127.0.0.1"), _node("b", "127.0.0.1")]))
    # no loopback URL: nothing to refuse
    check_loopback(run_endpoints(_settings(annotator=LLM_ANNOTATOR)), two_hosts)


def test_check_cluster_refuses_loopback_before_probing() -> None:
    def never(*args: Any) -> dict[str, Any]:
        raise AssertionError("probed despite the loopback URL")

    settings = _settings(annotator=LLM_ANNOTATOR, env=TAU2_USER)
    config = {"trainer": {"nnodes": 2, "default_local_dir": "/unused"}}
    with pytest.raises(ValueError, match="loopback"):
        check_cluster(config, settings, nodes=[_node("a", "10.0.0.1"), _node("b", "10.0.0.2")], run=never)


def test_probe_endpoint_over_http() -> None:
    with OpenAIStubServer() as server:
        assert probe_endpoint(server.base_url, 5.0) is None
        assert "HTTP 404" in str(probe_endpoint(server.url + "/nope", 5.0))  # /nope/models: not a /v1 base URL
    dead = f"http://127.0.0.1:{unused_port()}/v1"
    assert "ConnectError" in str(probe_endpoint(dead, 5.0))


def test_probe_endpoint_never_reads_the_body() -> None:
    """A server whose /models body never ends (chunked, 1 MiB chunks, gzip-declared): the probe
    answers from the status line, within its timeout, holding no body."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(20)
    sent: list[int] = []

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            chunk = b"%x\r\n" % (1 << 20) + b"\0" * (1 << 20) + b"\r\n"
            total = 0
            try:
                while total < 4 << 30:
                    connection.sendall(chunk)
                    total += 1 << 20
            except OSError:  # the client closed the connection
                pass
            sent.append(total)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        host, port = listener.getsockname()
        assert probe_endpoint(f"http://{host}:{port}/v1", 10.0) is None
        server.join(timeout=20)
        assert sent and sent[0] < 1 << 30, sent  # the client hung up long before 1 GiB
    finally:
        listener.close()


def _fake_runner(per_node: dict[str, Any]):
    calls: list[tuple[list[str], list[tuple[str, bool]], str | None]] = []

    def run(nodes, urls, timeout_s, marker):
        calls.append(([n.node_id for n in nodes], list(urls), marker))
        return {node_id: per_node[node_id](urls, marker) for node_id in [n.node_id for n in nodes]}

    return run, calls


def _answer_all(urls, marker):
    return {"results": [(url, None) for url, _ in urls], "marker_seen": None if marker is None else True}


def test_a_node_that_cannot_reach_an_endpoint_fails_naming_node_and_url(tmp_path: Path) -> None:
    settings = _settings(annotator=LLM_ANNOTATOR)

    def node_b(urls, marker):
        return {
            "results": [(url, "ConnectError: no route" if "annot-b" in url else None) for url, _ in urls],
            "marker_seen": True,
        }

    run, calls = _fake_runner({"a": _answer_all, "b": node_b})
    config = {"trainer": {"nnodes": 2, "default_local_dir": str(tmp_path / "ckpt")}}
    nodes = [_node("a", "10.0.0.1"), _node("b", "10.0.0.2")]
    with pytest.raises(RuntimeError) as failure:
        check_cluster(config, settings, nodes=nodes, run=run)
    message = str(failure.value)
    assert "node 10.0.0.2 (host-b, Ray node b)" in message
    assert "annotator endpoint http://annot-b:8001/v1 (credit.annotator.base_urls) does not answer" in message
    assert "10.0.0.1" not in message  # node a reached both
    # one task per node with every URL; the marker was written into the checkpoint folder, then removed
    ((node_ids, urls, marker),) = calls
    assert node_ids == ["a", "b"] and [u for u, _ in urls] == list(LLM_ANNOTATOR["base_urls"])
    assert marker is not None and marker.startswith(str(tmp_path / "ckpt")) and not Path(marker).exists()


def test_every_node_must_see_the_checkpoint_folder_when_nnodes_is_above_one(tmp_path: Path) -> None:
    settings = _settings()  # no endpoint: only the folder is checked

    def blind(urls, marker):
        return {"results": [], "marker_seen": False}

    run, _ = _fake_runner({"a": _answer_all, "b": blind})
    nodes = [_node("a", "10.0.0.1"), _node("b", "10.0.0.2")]
    config = {"trainer": {"nnodes": 2, "default_local_dir": str(tmp_path / "ckpt")}}
    with pytest.raises(RuntimeError, match=r"node 10\.0\.0\.2 .*does not see the file the trainer wrote into trainer"):
        check_cluster(config, settings, nodes=nodes, run=run)
    # one node: nothing to share, and without endpoints nothing runs at all
    run_one, calls = _fake_runner({"a": _answer_all})
    assert check_cluster({"trainer": {"nnodes": 1}}, settings, nodes=nodes[:1], run=run_one) == []
    assert calls == []


def test_a_probe_that_did_not_run_is_a_failure() -> None:
    endpoint = Endpoint("annotator", "http://annot:8000/v1", "credit.annotator.base_urls")
    node = RayNode("b", "10.0.0.2", "host-b")
    probes = probe_nodes([endpoint], [node], timeout_s=1.0, run=lambda *a: {"b": TimeoutError("did not finish")})
    assert probes == [NodeProbe(node, error="TimeoutError: did not finish")]
    with pytest.raises(RuntimeError, match=r"Ray node b\): the probe did not run: TimeoutError"):
        check_probes(probes, [endpoint], None)


def test_switched_off_nothing_runs() -> None:
    settings = _settings(annotator=LLM_ANNOTATOR, env=TAU2_USER, session={"probe_endpoints": False})
    nodes = [_node("a", "10.0.0.1"), _node("b", "10.0.0.2")]
    assert check_cluster({"trainer": {"nnodes": 2}}, settings, nodes=nodes) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_probe_runs_on_each_node_of_a_real_two_node_cluster() -> None:
    """Two Ray nodes on 127.0.0.1 (1 CPU each), one probe task pinned to each: both reach the stub
    server, neither reaches a closed port; then every process the cluster started is gone."""
    from local_ray_cluster import LocalRayCluster, RayNodeSpec, descendants

    ray_bin = str(Path(sys.executable).with_name("ray"))
    dead = f"http://127.0.0.1:{unused_port()}/v1"
    with OpenAIStubServer() as server:
        cluster = LocalRayCluster(
            ray_bin,
            [RayNodeSpec(1, resources={"node_a": 1}), RayNodeSpec(1, resources={"node_b": 1})],
            start_timeout_s=60,
        )
        with cluster:
            started = [p.pid for p in cluster.processes]
            tree = [pid for leader in started for pid in descendants(leader)]
            nodes = cluster.nodes()
            assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
            found = cluster.query(
                "from verl_credit.verl.cluster_checks import Endpoint, alive_nodes, probe_nodes\n"
                f"endpoints = [Endpoint('annotator', {server.base_url!r}, 'k'), Endpoint('annotator', {dead!r}, 'k')]\n"
                "probes = probe_nodes(endpoints, alive_nodes(ray.nodes()), timeout_s=5.0)\n"
                "print(json.dumps([[p.node.node_id, list(p.answered), [u for u, _ in p.failures], p.error] "
                "for p in probes]))",
                timeout_s=120,
            )
        assert sorted(node_id for node_id, *_ in found) == sorted(n["NodeID"] for n in nodes)
        for _, answered, failed, error in found:
            assert error is None and answered == [server.base_url] and failed == [dead]
        assert [r.path for r in server.requests].count("/v1/models") == 2  # once from each node
    for pid in [*started, *tree]:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
