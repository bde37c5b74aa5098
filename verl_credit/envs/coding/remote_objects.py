"""Call the agent's code from another process: the hidden tests never run beside it.

The hidden-test verdict is the reward, so it must not be computable by the code under test. If the
agent's modules were imported into the pytest process that runs the hidden tests, that code could
monkeypatch pytest, the reporter or the channel in memory and report any verdict. Instead two
processes talk over two pipes:

* the **agent server** (:func:`serve`) runs jailed, in the evaluation copy of the agent's tree; it
  imports the agent's modules and runs the calls it is asked for;
* the **test process** (:func:`install_remote_importer`, then pytest with the hidden tests) runs on
  the trainer's side, outside the jail. Importing one of the agent's top-level modules gives a
  proxy module; its attributes are proxies of remote objects, and calling one sends the call over.

What crosses the pipe is data, never code: one JSON object per line (no pickle). Results that are
plain data (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``, ``tuple``,
``dict``, ``set``, ``frozenset``, nested) come back as *values*, normalized to the built-in types
(an ``int`` subclass with a forged ``__eq__`` arrives as a plain ``int``); everything else stays in
the server and comes back as a handle. The comparisons of the hidden tests therefore run in the test
process, on values: the agent's code can only *answer* calls, and answering them right is solving
the task. A proxy compares equal only to itself (its ``__eq__`` is never forwarded: an object that
equals everything cannot pass an ``assert result == expected``).

Supported in hidden tests: calls with data arguments (passed by value) or proxies, attribute reads,
``len``, ``in``, indexing, item assignment and deletion, iteration (as a list), ``bool``, ``repr``
and ``str``; an exception raised by the agent's code is re-raised as the built-in exception of the
same name (``ValueError``, ...), else as :class:`RemoteError`. ``isinstance`` against a remote class
and passing a local callable are not supported.

This file is stdlib-only and runs as ``python -I -B -c <this file's text> ...`` on both sides (it is
read, never imported, by the jailed side).
"""

import base64
import builtins
import importlib
import importlib.machinery
import importlib.util
import json
import os
import select
import sys
import time
import types

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""A request or response longer than this is refused (the call fails; nothing is buffered)."""
MAX_VALUE_DEPTH = 64
"""Data nested deeper than this is sent as a handle (server) or refused (client)."""


class RemoteError(Exception):
    """An exception of the agent's code that has no built-in counterpart (its type name and text)."""


class ProtocolError(RuntimeError):
    """The other process broke the protocol (closed the pipe, sent garbage, answered too late)."""


# ----------------------------------------------------------------------------------------- codec


def _plain(value, depth, handle_of):
    """``value`` as JSON-safe data; objects that are not plain data become ``{"h": id}``.

    Built-in scalars are rebuilt through their base type's own methods, so a subclass with a forged
    ``__eq__``, ``__repr__`` or ``__str__`` arrives as the plain value it holds.
    """
    if value is None or isinstance(value, bool):
        return None if value is None else bool(int.__index__(value))
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if depth >= MAX_VALUE_DEPTH:
        return {"h": handle_of(value)}
    if isinstance(value, bytes | bytearray):
        return {"bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list | tuple | set | frozenset):
        tag = "list" if isinstance(value, list) else "tuple" if isinstance(value, tuple) else "set"
        if isinstance(value, frozenset):
            tag = "frozenset"
        return {tag: [_plain(item, depth + 1, handle_of) for item in list(value)]}
    if isinstance(value, dict):
        return {"dict": [[_plain(k, depth + 1, handle_of), _plain(v, depth + 1, handle_of)] for k, v in value.items()]}
    return {"h": handle_of(value)}


def _unplain(data, depth, object_of):
    """Inverse of :func:`_plain`; ``object_of(id)`` resolves a handle."""
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if depth >= MAX_VALUE_DEPTH + 1 or not isinstance(data, dict) or len(data) != 1:
        raise ProtocolError(f"malformed value {str(data)[:80]!r}")
    ((tag, body),) = data.items()
    if tag == "bytes" and isinstance(body, str):
        return base64.b64decode(body)
    if tag == "h" and isinstance(body, int):
        return object_of(body)
    if tag in ("list", "tuple", "set", "frozenset") and isinstance(body, list):
        items = [_unplain(item, depth + 1, object_of) for item in body]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and isinstance(body, list):
        pairs = []
        for pair in body:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError("malformed dict entry")
            pairs.append((_unplain(pair[0], depth + 1, object_of), _unplain(pair[1], depth + 1, object_of)))
        return dict(pairs)
    raise ProtocolError(f"malformed value tag {tag!r}")


class _Lines:
    """Newline-delimited JSON over two raw file descriptors, with a size cap and a deadline."""

    def __init__(self, in_fd, out_fd, deadline=None):
        self.in_fd, self.out_fd, self.deadline = in_fd, out_fd, deadline
        self.buffer = b""

    def send(self, message):
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
        while data:
            data = data[os.write(self.out_fd, data) :]

    def receive(self):
        while b"\n" not in self.buffer:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0 or not select.select([self.in_fd], [], [], left)[0]:
                    raise ProtocolError("no answer before the deadline")
            chunk = os.read(self.in_fd, 65536)
            if not chunk:
                raise ProtocolError("the other process closed the pipe")
            self.buffer += chunk
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"message over the {MAX_MESSAGE_BYTES}-byte limit")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise ProtocolError(f"not JSON: {exc}") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message must be a JSON object")
        return message


# ---------------------------------------------------------------------------------------- server


def serve(in_fd, out_fd, root):
    """Answer requests until the test process closes its end (the jailed side)."""
    sys.path.insert(0, root)
    objects = {}
    ids = {}

    def handle_of(value):
        key = id(value)
        if key not in ids:
            ids[key] = len(objects) + 1
            objects[ids[key]] = value  # kept alive for the whole run: ids are never reused
        return ids[key]

    def object_of(number):
        if number not in objects:
            raise ProtocolError(f"unknown handle {number}")
        return objects[number]

    lines = _Lines(in_fd, out_fd)
    while True:
        try:
            request = lines.receive()
        except ProtocolError:
            return
        try:
            result = _apply(request, object_of)
            reply = {"ok": _plain(result, 0, handle_of)}
        except BaseException as exc:  # every failure of the agent code (sys.exit too) is an answer
            reply = {"error": [type(exc).__name__, str(exc)[:2000]]}
        try:
            lines.send(reply)
        except ProtocolError as exc:
            lines.send({"error": ["ProtocolError", str(exc)]})


def _apply(request, object_of):
    op = request.get("op")
    if op == "import":
        return importlib.import_module(str(request["module"]))
    target = object_of(request.get("h"))
    args = [_unplain(a, 0, object_of) for a in request.get("args", [])]
    if op == "getattr":
        return getattr(target, str(request["name"]))
    if op == "call":
        kwargs = {str(k): _unplain(v, 0, object_of) for k, v in dict(request.get("kwargs", {})).items()}
        return target(*args, **kwargs)
    if op == "len":
        return len(target)
    if op == "contains":
        return args[0] in target
    if op == "getitem":
        return target[args[0]]
    if op == "setitem":
        target[args[0]] = args[1]
        return None
    if op == "delitem":
        del target[args[0]]
        return None
    if op == "list":
        return list(target)
    if op == "bool":
        return bool(target)
    if op == "repr":
        return repr(target)[:2000]
    if op == "str":
        return str(target)[:2000]
    raise ValueError(f"unknown operation {op!r}")


# ---------------------------------------------------------------------------------------- client


class _Connection:
    def __init__(self, lines):
        self.lines = lines
        self.proxies = {}  # handle -> its one proxy, so that the same remote object is the same proxy

    def request(self, op, handle=None, *args, **fields):
        message = {"op": op, **fields}
        if handle is not None:
            message["h"] = handle
        if args:
            message["args"] = [self.encode(a) for a in args]
        self.lines.send(message)
        reply = self.lines.receive()
        if "ok" in reply:
            return _unplain(reply["ok"], 0, self.proxy)
        error = reply.get("error")
        if not isinstance(error, list) or len(error) != 2:
            raise ProtocolError("malformed reply")
        name, text = str(error[0]), str(error[1])
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin is not ProtocolError:
            raise builtin(text)
        raise RemoteError(f"{name}: {text}")

    def encode(self, value):
        if isinstance(value, RemoteObject):
            return {"h": object.__getattribute__(value, "_handle")}
        if callable(value) and not isinstance(value, type):
            raise TypeError("a local callable cannot be passed to the agent's code")
        return _plain(value, 0, _refuse_handle)

    def proxy(self, number):
        if number not in self.proxies:
            self.proxies[number] = RemoteObject(self, number)
        return self.proxies[number]


def _refuse_handle(value):
    raise TypeError(f"cannot pass a {type(value).__name__} to the agent's code (data or proxies only)")


class RemoteObject:
    """An object that lives in the agent server. Equality and hashing are by identity, locally."""

    __slots__ = ("_connection", "_handle")

    def __init__(self, connection, handle):
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_handle", handle)

    def _ask(self, op, *args, **fields):
        return object.__getattribute__(self, "_connection").request(
            op, object.__getattribute__(self, "_handle"), *args, **fields
        )

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __call__(self, *args, **kwargs):
        connection = object.__getattribute__(self, "_connection")
        return self._ask("call", *args, kwargs={k: connection.encode(v) for k, v in kwargs.items()})

    def __len__(self):
        return self._ask("len")

    def __contains__(self, item):
        return self._ask("contains", item)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __delitem__(self, key):
        self._ask("delitem", key)

    def __iter__(self):
        return iter(self._ask("list"))

    def __bool__(self):
        return bool(self._ask("bool"))

    def __repr__(self):
        try:
            return f"<remote {self._ask('repr')}>"
        except Exception:  # a repr must not raise inside pytest reporting
            return "<remote object>"

    def __str__(self):
        return str(self._ask("str"))

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)


class _RemoteModule(types.ModuleType):
    def __init__(self, name, connection, handle):
        super().__init__(name)
        self.__path__ = []  # a package, so that submodules import through the finder too
        self._remote = RemoteObject(connection, handle)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_remote"], name)


class _RemoteFinder:
    """Meta-path finder: the agent's top-level names import as proxy modules."""

    def __init__(self, names, connection):
        self.names, self.connection = frozenset(names), connection

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        handle = self.connection.request("import", module=spec.name)
        if not isinstance(handle, RemoteObject):
            raise ImportError(f"{spec.name} is not a module")
        return _RemoteModule(spec.name, self.connection, object.__getattribute__(handle, "_handle"))

    def exec_module(self, module):
        return None


def install_remote_importer(names, in_fd, out_fd, deadline, task_names=()):
    """Make the agent's top-level module names import as proxies of the server's modules.

    ``task_names`` (the task repository's own packages) are always served, even where a package
    of that name is installed here; other ``names`` (files the agent added) only when this process
    cannot import that name itself -- an agent file ``json.py`` or ``pluggy.py`` must not replace
    a module of the test machinery. Standard-library names are never served.
    """
    served = {n for n in task_names if n.isidentifier() and n not in sys.stdlib_module_names}
    served |= {n for n in names if n.isidentifier() and n not in sys.stdlib_module_names and not _importable(n)}
    connection = _Connection(_Lines(in_fd, out_fd, deadline))
    sys.meta_path.insert(0, _RemoteFinder(sorted(served), connection))


def _importable(name):
    try:
        return name in sys.modules or importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True


def install_from_environment():
    """Test-process entry: names, fds and seconds left from ``VC_RPC_*`` (removed from the environment)."""
    names = [n for n in os.environ.pop("VC_RPC_MODULES").split(",") if n]
    task_names = [n for n in os.environ.pop("VC_RPC_TASK_MODULES", "").split(",") if n]
    in_fd = int(os.environ.pop("VC_RPC_IN"))
    out_fd = int(os.environ.pop("VC_RPC_OUT"))
    deadline = time.monotonic() + float(os.environ.pop("VC_RPC_SECONDS"))
    install_remote_importer(names, in_fd, out_fd, deadline, task_names)


def serve_from_environment():
    """Server entry (jailed): fds from ``VC_RPC_*``; the agent's tree is the working directory."""
    in_fd = int(os.environ.pop("VC_RPC_IN"))
    out_fd = int(os.environ.pop("VC_RPC_OUT"))
    serve(in_fd, out_fd, os.getcwd())
