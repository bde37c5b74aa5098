"""Race-free file-system access beneath a root (verl_credit.envs.coding.beneath), the reaper's
socket filter and the trainer's git, on hand-built trees (no jail)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_credit.envs.coding import beneath
from verl_credit.envs.coding.host_git import HostGit
from verl_credit.envs.coding.reaper import socket_filter

#: slow: sandbox suite: real trees, sockets and git
pytestmark = pytest.mark.slow


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """root/pkg/mod.py, root/pkg/sub/, root/inside -> pkg (relative), root/abs -> root/pkg
    (absolute, inside), root/out -> tmp_path/outside (absolute, outside), root/up -> ../outside."""
    root = tmp_path / "root"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    os.symlink("pkg", root / "inside")
    os.symlink(root / "pkg", root / "abs")
    os.symlink(tmp_path / "outside", root / "out")
    os.symlink("../outside", root / "up")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd, root
    finally:
        os.close(fd)


def _resolve(tree: tuple[int, Path], path: str, **options: object) -> beneath.Resolved:
    fd, root = tree
    return beneath.resolve(fd, str(root), path, **options)


@pytest.mark.parametrize(
    ("path", "rel"),
    [
        ("pkg/mod.py", ("pkg", "mod.py")),
        ("inside/mod.py", ("pkg", "mod.py")),  # a relative symlink that stays inside
        ("abs/mod.py", ("pkg", "mod.py")),  # an absolute symlink that names a path inside
        ("pkg/../pkg/./mod.py", ("pkg", "mod.py")),
        ("pkg/sub/..", ("pkg",)),
        (".", ()),
    ],
)
def test_resolution_follows_what_stays_inside(tree: tuple[int, Path], path: str, rel: tuple[str, ...]) -> None:
    with _resolve(tree, path) as resolved:
        assert resolved.rel == rel and resolved.exists


def test_absolute_argument_inside_the_root(tree: tuple[int, Path]) -> None:
    with _resolve(tree, str(tree[1] / "pkg" / "mod.py")) as resolved:
        assert resolved.rel == ("pkg", "mod.py") and resolved.is_regular


@pytest.mark.parametrize("path", ["out/secret.txt", "up/secret.txt", "..", "pkg/../../outside", "/etc/passwd"])
def test_resolution_refuses_what_leaves(tree: tuple[int, Path], path: str) -> None:
    with pytest.raises(beneath.BeneathError, match="outside the sandbox"):
        _resolve(tree, path)


def test_loops_depth_and_files_as_directories(tree: tuple[int, Path]) -> None:
    root = tree[1]
    os.symlink("loop", root / "loop")
    with pytest.raises(beneath.BeneathError, match="symlinks"):
        _resolve(tree, "loop/x")
    with pytest.raises(beneath.BeneathError, match="not a directory"):
        _resolve(tree, "pkg/mod.py/x")
    with pytest.raises(beneath.BeneathError, match="deeper than 3"):
        _resolve(tree, "a/b/c/d/e.txt", max_depth=3)


def test_the_last_symlink_is_kept_when_asked(tree: tuple[int, Path]) -> None:
    with _resolve(tree, "out", follow_final=False) as resolved:
        assert resolved.rel == ("out",) and stat.S_ISLNK(resolved.mode or 0)


def test_missing_directories_are_made_under_the_deepest_existing_one(tree: tuple[int, Path]) -> None:
    resolved = _resolve(tree, "inside/new/deeper/file.txt")
    assert not resolved.exists and resolved.rel == ("pkg", "new", "deeper", "file.txt")
    assert resolved.missing == ("new", "deeper", "file.txt")
    final = beneath.make_directories(resolved)
    with final:
        assert beneath.write_regular(final.parent_fd, final.name, b"made")
    assert (tree[1] / "pkg" / "new" / "deeper" / "file.txt").read_bytes() == b"made"
    with pytest.raises(beneath.BeneathError, match=r"'\.\.'"):
        beneath.make_directories(_resolve(tree, "nope/../x"))


def test_an_open_directory_stays_the_one_that_was_resolved(tree: tuple[int, Path], tmp_path: Path) -> None:
    """Swapping ``pkg`` for a symlink after resolution cannot redirect the open: the descriptor
    holds the directory that was looked at (this is what a string path cannot do)."""
    root = tree[1]
    with _resolve(tree, "pkg/mod.py") as resolved:
        os.rename(root / "pkg", root / "pkg.real")
        os.symlink(tmp_path / "outside", root / "pkg")
        beneath.write_regular(resolved.parent_fd, "planted.txt", b"x")
    assert (root / "pkg.real" / "planted.txt").exists()
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret.txt"]


def test_special_files_are_never_opened(tree: tuple[int, Path]) -> None:
    fd, root = tree
    os.mkfifo(root / "fifo")
    with pytest.raises(beneath.NotRegularError):
        beneath.read_regular(fd, "fifo")
    with pytest.raises(beneath.NotRegularError):
        beneath.write_regular(fd, "out", b"x")  # a symlink, never followed
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))
        with pytest.raises((beneath.NotRegularError, OSError)):
            beneath.read_regular(fd, "sock")


def test_walk_is_iterative_bounded_and_reports_what_is_too_deep(tmp_path: Path) -> None:
    """A 1,100-level chain with 200-character names (far past PATH_MAX) is walked, reported and
    deleted without recursion and with a handful of descriptors."""
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.dup(top)
        for _ in range(1100):
            os.mkdir("n" * 200, dir_fd=fd)
            child = os.open("n" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf.py", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        os.close(fd)
        (tmp_path / "top.py").write_text("")
        too_deep: list[tuple[str, ...]] = []
        seen = [entry.rel_text for _, entry in beneath.walk(top, max_depth=10, too_deep=too_deep)]
        assert seen == ["top.py"] and len(too_deep) == 1 and len(too_deep[0]) == 11
        beneath.clear_directory(top)
        assert os.listdir(top) == []
    finally:
        os.close(top)


def test_names_that_are_not_utf8_are_kept_and_shown_escaped(tmp_path: Path) -> None:
    (tmp_path / os.fsdecode(b"caf\xe9.py")).write_text("")
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (entry,) = [entry for _, entry in beneath.walk(top)]
    finally:
        os.close(top)
    assert os.fsencode(entry.name) == b"caf\xe9.py"
    assert beneath.printable(entry.name) == "caf\\xe9.py"
    assert beneath.printable("a\ud800b") == "a\ufffdb"


def test_socket_filter_programs() -> None:
    """One classic-BPF statement is 8 bytes; x86-64 adds the x32 check; unknown machines get none."""
    x86 = socket_filter("x86_64")
    arm = socket_filter("aarch64")
    assert x86 is not None and arm is not None
    assert len(x86) % 8 == 0 and len(x86) // 8 == len(arm) // 8 + 2
    assert socket_filter("riscv64") is None


@pytest.mark.skipif(socket_filter() is None, reason="the socket filter knows no system call numbers for this machine")
def test_reaper_filter_refuses_unix_sockets_but_not_socketpair(tmp_path: Path) -> None:
    source = Path(sys.modules["verl_credit.envs.coding.reaper"].__file__).read_text()
    probe = (
        "import socket\n"
        "a, b = socket.socketpair(); a.sendall(b'ok'); print(b.recv(2).decode())\n"
        "try:\n    socket.socket(socket.AF_UNIX)\nexcept PermissionError:\n    print('refused')\n"
        "socket.socket(socket.AF_INET).close(); print('inet')\n"
    )
    read, write = os.pipe()
    try:
        completed = subprocess.run(
            [sys.executable, "-I", "-S", "-c", source, str(read), "-", "1", "1", "", sys.executable, "-c", probe],
            pass_fds=(read,),
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.close(read)
        os.close(write)
    assert completed.stdout.split() == ["ok", "refused", "inet"], completed.stderr


def test_host_git_ignores_the_agent_repository(tmp_path: Path) -> None:
    """The trainer's git reads its private directory: an agent .git full of traps is never read."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "a.py").write_text("A = 1\n")
    git = HostGit(
        tmp_path / "host.git",
        work,
        home,
        {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"},
    )
    git.init_commit("task")
    git.copy_to(work / ".git")
    marker = tmp_path / "ran"
    with open(work / ".git" / "config", "a") as config:
        config.write(f"[core]\n\tfsmonitor = touch {marker}\n[diff]\n\texternal = touch {marker}\n")
    (work / "a.py").write_text("A = 2\n")
    assert "+A = 2" in git.diff() and not marker.exists()
    agent = subprocess.run(["git", "-C", str(work), "log", "--format=%s"], capture_output=True, text=True, timeout=30)
    assert agent.stdout.strip() == "task"  # the agent's copy is a working repository of its own
