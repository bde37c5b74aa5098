"""The call protocol between the hidden tests and the agent's code (``envs/coding/remote_objects``).

Server and client run in this process here (a thread, two pipes); the sandbox tests run them in
two processes with the server jailed.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_credit.envs.coding import remote_objects as remote
from verl_credit.envs.coding.hidden_tests import agent_module_names

AGENT_MODULE = """
class Box:
    def __init__(self, items):
        self.items = list(items)
        self.label = "box"

    def __len__(self):
        return len(self.items)

    def __contains__(self, item):
        return item in self.items

    def __getitem__(self, key):
        return self.items[key]

    def __setitem__(self, key, value):
        self.items[key] = value

    def __iter__(self):
        return iter(self.items)


class Anything:
    def __eq__(self, other):
        return True


class Loud(int):
    def __eq__(self, other):
        return True


def echo(value):
    return value

def anything():
    return Anything()

def loud(n):
    return Loud(n)

def fail(kind):
    if kind == "value":
        raise ValueError("bad value")
    if kind == "custom":
        class Oops(Exception):
            pass
        raise Oops("custom")
    raise SystemExit(3)

def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value

def hang():
    import time
    time.sleep(60)

def huge():
    return "x" * (9 * 1024 * 1024)
"""


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[object, remote._Connection]]:
    """A served ``agentpkg`` module (a server thread on two pipes) and the client's connection.

    The proxy importer itself needs two processes (an import inside the server would re-enter the
    client's finder here); the sandbox tests cover it end to end.
    """
    package = tmp_path / "agentpkg"
    package.mkdir()
    (package / "__init__.py").write_text(AGENT_MODULE)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    server = threading.Thread(target=remote.serve, args=(requests_read, replies_write, str(tmp_path)), daemon=True)
    server.start()
    connection = remote._Connection(remote._Lines(replies_read, requests_write, time.monotonic() + 20))
    try:
        yield connection.request("import", module="agentpkg"), connection
    finally:
        os.close(requests_write)
        server.join(timeout=5)
        for fd in (requests_read, replies_read, replies_write):
            os.close(fd)
        for name in [n for n in sys.modules if n.split(".")[0] == "agentpkg"]:
            del sys.modules[name]
        sys.path[:] = [p for p in sys.path if p != str(tmp_path)]


def test_values_round_trip_as_builtin_types(agent: tuple[object, remote._Connection]) -> None:
    module, _ = agent
    values = [None, True, 0, -(2**80), 2.5, "ü", b"\x00\xff", [1, [2]], (1, "a"), {"k": [1]}, {3, 4}, frozenset({5})]
    for value in values:
        back = module.echo(value)
        assert back == value and type(back) is type(value)
    assert math.isnan(module.echo(float("nan"))) and module.echo(float("-inf")) == float("-inf")
    assert module.echo({(1, 2): "tuple key"}) == {(1, 2): "tuple key"}


def test_objects_stay_remote_and_compare_by_identity(agent: tuple[object, remote._Connection]) -> None:
    module, _ = agent
    box = module.Box([1, 2, 3])
    assert isinstance(box, remote.RemoteObject)
    assert len(box) == 3 and 2 in box and 7 not in box and box[0] == 1 and list(box) == [1, 2, 3]
    box[0] = 9
    assert box[0] == 9 and box.label == "box" and box.items == [9, 2, 3]
    assert module.echo(box) == box  # a handle passed back is the same object
    # an object that equals everything cannot pass a comparison: __eq__ is never forwarded
    assert module.anything() != "expected" and not (module.anything() == 1)
    # a built-in subclass arrives as the plain value it holds (its __eq__ stays behind)
    forged = module.loud(4)
    assert type(forged) is int and forged == 4 and forged != 5


def test_exceptions_are_rebuilt_by_name_and_only_as_exceptions(agent: tuple[object, remote._Connection]) -> None:
    module, _ = agent
    with pytest.raises(ValueError, match="bad value"):
        module.fail("value")
    with pytest.raises(remote.RemoteError, match="Oops: custom"):
        module.fail("custom")
    with pytest.raises(remote.RemoteError, match="SystemExit"):  # never exits the test process
        module.fail("exit")
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        agent[1].request("import", module="agentpkg.missing")


def test_deep_and_large_answers_do_not_break_the_client(agent: tuple[object, remote._Connection]) -> None:
    module, _ = agent
    deep = module.nested(remote.MAX_VALUE_DEPTH + 10)  # the deep tail stays a handle
    assert isinstance(deep, list)
    with pytest.raises(remote.RemoteError, match="ProtocolError"):
        module.huge()  # over the message cap: an error answer, the connection survives
    assert module.echo(1) == 1


def test_local_callables_are_refused() -> None:
    connection = remote._Connection(remote._Lines(-1, -1))
    with pytest.raises(TypeError, match="local callable"):
        connection.encode(len)
    with pytest.raises(TypeError, match="cannot pass"):
        connection.encode([object()])


def test_a_silent_server_fails_the_call_at_the_deadline() -> None:
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    try:
        lines = remote._Lines(replies_read, requests_write, time.monotonic() + 0.3)
        connection = remote._Connection(lines)
        with pytest.raises(remote.ProtocolError, match="deadline"):  # the test's timeout guards a hang
            connection.request("import", module="x")
        os.write(replies_write, b"not json\n")
        lines.deadline = None
        with pytest.raises(remote.ProtocolError, match="not JSON"):
            connection.request("import", module="x")
    finally:
        for fd in (requests_read, requests_write, replies_read, replies_write):
            os.close(fd)


def test_names_the_test_process_can_import_itself_are_never_served(tmp_path: Path) -> None:
    for name in ("json", "pytest", "textutil"):
        (tmp_path / f"{name}.py").write_text("X = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    (tmp_path / "test_hidden_x.py").write_text("")
    assert agent_module_names(tmp_path, exclude=["test_hidden_x"]) == ["json", "pytest", "textutil"]
    finder_count = len(sys.meta_path)
    read_fd, write_fd = os.pipe()
    try:
        remote.install_remote_importer(["json", "pytest", "textutil"], read_fd, write_fd, None)
        assert sys.meta_path[0].names == frozenset({"textutil"})
        # the task's own packages are served even when the host has a package of that name
        remote.install_remote_importer(["pluggy"], read_fd, write_fd, None, task_names=["pytest", "os", "stats"])
        assert sys.meta_path[0].names == frozenset({"pytest", "stats"})
    finally:
        del sys.meta_path[: len(sys.meta_path) - finder_count]
        os.close(read_fd)
        os.close(write_fd)
