"""Path arguments of the file tools: resolved inside the sandbox root or rejected.

Every path is joined to the root (absolute paths are taken as they are), then resolved with
``os.path.realpath`` -- which follows every symlink, including one planted by the agent with
``bash`` (``ln -s /etc x``) -- and must land on the root or below it. ``..`` that stays inside
is fine (``pkg/../pkg/a.py``); anything that leaves is a :class:`SandboxPathError`.
Writes are also refused inside ``.git`` (the repository metadata the sandbox diffs against).
The check-then-open gap is not a concern here: tools of one episode run one after another.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SandboxPathError", "display_path", "resolve_sandbox_path"]

_PROTECTED_FOR_WRITE = (".git",)


class SandboxPathError(ValueError):
    """A tool path that is empty, malformed, or resolves outside the sandbox."""


def resolve_sandbox_path(root: Path, path: object, *, for_write: bool = False) -> Path:
    """Resolve ``path`` (relative to ``root`` or absolute) to a real path inside ``root``.

    Args:
        root: the sandbox root (already real: no symlinks in it).
        path: the tool argument.
        for_write: also refuse paths inside ``.git`` and the root directory itself.

    Raises:
        SandboxPathError: naming the argument and why it was refused.
    """
    if not isinstance(path, str) or not path.strip():
        raise SandboxPathError(f"path must be a non-empty string, got {path!r}")
    if "\x00" in path:
        raise SandboxPathError(f"path {path!r} contains a NUL byte")
    real_root = os.path.realpath(root)
    if path == "~" or path.startswith("~/"):  # HOME is the sandbox root inside the bash jail too
        path = "." + path[1:]
    joined = os.path.join(real_root, path)
    resolved = os.path.realpath(joined)
    if os.path.commonpath([real_root, resolved]) != real_root:
        raise SandboxPathError(f"path {path!r} resolves to {resolved}, outside the sandbox")
    relative = os.path.relpath(resolved, real_root)
    if for_write:
        if relative == ".":
            raise SandboxPathError(f"path {path!r} is the sandbox root, not a file")
        if relative.split(os.sep)[0] in _PROTECTED_FOR_WRITE:
            raise SandboxPathError(f"path {path!r} is inside .git; the repository metadata is read-only")
    return Path(resolved)


def display_path(root: Path, path: Path) -> str:
    """``path`` relative to the sandbox root, with forward slashes (``.`` for the root)."""
    return Path(os.path.relpath(path, os.path.realpath(root))).as_posix()
