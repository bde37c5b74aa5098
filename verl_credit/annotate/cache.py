"""Persistent annotation cache: sqlite on disk, shared by many processes (docs/design.md section 5).

Key: ``sha256`` of the canonical JSON (sorted keys, compact, UTF-8) of
``[transcript messages, annotator name, model id, prompt version]``. Value: the serialized
graph (section 2.1 JSON), with the result's ``source`` and ``uncertain`` flag beside it.

Concurrency and crash safety come from sqlite itself:

* WAL journal: readers never block writers and writers never block readers; writers from many
  processes (agent-loop workers, CLI runs) take turns on the write lock, waiting up to
  ``busy_timeout_s``;
* every write is its own transaction (``BEGIN IMMEDIATE`` ... ``INSERT OR REPLACE`` ...
  ``COMMIT``): a writer killed at any point (even ``SIGKILL`` mid-transaction) leaves either the
  committed row or nothing -- the next opener rolls the WAL back to the last commit;
* ``synchronous=NORMAL`` (the default here) is durable against process crashes; pass
  ``synchronous="FULL"`` to also survive power loss at some write cost.

Only successful annotations are stored (never a fallback), so a failure is retried next time.

Threads and processes: every thread gets its own sqlite connection (opened on its first use,
all closed by :meth:`GraphCache.close`), so a reader in one thread never waits behind a writer in
another that is waiting for a second process's write lock; the counters are guarded by a lock.
A connection belongs to the process that opened it: after a ``fork`` the cache reopens itself.
:func:`annotate_with_cache` (used by every caching annotator) does its lookups and stores on the
I/O worker pool (:func:`verl_credit.annotate.base.run_blocking_io`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_credit.annotate.base import AnnotationResult, Annotator, run_blocking_io
from verl_credit.graph import validate_graph
from verl_credit.trajectory import Trajectory

__all__ = [
    "CacheEntry",
    "CachedAnnotator",
    "GraphCache",
    "annotate_with_cache",
    "annotator_identity",
    "cache_key",
    "lookup_cached",
    "store_result",
]

_LOG = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS graphs (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    source TEXT NOT NULL,
    uncertain INTEGER NOT NULL DEFAULT 0,
    annotator TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(messages: list[dict[str, Any]], annotator: str, model: str, prompt_version: str) -> str:
    """``sha256`` hex digest of ``[messages, annotator, model, prompt_version]`` in canonical JSON."""
    payload = json.dumps(
        [messages, annotator, model, prompt_version], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def annotator_identity(annotator: Annotator) -> tuple[str, str, str]:
    """``(name, model id, prompt version)`` of an annotator, for its cache keys.

    ``model`` and ``prompt_version`` (or ``version``) are read from attributes when present;
    an annotator without them (the rule annotator) is identified by its name alone.
    """
    model = getattr(annotator, "model", "") or ""
    version = getattr(annotator, "prompt_version", None) or getattr(annotator, "version", "") or ""
    return annotator.name, str(model), str(version)


@dataclass(frozen=True)
class CacheEntry:
    """A stored annotation: the graph JSON and what produced it."""

    graph: dict[str, Any]
    source: str
    uncertain: bool


class GraphCache:
    """sqlite-backed map ``key -> graph`` with hit/miss counters.

    Faults of the file never raise a raw sqlite error at the caller:

    * a corrupted, truncated or non-database file is moved aside to ``<path>.corrupt-<timestamp>``
      (with its ``-wal``/``-shm`` files), logged with both names, counted in :attr:`rebuilt`, and
      an empty cache is built in its place (at open, or when a read or write first meets it);
    * a ``path`` that is a directory, a FIFO, a socket or a device raises ``ValueError`` naming
      it (before sqlite opens it: no journal file is created beside it);
    * a read-only location (the directory or the file not writable, a read-only mount) is opened
      read-only: hits are served, writes are skipped (:attr:`read_only`, counted in
      :attr:`skipped_writes`, logged once). A missing file in an unwritable directory is an empty
      read-only cache.

    Args:
        path: database file (created with its directory if missing).
        busy_timeout_s: how long a writer waits for another process's write lock.
        synchronous: sqlite ``synchronous`` pragma (``NORMAL`` or ``FULL``).
    """

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0, synchronous: str = "NORMAL"):
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"cache synchronous must be NORMAL, FULL or EXTRA, got {synchronous!r}")
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(
                f"annotation cache path {str(self.path)!r} is a directory; pass a database file path "
                f"(e.g. {str(self.path / 'graphs.sqlite')!r})"
            )
        if self.path.exists() and not self.path.is_file():
            # sqlite would open a FIFO (blocking) or a device and write its journal beside it
            raise ValueError(
                f"annotation cache path {str(self.path)!r} is not a regular file (a FIFO, socket or device); "
                "pass a database file path"
            )
        self.busy_timeout_s = busy_timeout_s
        self.synchronous = synchronous.upper()
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.errors = 0
        """sqlite errors swallowed by :func:`annotate_with_cache` (each also logged)."""
        self.joined = 0
        """Misses answered by an annotation of the same transcript already under way."""
        self.rebuilt = 0
        """Corrupted / non-database files moved aside (``<path>.corrupt-<timestamp>``) and rebuilt."""
        self.read_only = False
        """The location is not writable: hits are served, writes skipped (:attr:`skipped_writes`)."""
        self.skipped_writes = 0
        """Entries not stored because the cache is read-only."""
        self._in_flight: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future[Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # the counters and the registry of connections
        self._rebuild_lock = threading.Lock()  # one thread moves a corrupted file aside
        self._local = threading.local()  # this thread's (pid, generation, connection, its lock, file id)
        # every thread's connection with a lock held while it is in use, so that close() never
        # closes a connection under a statement another thread is running
        self._connections: list[tuple[sqlite3.Connection, threading.Lock]] = []
        self._generation = 0  # bumped by close(): every thread then reopens on its next use
        self._pid = os.getpid()
        with self._connection():  # fail early (no WAL, bad path) in the constructing thread
            pass

    # -- connection --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection | None]:
        """This thread's connection (opened on first use, and again after :meth:`close` or a
        fork), held for the duration of the ``with`` block; ``None`` for a read-only cache whose
        file does not exist (every lookup a miss)."""
        pid = os.getpid()
        state = getattr(self._local, "state", None)
        if state is None or state[0] != pid or state[1] != self._generation:
            connection, file_id = self._open_or_rebuild()
            in_use = threading.Lock()
            with self._lock:
                if self._pid != pid:  # forked: the parent's connections are not ours to use or close
                    self._connections, self._pid = [], pid
                if connection is not None:
                    self._connections.append((connection, in_use))
                state = self._local.state = (pid, self._generation, connection, in_use, file_id)
        with state[3]:
            yield state[2]

    def _open_or_rebuild(self) -> tuple[sqlite3.Connection | None, tuple[int, int] | None]:
        """:meth:`_open`; a corrupted file met on opening is moved aside and the cache rebuilt."""
        file_id = _file_id(self.path)
        try:
            return self._open(), file_id
        except sqlite3.DatabaseError as exc:
            if self.read_only or not _is_corruption(exc):
                raise
            self._move_aside(exc, file_id)
            return self._open(), _file_id(self.path)

    def _open(self) -> sqlite3.Connection | None:
        if not self.read_only and not _writable(self.path):
            self._set_read_only(f"{self.path} is not writable")
        if self.read_only:
            return self._open_read_only()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self._open_writable()
        except (PermissionError, sqlite3.OperationalError) as exc:
            if not _is_read_only_error(exc):
                raise
            self._set_read_only(str(exc))
            return self._open_read_only()

    def _open_writable(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; every write below opens its own.
        # check_same_thread=False only so that close() may close every thread's connection.
        connection = sqlite3.connect(
            str(self.path), timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            deadline = time.monotonic() + self.busy_timeout_s
            while True:  # switching to WAL needs a moment of exclusivity; another opener may hold it
                try:
                    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    connection.execute(f"PRAGMA synchronous = {self.synchronous}")
                    connection.execute(_SCHEMA)
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        except BaseException:
            connection.close()
            raise
        if str(mode).lower() != "wal":
            connection.close()
            raise RuntimeError(f"{self.path}: sqlite refused WAL mode (journal_mode={mode}); use a local disk")
        return connection

    def _open_read_only(self) -> sqlite3.Connection | None:
        """A ``mode=ro`` connection (``immutable=1`` where WAL's shared memory cannot be created
        next to the file), or ``None`` when there is no file to read."""
        if not self.path.is_file():
            return None
        uri = self.path.resolve().as_uri()
        last: sqlite3.Error | None = None
        for flags in ("mode=ro", "mode=ro&immutable=1"):
            connection = sqlite3.connect(
                f"{uri}?{flags}", uri=True, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                connection.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                connection.execute("SELECT COUNT(*) FROM graphs WHERE 0").fetchall()
                return connection
            except sqlite3.Error as exc:
                connection.close()
                last = exc
                if _is_corruption(exc) or "no such table" in str(exc):
                    break
        _LOG.warning("annotation cache %s: read-only and unreadable (%s); every lookup is a miss", self.path, last)
        return None

    def _set_read_only(self, reason: str) -> None:
        with self._lock:
            first, self.read_only = not self.read_only, True
        if first:
            _LOG.warning(
                "annotation cache %s is read-only (%s): serving hits, skipping writes (counted in skipped_writes)",
                self.path,
                reason,
            )

    def _move_aside(self, error: Exception, file_id: tuple[int, int] | None) -> None:
        """Move the corrupted file (and its WAL/shm) to ``<path>.corrupt-<timestamp>`` unless
        another thread or process already replaced it (``file_id`` no longer the file's)."""
        with self._rebuild_lock:
            if file_id is None or _file_id(self.path) != file_id:
                return
            # close every connection to the old file first: sqlite unlinks "<path>-wal" by name
            # when its last connection closes, which must not hit the rebuilt cache's WAL
            self.close()
            stamp = time.strftime("%Y%m%dT%H%M%S")
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
            number = 1
            while target.exists():
                target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{number}")
                number += 1
            try:
                os.replace(self.path, target)
            except FileNotFoundError:  # another process moved it first
                return
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}{suffix}", f"{target}{suffix}")
            with self._lock:
                self.rebuilt += 1
        _LOG.warning(
            "annotation cache %s is corrupted (%s): moved aside to %s and rebuilt empty", self.path, error, target
        )

    def _run(self, operation: Callable[[sqlite3.Connection | None], Any]) -> Any:
        """``operation(connection)``; a corrupted file met here is moved aside and the operation
        retried once on the rebuilt cache."""
        try:
            with self._connection() as connection:
                return operation(connection)
        except sqlite3.DatabaseError as exc:
            if self.read_only or not _is_corruption(exc):
                raise
            state = getattr(self._local, "state", None)
            self._move_aside(exc, state[4] if state is not None else None)
            self.close()  # every thread reopens, on the rebuilt file
        with self._connection() as connection:
            return operation(connection)

    def close(self) -> None:
        """Close every thread's connection (waiting for one in use to finish its statement); a
        later use reopens, per thread."""
        with self._lock:
            connections, self._connections = self._connections, []
            self._generation += 1
            ours = self._pid == os.getpid()
        if ours:
            for connection, in_use in connections:
                with in_use:
                    connection.close()

    def __enter__(self) -> GraphCache:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- reads and writes --------------------------------------------------------------------
    def get(self, key: str) -> CacheEntry | None:
        """The entry under ``key`` or ``None``; counts a hit or a miss."""

        def read(connection: sqlite3.Connection | None) -> Any:
            if connection is None:
                return None
            return connection.execute("SELECT value, source, uncertain FROM graphs WHERE key = ?", (key,)).fetchone()

        row = self._run(read)
        with self._lock:
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return CacheEntry(json.loads(row[0]), row[1], bool(row[2]))

    def put(
        self,
        key: str,
        graph: dict[str, Any],
        source: str,
        uncertain: bool = False,
        identity: tuple[str, str, str] = ("", "", ""),
    ) -> None:
        """Store one entry in its own transaction (``INSERT OR REPLACE``)."""
        self.put_many([(key, graph, source, uncertain, identity)])

    def put_many(self, entries: Iterable[tuple[str, dict[str, Any], str, bool, tuple[str, str, str]]]) -> int:
        """Store several entries in ONE transaction: all of them or, after a crash, none.

        ``entries`` yields ``(key, graph, source, uncertain, (annotator, model, prompt_version))``.
        Returns the number written (0 for a read-only cache: they count in :attr:`skipped_writes`).
        """
        rows = [
            (
                key,
                json.dumps(graph, separators=(",", ":"), ensure_ascii=False),
                source,
                int(uncertain),
                annotator,
                model,
                version,
                time.time(),
            )
            for key, graph, source, uncertain, (annotator, model, version) in entries
        ]
        if not self.read_only:
            try:
                count = self._run(lambda connection: self._write(connection, rows))
            except sqlite3.OperationalError as exc:
                if not _is_read_only_error(exc):
                    raise
                self._set_read_only(str(exc))
                self.close()  # reopen read-only
            else:
                with self._lock:
                    self.writes += count
                return count
        with self._lock:
            self.skipped_writes += len(rows)
        return 0

    @staticmethod
    def _write(connection: sqlite3.Connection | None, rows: list[tuple[Any, ...]]) -> int:
        if connection is None:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany(
                "INSERT OR REPLACE INTO graphs (key, value, source, uncertain, annotator, model, "
                "prompt_version, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return len(rows)

    def __len__(self) -> int:
        def count(connection: sqlite3.Connection | None) -> int:
            return 0 if connection is None else int(connection.execute("SELECT COUNT(*) FROM graphs").fetchone()[0])

        return int(self._run(count))

    def keys(self) -> list[str]:
        def read(connection: sqlite3.Connection | None) -> list[str]:
            if connection is None:
                return []
            return [row[0] for row in connection.execute("SELECT key FROM graphs ORDER BY key")]

        return list(self._run(read))

    def in_flight(self) -> dict[str, asyncio.Future[Any]]:
        """Annotations under way on the running event loop, by cache key (see :func:`annotate_with_cache`)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            return self._in_flight.setdefault(loop, {})

    def count_joined(self) -> None:
        with self._lock:
            self.joined += 1

    def record_error(self, operation: str, error: Exception) -> None:
        """Count (and log) a failed cache operation that the caller chose to survive."""
        with self._lock:
            self.errors += 1
        _LOG.warning("annotation cache %s %s failed: %s", self.path, operation, error)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def stats(self) -> dict[str, float]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "writes": self.writes,
            "errors": self.errors,
            "joined": self.joined,
            "rebuilt": self.rebuilt,
            "read_only": float(self.read_only),
            "skipped_writes": self.skipped_writes,
            "hit_rate": self.hit_rate,
        }


#: sqlite primary result codes (``sqlite3.Error.sqlite_errorcode & 0xFF``)
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_CORRUPT, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 3, 8, 11, 14, 26


def _error_code(error: BaseException) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def _is_corruption(error: BaseException) -> bool:
    """A damaged or foreign file (not a lock, a full disk or a permission problem)."""
    code = _error_code(error)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(error)
    return "malformed" in text or "not a database" in text


def _is_read_only_error(error: BaseException) -> bool:
    if isinstance(error, PermissionError):
        return True
    code = _error_code(error)
    if code is not None and code in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_CANTOPEN):
        return True
    text = str(error).lower()
    return "readonly" in text or "read-only" in text or "unable to open database" in text


def _writable(path: Path) -> bool:
    """Whether ``path`` can be written (created, for a missing file, in its nearest existing
    directory). Root passes every permission check; its read-only mounts show up as errors."""
    if path.exists():
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def lookup_cached(
    cache: GraphCache, identity: tuple[str, str, str], trajectory: Trajectory
) -> tuple[str, AnnotationResult | None]:
    """``(key, cached result or None)``: the blocking half of :func:`annotate_with_cache` (key
    hashing, sqlite read, graph validation). An unreadable cache is counted, not raised."""
    key = cache_key(trajectory.messages, *identity)
    try:
        entry = cache.get(key)
    except Exception as exc:  # an unreadable cache (sqlite error, bad JSON, no WAL, ...) must not stop training
        cache.record_error("get", exc)
        return key, None
    if entry is None:
        return key, None
    graph, validation = validate_graph(entry.graph, trajectory.num_actions)
    if validation.fallback:  # a stored graph that no longer fits (should not happen): annotate afresh
        return key, None
    return key, AnnotationResult(graph, validation, entry.source, cached=True, uncertain=entry.uncertain)


def store_result(cache: GraphCache, key: str, identity: tuple[str, str, str], result: AnnotationResult) -> None:
    """Store a successful result (the blocking half of :func:`annotate_with_cache`); a failed
    write is counted, not raised: the result is still good."""
    try:
        cache.put(key, result.graph.to_json(), result.source, result.uncertain, identity)
    except Exception as exc:  # e.g. locked past busy_timeout, disk full: the result is still good
        cache.record_error("put", exc)


async def annotate_with_cache(
    cache: GraphCache,
    identity: tuple[str, str, str],
    trajectory: Trajectory,
    annotate: Callable[[Trajectory], Awaitable[AnnotationResult]],
) -> AnnotationResult:
    """Cached ``await annotate(trajectory)``: a hit returns the stored graph with ``cached=True``;
    a miss annotates and stores the result unless it is a fallback. The lookup and the store
    run on the I/O worker pool, so the event loop keeps serving other sessions while sqlite
    reads, writes or waits for another process's lock. A miss for a transcript whose annotation
    is already under way on the same loop waits for that one and shares its result (``cached``,
    counted in ``GraphCache.joined``) instead of annotating it twice."""
    key, hit = await run_blocking_io(lookup_cached, cache, identity, trajectory)
    if hit is not None:
        return hit
    in_flight = cache.in_flight()
    running = in_flight.get(key)
    if running is not None:  # the same transcript is being annotated: share its result
        shared = await asyncio.shield(running)
        if shared is not None:
            cache.count_joined()
            return dataclasses.replace(shared, cached=True, seconds=0.0, prompt_truncated=False)
        # that annotation fell back (or was cancelled): annotate afresh below
    future: asyncio.Future[AnnotationResult | None] = asyncio.get_running_loop().create_future()
    if key not in in_flight:
        in_flight[key] = future
    good: AnnotationResult | None = None
    try:
        result: AnnotationResult = await annotate(trajectory)
        if not result.fallback:
            await run_blocking_io(store_result, cache, key, identity, result)
            good = result
    finally:
        future.set_result(good)
        if in_flight.get(key) is future:
            del in_flight[key]
    return result


class CachedAnnotator(Annotator):
    """Any annotator behind a :class:`GraphCache`; results from the cache have ``cached=True``.

    The key uses :func:`annotator_identity` of the wrapped annotator, so the same database can
    hold graphs of several annotators, models and prompt versions side by side.
    """

    def __init__(self, inner: Annotator, cache: GraphCache | str | Path):
        self.inner = inner
        self.cache = cache if isinstance(cache, GraphCache) else GraphCache(cache)
        self.name = inner.name
        self.concurrency = inner.concurrency
        self.identity = annotator_identity(inner)

    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        return await annotate_with_cache(self.cache, self.identity, trajectory, self.inner.annotate_one)

    async def aclose(self) -> None:
        await self.inner.aclose()
        self.cache.close()
