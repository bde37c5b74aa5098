"""GraphCache on a damaged, misplaced or read-only file: never a raw sqlite traceback."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import verl_credit.annotate.cache as cache_module
from verl_credit.annotate.base import AnnotationResult, Annotator
from verl_credit.annotate.cache import CachedAnnotator, GraphCache
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)
FORK = multiprocessing.get_context("fork")
GRAPH = {"num_actions": 2, "errors": [], "direct_user_inputs": {}, "edges": []}
NOBODY = 65534


def filled(path: Path, entries: int = 3, size: int = 10) -> None:
    with GraphCache(path) as cache:
        for k in range(entries):
            cache.put(f"k{k}", {**GRAPH, "pad": "x" * size}, "test")


def aside(path: Path) -> list[Path]:
    return sorted(
        p
        for p in path.parent.iterdir()
        if p.name.startswith(f"{path.name}.corrupt-") and not p.name.endswith(("-wal", "-shm"))
    )


# -- corrupted files -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"this is not an sqlite database\n" * 40, id="not-a-database"),
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:100], id="truncated-header"),
        pytest.param(lambda data: b"\0" * 100 + data[100:], id="zeroed-header"),
        pytest.param(lambda data: b"", id="empty"),
    ],
)
def test_a_corrupted_file_is_moved_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[bytes], bytes]
) -> None:
    path = tmp_path / "graphs.sqlite"
    filled(path, entries=200, size=400)
    original = damage(path.read_bytes())
    path.write_bytes(original)
    with caplog.at_level(logging.WARNING, logger=cache_module.__name__):
        cache = GraphCache(path)
    if not original:  # an empty file is a valid empty database: nothing to rebuild
        assert cache.rebuilt == 0 and aside(path) == []
    else:
        assert cache.rebuilt == 1 and cache.stats()["rebuilt"] == 1
        [moved] = aside(path)
        assert moved.read_bytes() == original  # kept for inspection
        assert str(path) in caplog.text and str(moved) in caplog.text
    assert cache.get("k1") is None and len(cache) == 0
    cache.put("new", GRAPH, "test")
    assert cache.get("new") is not None and not cache.read_only
    cache.close()


def test_corruption_met_by_a_read_after_opening_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "graphs.sqlite"
    filled(path, entries=400, size=2000)
    data = bytearray(path.read_bytes())
    page = 4096
    data[len(data) - 8 * page :] = b"\xa5" * (8 * page)  # trailing leaf pages: garbage, header and schema intact
    path.write_bytes(bytes(data))
    cache = GraphCache(path)  # opens: page 1 and the schema are fine
    for k in range(400):  # some lookup meets the garbage: the file is moved aside, never raised
        cache.get(f"k{k}")
    cache.put("after", GRAPH, "test")
    assert cache.get("after") is not None
    assert cache.rebuilt == 1 and len(aside(path)) == 1
    cache.close()


def test_cached_annotator_survives_a_corrupted_cache(tmp_path: Path) -> None:
    path = tmp_path / "graphs.sqlite"
    path.write_bytes(b"garbage" * 100)
    annotator = CachedAnnotator(UniformAnnotator(), path)
    trajectory = Trajectory.from_messages(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}], id="t"
    )
    first = asyncio.run(annotator.annotate_one(trajectory))
    second = asyncio.run(annotator.annotate_one(trajectory))
    assert not first.cached and second.cached and annotator.cache.rebuilt == 1
    annotator.cache.close()


class UniformAnnotator(Annotator):
    name = "uniform"

    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        return AnnotationResult(InfluenceGraph.uniform(trajectory.num_actions), GraphValidation(), "test")


# -- a directory ---------------------------------------------------------------------------------
def test_a_directory_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"{tmp_path}.*is a directory"):
        GraphCache(tmp_path)
    with pytest.raises(ValueError, match="is a directory"):
        CachedAnnotator(UniformAnnotator(), tmp_path)


# -- a FIFO or a device --------------------------------------------------------------------------
def test_a_fifo_path_is_a_clear_error_with_no_journal_beside_it(tmp_path: Path) -> None:
    fifo = tmp_path / "graphs.sqlite"
    os.mkfifo(fifo)
    link = tmp_path / "link.sqlite"
    link.symlink_to(fifo)
    for path in (fifo, link):
        with pytest.raises(ValueError, match=rf"{path}.*is not a regular file"):
            GraphCache(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graphs.sqlite", "link.sqlite"]  # no -wal/-journal


def test_a_device_path_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=rf"'{os.devnull}' is not a regular file"):
        GraphCache(os.devnull)
    assert not any(os.path.exists(os.devnull + suffix) for suffix in ("-wal", "-shm", "-journal"))


# -- read-only locations -------------------------------------------------------------------------
def test_forced_read_only_serves_hits_and_skips_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-only path itself (root passes every permission check, so it is forced here)."""
    path = tmp_path / "graphs.sqlite"
    filled(path)
    before = path.read_bytes()
    monkeypatch.setattr(cache_module, "_writable", lambda _path: False)
    cache = GraphCache(path)
    assert cache.read_only
    assert cache.get("k1") is not None and cache.get("nope") is None
    assert cache.put_many([("k9", GRAPH, "test", False, ("", "", ""))]) == 0
    cache.put("k8", GRAPH, "test")
    assert cache.skipped_writes == 2 and cache.writes == 0 and cache.get("k9") is None
    assert cache.stats()["read_only"] == 1.0 and cache.stats()["skipped_writes"] == 2
    assert len(cache) == 3 and cache.keys() == ["k0", "k1", "k2"]
    cache.close()
    assert path.read_bytes() == before


def _as_unprivileged(scenario: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``scenario`` as a user without write permission: in a forked child as ``nobody`` when
    this runs as root (root ignores file modes), else in this process."""
    if os.geteuid() != 0:
        return scenario()
    queue = FORK.Queue()

    def child() -> None:
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            queue.put(scenario())
        except BaseException as exc:  # reported to the parent
            queue.put({"error": f"{type(exc).__name__}: {exc}"})

    process = FORK.Process(target=child)
    process.start()
    result = queue.get(timeout=50)
    process.join(10)
    return result


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory that the unprivileged user can traverse (pytest's tmp_path is root's 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="cache-faults-"))
    folder.chmod(0o755)
    yield folder
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
            os.rmdir(os.path.join(root, name))
    folder.rmdir()


def _read_only_scenario(path: Path) -> Callable[[], dict[str, Any]]:
    def scenario() -> dict[str, Any]:
        cache = GraphCache(path)
        hit = cache.get("k1") is not None
        cache.put("new", GRAPH, "test")
        out = {"read_only": cache.read_only, "hit": hit, "skipped": cache.skipped_writes, "size": len(cache)}
        out["miss"] = cache.get("new") is None
        cache.close()
        return out

    return scenario


def test_cache_in_a_read_only_directory_serves_hits(shared_dir: Path) -> None:
    folder = shared_dir / "ro"
    folder.mkdir()
    path = folder / "graphs.sqlite"
    filled(path)
    path.chmod(0o644)
    folder.chmod(0o555)
    result = _as_unprivileged(_read_only_scenario(path))
    assert result == {"read_only": True, "hit": True, "skipped": 1, "size": 3, "miss": True}


def test_read_only_file_in_a_writable_directory_serves_hits(shared_dir: Path) -> None:
    path = shared_dir / "graphs.sqlite"
    filled(path)
    path.chmod(0o444)
    shared_dir.chmod(0o777)
    result = _as_unprivileged(_read_only_scenario(path))
    assert result == {"read_only": True, "hit": True, "skipped": 1, "size": 3, "miss": True}


def test_missing_cache_in_a_read_only_directory_is_an_empty_read_only_cache(shared_dir: Path) -> None:
    folder = shared_dir / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    result = _as_unprivileged(_read_only_scenario(folder / "graphs.sqlite"))
    assert result == {"read_only": True, "hit": False, "skipped": 1, "size": 0, "miss": True}
    assert not (folder / "graphs.sqlite").exists()


def test_sqlite_errors_other_than_corruption_still_raise(tmp_path: Path) -> None:
    """A lock past busy_timeout is not corruption: nothing is moved aside."""
    path = tmp_path / "graphs.sqlite"
    filled(path)
    cache = GraphCache(path, busy_timeout_s=0.05)
    blocker = sqlite3.connect(str(path), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            cache.put("k", GRAPH, "test")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert cache.rebuilt == 0 and aside(path) == [] and not cache.read_only
    cache.close()
