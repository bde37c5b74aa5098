"""File-system access confined to one directory, race-free: every path is resolved one component
at a time against directory file descriptors, never as a string.

The trainer's file tools run as the trainer's user on a tree that jailed code can change. A string
path that was checked first (``os.path.realpath``) and opened afterwards can be redirected in
between: a jailed loop that swaps a directory for a symlink lands the trainer's write outside the
tree. Here each component is opened with ``O_NOFOLLOW`` relative to the descriptor of the directory
before it (``openat``), so what is opened is always the directory entry that was looked at, and a
symlink is never followed by the kernel: :func:`resolve` reads it (``readlinkat``) and walks its
target itself, beneath the root -- relative targets and absolute targets that name a path inside
the root are followed, anything that leaves the root is refused. The same walk is done on every
kernel (no ``openat2``), so the semantics do not depend on the machine.

Walks are iterative with a bounded depth (:data:`MAX_DEPTH` directory levels; deeper entries are
reported, never followed), :func:`clear_directory` removes a tree of any depth with one open
descriptor (down by name, back up by a checked ``..``), and names are ``str`` as
``os.fsdecode`` gives them: a name that is not UTF-8 keeps its bytes as surrogate escapes
(:func:`printable` shows them as ``\\xNN``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_DEPTH",
    "MAX_SYMLINKS",
    "BeneathError",
    "Entry",
    "NotRegularError",
    "Resolved",
    "clear_directory",
    "make_directories",
    "open_directory",
    "open_parent",
    "open_regular",
    "printable",
    "read_fd",
    "read_regular",
    "remove_entry",
    "replace_contents",
    "resolve",
    "walk",
    "write_regular",
]

MAX_DEPTH = 64
"""Directory levels below the root that walks and path arguments go into."""
MAX_SYMLINKS = 40
"""Symlinks followed while resolving one path (the kernel's own limit)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BeneathError(ValueError):
    """A path that leaves the root, loops, nests too deep or names something unusable."""


class NotRegularError(OSError):
    """The entry is a FIFO, socket, device, directory or symlink: never opened as a file."""


@dataclass
class Resolved:
    """Where a path landed: the open directory ``parent_fd`` holding entry ``name`` (None for the
    root itself), the components from the root (``rel``) and, for a missing path, the components
    still to be made (``missing``: ``rel[len(rel) - len(missing):]``). The caller closes
    ``parent_fd`` (:meth:`close`)."""

    parent_fd: int
    name: str | None
    rel: tuple[str, ...]
    missing: tuple[str, ...] = ()
    mode: int | None = None  # ``lstat`` mode of the entry, None when it does not exist

    @property
    def rel_text(self) -> str:
        return "/".join(self.rel) if self.rel else "."

    @property
    def exists(self) -> bool:
        return self.mode is not None

    @property
    def is_dir(self) -> bool:
        return self.mode is not None and stat.S_ISDIR(self.mode)

    @property
    def is_regular(self) -> bool:
        return self.mode is not None and stat.S_ISREG(self.mode)

    def close(self) -> None:
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1

    def __enter__(self) -> Resolved:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def printable(text: str) -> str:
    """``text`` with surrogate escapes (undecodable bytes of a name) as ``\\xNN`` and any other lone
    surrogate as U+FFFD: always encodable as UTF-8 (tool results go to a tokenizer)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(char)
    return "".join(out)


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def resolve(
    root_fd: int,
    root_path: str,
    path: str,
    *,
    follow_final: bool = True,
    max_depth: int = MAX_DEPTH,
) -> Resolved:
    """Resolve ``path`` (relative to the root, or absolute naming a path inside ``root_path``)
    beneath the directory ``root_fd``.

    Symlinks are followed (``follow_final=False``: all but the last component) as long as the
    walk stays beneath the root. A missing component ends the walk: the result names the deepest
    existing directory and lists what is ``missing``.

    Raises:
        BeneathError: the path leaves the root, loops, names a non-directory as a directory,
            nests deeper than ``max_depth`` levels, or an ``OSError`` occurred (its text is kept).
    """
    if path.startswith("/"):
        if path != root_path and not path.startswith(root_path.rstrip("/") + "/"):
            raise BeneathError(f"resolves to {path}, outside the sandbox")
        path = path[len(root_path) :]
    pending = _components(path)
    pending.reverse()  # a stack: the next component is pending[-1]
    fds = [os.dup(root_fd)]
    names: list[str] = []
    followed = 0
    try:
        while pending:
            part = pending.pop()
            if part == "..":
                if not names:
                    raise BeneathError("resolves to a path outside the sandbox")
                os.close(fds.pop())
                names.pop()
                continue
            last = not pending
            try:
                mode = os.stat(part, dir_fd=fds[-1], follow_symlinks=False).st_mode
            except FileNotFoundError:
                missing = (part, *reversed(pending))
                if len(names) + len(missing) - 1 > max_depth:
                    raise BeneathError(f"nests deeper than {max_depth} directory levels") from None
                return Resolved(fds.pop(), part, (*names, *missing), missing)
            if stat.S_ISLNK(mode) and (not last or follow_final):
                followed += 1
                if followed > MAX_SYMLINKS:
                    raise BeneathError(f"more than {MAX_SYMLINKS} symlinks (a loop?)")
                target = os.readlink(part, dir_fd=fds[-1])
                if target.startswith("/"):
                    if target != root_path and not target.startswith(root_path.rstrip("/") + "/"):
                        raise BeneathError(f"resolves through a symlink to {target}, outside the sandbox")
                    while len(fds) > 1:
                        os.close(fds.pop())
                    names.clear()
                    target = target[len(root_path) :]
                pending.extend(reversed(_components(target)))
                continue
            if last:
                return Resolved(fds.pop(), part, (*names, part), (), mode)
            if not stat.S_ISDIR(mode):
                raise BeneathError(f"{'/'.join((*names, part))} is not a directory")
            if len(names) >= max_depth:
                raise BeneathError(f"nests deeper than {max_depth} directory levels")
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            names.append(part)
        # the root itself, or a directory reached by '..' / a symlink: name it from its parent
        if not names:
            return Resolved(fds.pop(), None, (), (), stat.S_IFDIR)
        name = names[-1]
        os.close(fds.pop())
        return Resolved(fds.pop(), name, tuple(names), (), stat.S_IFDIR)
    except OSError as exc:
        raise BeneathError(os.strerror(exc.errno) if exc.errno else str(exc)) from exc
    finally:
        for fd in fds:
            os.close(fd)


def open_directory(resolved: Resolved) -> int:
    """An ``O_RDONLY`` descriptor of the directory ``resolved`` names (never through a symlink)."""
    if resolved.name is None:
        return os.dup(resolved.parent_fd) if resolved.parent_fd >= 0 else -1
    return os.open(resolved.name, _DIR_FLAGS, dir_fd=resolved.parent_fd)


def open_regular(parent_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """Open ``name`` in ``parent_fd`` without following a symlink or blocking on a FIFO; the
    descriptor is returned only for a regular file (else :class:`NotRegularError`)."""
    try:
        fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):  # FIFO without a reader, symlink, dir
            raise NotRegularError(exc.errno, f"{name} is not a regular file") from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularError(errno.EINVAL, f"{name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_regular(parent_fd: int, name: str, limit: int | None = None) -> bytes:
    """At most ``limit`` bytes (all when None) of the regular file ``name`` in ``parent_fd``."""
    fd = open_regular(parent_fd, name, os.O_RDONLY)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int | None = None) -> bytes:
    """At most ``limit`` bytes (all when None) from the open descriptor ``fd``."""
    chunks: list[bytes] = []
    left = -1 if limit is None else limit
    while left != 0:
        chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        if left > 0:
            left -= len(chunk)
    return b"".join(chunks)


def write_regular(parent_fd: int, name: str, data: bytes, owner: tuple[int, int] | None = None) -> bool:
    """Replace the contents of the regular file ``name`` in ``parent_fd`` (created if missing, as
    ``owner``'s when given); returns True when it was created. FIFOs, devices, symlinks refused."""
    created = True
    try:
        fd = open_regular(parent_fd, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        created = False
        fd = open_regular(parent_fd, name, os.O_WRONLY)
    try:
        if created and owner is not None:
            os.fchown(fd, *owner)
        replace_contents(fd, data)
    finally:
        os.close(fd)
    return created


def make_directories(resolved: Resolved, owner: tuple[int, int] | None = None) -> Resolved:
    """Create the ``missing`` directories of ``resolved`` (all but its last component), each given
    to ``owner``; returns the resolution of the (still missing) last component. A directory made
    meanwhile by someone else is used as it is; a ``..`` among the missing parts is refused."""
    parts = resolved.missing[:-1]
    if ".." in resolved.missing:
        raise BeneathError("names '..' below a directory that does not exist")
    fd = os.dup(resolved.parent_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as exc:
        os.close(fd)
        raise BeneathError(os.strerror(exc.errno) if exc.errno else str(exc)) from exc
    resolved.close()
    last = resolved.missing[-1]
    return Resolved(fd, last, resolved.rel, (last,))


def open_parent(
    top_fd: int, directories: Sequence[str], *, create: bool = False, owner: tuple[int, int] | None = None
) -> int:
    """A descriptor of the directory ``top/directories[0]/...`` reached without following any
    symlink (``O_NOFOLLOW`` per component); ``create`` makes missing ones (``owner``'s). For trees
    whose paths came from :func:`walk` (no ``..``, no symlinks are followed)."""
    fd = os.dup(top_fd)
    try:
        for part in directories:
            if part in ("", ".", ".."):
                raise BeneathError(f"invalid path component {part!r}")
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_contents(fd: int, data: bytes) -> None:
    """Make the open regular file ``fd`` hold exactly ``data``."""
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass(frozen=True)
class Entry:
    """One entry met by :func:`walk`: its components from the walked directory and ``lstat`` data."""

    rel: tuple[str, ...]
    mode: int
    size: int  # bytes it holds on disk (``max(st_size, st_blocks * 512)``)

    @property
    def rel_text(self) -> str:
        return "/".join(self.rel)

    @property
    def name(self) -> str:
        return self.rel[-1]


def walk(
    top_fd: int,
    *,
    skip_dirs: Sequence[str] = (),
    max_depth: int = MAX_DEPTH,
    too_deep: list[tuple[str, ...]] | None = None,
) -> Iterator[tuple[int, Entry]]:
    """Every entry below the directory ``top_fd`` except directories (sorted, depth first), as
    ``(parent_fd, entry)``; ``parent_fd`` is valid until the next item. Symlinks are reported, not
    followed; directories named in ``skip_dirs`` are not entered; directories at depth
    ``max_depth`` are not entered either: their components are appended to ``too_deep``.
    Directories that cannot be opened or listed are skipped."""
    stack: list[tuple[int, tuple[str, ...], Iterator[os.DirEntry[str]]]] = []
    try:
        first = os.dup(top_fd)
        stack.append((first, (), iter(_sorted_entries(first))))
        while stack:
            fd, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                os.close(fd)
                stack.pop()
                continue
            rel = (*prefix, entry.name)
            try:
                info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if entry.name in skip_dirs:
                    continue
                if len(rel) > max_depth:
                    if too_deep is not None:
                        too_deep.append(rel)
                    continue
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    listing = _sorted_entries(child)
                except OSError:
                    os.close(child)
                    continue
                stack.append((child, rel, iter(listing)))
                continue
            yield fd, Entry(rel, info.st_mode, max(info.st_size, info.st_blocks * 512))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _sorted_entries(fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(fd) as listing:
        return sorted(listing, key=lambda e: e.name)


def remove_entry(parent_fd: int, name: str) -> None:
    """Remove ``name`` from ``parent_fd``: a file, link or special file, or a directory tree of any
    depth (:func:`clear_directory`). A missing entry is no error."""
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        clear_directory(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def clear_directory(top_fd: int) -> None:
    """Delete everything inside the directory ``top_fd`` (which stays), whatever the depth.

    Depth first with one open descriptor: down into a subdirectory by name (``O_NOFOLLOW``), back
    up by ``..`` -- checked to be the very directory it came from (device and inode), so a tree
    that changes meanwhile stops the deletion instead of redirecting it. No recursion, no
    descriptor per level and no path string, so a 10,000-level chain of 255-character names goes
    like any other tree. Unreadable directories (mode 000) are opened up first.
    """
    fd = os.dup(top_fd)
    names: list[str] = []  # the current directory's path from the top
    identities = [_identity(fd)]  # (st_dev, st_ino) of each directory on that path, top first
    levels = [_empty_level(fd)]  # subdirectories still to delete, per level
    try:
        while levels:
            if levels[-1]:
                name = levels[-1].pop()
                child = _open_subdirectory(fd, name)
                os.close(fd)
                fd = child
                names.append(name)
                identities.append(_identity(fd))
                levels.append(_empty_level(fd))
                continue
            levels.pop()
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            identities.pop()
            if _identity(parent) != identities[-1]:
                os.close(parent)
                raise OSError(errno.ESTALE, "the tree changed while it was being deleted")
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _open_subdirectory(fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=fd, follow_symlinks=False)
        return os.open(name, _DIR_FLAGS, dir_fd=fd)


def _empty_level(fd: int) -> list[str]:
    """Unlink everything in ``fd`` that is not a directory; returns the names of its subdirectories."""
    try:
        names = os.listdir(fd)
    except PermissionError:
        os.fchmod(fd, 0o700)
        names = os.listdir(fd)
    subdirectories = []
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            subdirectories.append(name)
        else:
            os.unlink(name, dir_fd=fd)
    return subdirectories
