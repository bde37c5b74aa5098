"""Path arguments of the file tools: resolved beneath the sandbox root, race-free, or rejected.

A path is relative to the repository root (an absolute path must name a place inside it; ``~`` is
the root, as ``HOME`` is in the jail). It is resolved one component at a time against directory
descriptors (:mod:`.beneath`): symlinks planted by the agent with ``bash`` are followed only while
they stay inside the root, ``..`` that stays inside is fine (``pkg/../pkg/a.py``), and since
nothing is ever re-resolved as a string, a directory swapped for a symlink between the check and
the open cannot redirect the trainer. Writes are also refused inside ``.git`` (the agent's
repository metadata) and on the root itself. Every failure -- leaving the root, a loop, a name the
file system refuses (too long, ``ENAMETOOLONG``; ``EINVAL``) -- is a :class:`SandboxPathError`
naming the argument, which the tools report as a tool error.
"""

from __future__ import annotations

from verl_credit.envs.coding.beneath import BeneathError, Resolved, printable, resolve

__all__ = ["MAX_PATH_CHARS", "SandboxPathError", "display_path", "resolve_sandbox_path"]

_PROTECTED_FOR_WRITE = (".git",)
MAX_PATH_CHARS = 4096
"""Longest path argument (Linux's ``PATH_MAX``)."""


class SandboxPathError(ValueError):
    """A tool path that is empty, malformed, or resolves outside the sandbox."""


def resolve_sandbox_path(
    root_fd: int, root_path: str, path: object, *, for_write: bool = False, follow_final: bool = True
) -> Resolved:
    """Resolve ``path`` beneath the sandbox root (``root_fd``, an open directory at ``root_path``).

    Args:
        root_fd: a descriptor of the sandbox root.
        root_path: the root's real path (absolute arguments must lie inside it).
        path: the tool argument.
        for_write: also refuse paths inside ``.git`` and the root directory itself.
        follow_final: follow a symlink in the last component (when it stays inside).

    Returns:
        the :class:`~verl_credit.envs.coding.beneath.Resolved` entry; the caller closes it.

    Raises:
        SandboxPathError: naming the argument and why it was refused.
    """
    if not isinstance(path, str) or not path.strip():
        raise SandboxPathError(f"path must be a non-empty string, got {path!r}")
    if "\x00" in path:
        raise SandboxPathError(f"path {path!r} contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise SandboxPathError(f"path of {len(path)} characters is longer than {MAX_PATH_CHARS}")
    shown = printable(path)
    if path == "~" or path.startswith("~/"):  # HOME is the sandbox root inside the bash jail too
        path = "." + path[1:]
    try:
        resolved = resolve(root_fd, root_path, path, follow_final=follow_final)
    except BeneathError as exc:
        raise SandboxPathError(f"path {shown!r} {_reason(str(exc))}") from None
    except UnicodeError:
        raise SandboxPathError(f"path {shown!r} is not valid text for a file name") from None
    if for_write:
        refusal = None
        if not resolved.rel:
            refusal = "is the sandbox root, not a file"
        elif resolved.rel[0] in _PROTECTED_FOR_WRITE:
            refusal = "is inside .git; the repository metadata is read-only"
        if refusal is not None:
            resolved.close()
            raise SandboxPathError(f"path {shown!r} {refusal}")
    return resolved


def _reason(text: str) -> str:
    if "outside the sandbox" in text or text.startswith(("more than", "nests", "names")):
        return text
    if text.endswith("is not a directory"):
        return f"goes through {text}"
    return f"cannot be resolved: {text}"


def display_path(resolved: Resolved) -> str:
    """The resolved path relative to the sandbox root, with ``/`` (``.`` for the root), printable."""
    return printable(resolved.rel_text)
