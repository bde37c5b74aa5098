"""JSONL files of docs/design.md section 8 with errors that name the file, the line and the field.

The reader is strict about what JSON may carry (every problem is an :class:`InputError` whose
text names ``file:line``): the file must be UTF-8, strings may not hold lone surrogates,
``NaN``/``Infinity`` tokens and numbers that do not fit a finite float are refused, and values
may nest at most :data:`MAX_DEPTH` levels deep, and a line may hold at most
:data:`MAX_LINE_CHARS` characters (a longer one -- or a "file" such as ``/dev/zero`` that never
ends its line -- is refused as soon as the limit is read, so memory stays bounded). A record's
``turn_rewards`` are checked here too (:func:`verl_credit.estimators.needs.turn_reward_problem`).
The writer replaces a regular file atomically, writes through a symlink to its target and writes
in place into a device or FIFO (it never replaces a special file with a regular one).
:func:`check_distinct_files` refuses an output that is the same file as an input.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_credit.estimators.needs import TURN_REWARDS_KEY, turn_reward_problem
from verl_credit.trajectory import Trajectory, TrajectoryError

__all__ = [
    "MAX_DEPTH",
    "MAX_LINE_CHARS",
    "InputError",
    "OutputError",
    "RolloutReader",
    "RolloutScan",
    "check_distinct_files",
    "count_lines",
    "group_key",
    "group_keys",
    "iter_jsonl",
    "load_trajectories",
    "parse_json_line",
    "read_rollouts",
    "scan_rollouts",
    "write_jsonl",
]

#: deepest nesting of arrays/objects accepted in one line (a transcript needs about 6)
MAX_DEPTH = 64
#: the most characters one line may hold (256 Mi; a 48,000-action transcript is a 19 MB line). Reading
#: stops there, so an endless line (``--input /dev/zero``) costs about twice this much memory (the
#: text and its decoding buffer) and then a ``file:line`` error, never more
MAX_LINE_CHARS = 256 * 2**20
# a decimal integer with more digits cannot be a finite float (float max is about 1.8e308)
_MAX_INT_DIGITS = 309
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # an undecodable byte under errors="surrogateescape"
# a JSON escape of a surrogate code point: text decoded from UTF-8 holds no surrogate otherwise
# (an undecodable byte is refused first, see _ESCAPED_BYTE)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class InputError(ValueError):
    """Malformed input; ``str(error)`` is the one-line message the CLI prints."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


class OutputError(ValueError):
    """An output file that cannot be written; ``str(error)`` names the file."""

    def __init__(self, path: str | Path, message: str):
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class _BadValue(ValueError):
    """Raised by the JSON hooks; caught by :func:`parse_json_line`."""


def _parse_constant(token: str) -> Any:
    raise _BadValue(f"non-finite number {token} is not allowed")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadValue(f"number {_short(text)} does not fit a finite float")
    return value


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise _BadValue(f"integer with {digits} digits does not fit a finite float")
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise _BadValue(f"integer {_short(text)} does not fit a finite float") from None
    return value


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_path(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<record>"


def _has_problem(value: Any, strings: bool) -> bool:
    """Whether :func:`_check_value` would find a problem: the same checks without building a path
    per value (containers only are stacked; strings are searched only when ``strings``). Linear in
    the size of the value, with no per-value allocation."""
    if not isinstance(value, dict | list):
        return strings and isinstance(value, str) and _SURROGATE.search(value) is not None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return True
        if isinstance(item, dict):
            if strings and any(_SURROGATE.search(key) for key in item):
                return True
            children: Iterable[Any] = item.values()
        else:
            children = item
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif strings and isinstance(child, str) and _SURROGATE.search(child):
                return True
    return False


def _check_value(value: Any, strings: bool = True) -> str | None:
    """The first problem (depth, lone surrogate) in a parsed value, or ``None``; iterative.

    The common case (no problem) is decided by :func:`_has_problem`; only a value with a problem
    is walked again with paths, to name the field. ``strings=False`` skips the surrogate search
    (the caller knows the text held neither a surrogate nor a ``\\ud800``-``\\udfff`` escape).
    """
    if not _has_problem(value, strings):
        return None
    stack: list[tuple[Any, int, list[str | int]]] = [(value, 0, [])]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            match = _SURROGATE.search(item)
            if match:
                return f"field '{_json_path(where)}': lone surrogate \\u{ord(match.group()):04x} in a string"
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                return f"field '{_json_path(where)}': nested deeper than {MAX_DEPTH} levels"
            if isinstance(item, dict):
                for key, child in item.items():
                    match = _SURROGATE.search(key)
                    if match:
                        return f"field '{_json_path(where)}': lone surrogate \\u{ord(match.group()):04x} in a key"
                    stack.append((child, depth + 1, [*where, key]))
            else:
                stack.extend((child, depth + 1, [*where, i]) for i, child in enumerate(item))
    return None


def parse_json_line(text: str) -> Any:
    """Parse one JSONL line strictly; raises ``ValueError`` with a one-line reason."""
    match = _ESCAPED_BYTE.search(text)
    if match:
        byte = ord(match.group()) - 0xDC00
        raise ValueError(f"invalid UTF-8 (byte 0x{byte:02x} at column {match.start() + 1})")
    try:
        value = json.loads(text, parse_constant=_parse_constant, parse_float=_parse_float, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON: {exc.msg} (column {exc.colno})") from None
    except _BadValue as exc:
        raise ValueError(f"bad JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"bad JSON: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. Python's int-string conversion limit
        raise ValueError(f"bad JSON: {exc}") from None
    strings = _SURROGATE_ESCAPE.search(text) is not None or _SURROGATE.search(text) is not None
    problem = _check_value(value, strings=strings)
    if problem is not None:
        raise ValueError(problem)
    return value


def _open_text(path: str | Path):
    try:
        return open(path, encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise InputError(path, None, f"cannot open: {exc.strerror or exc}") from None


def _read_line(handle: Any, path: str | Path, number: int) -> str:
    """The next line of ``handle`` (``""`` at the end), at most :data:`MAX_LINE_CHARS` characters
    plus its newline; a longer line raises :class:`InputError` naming ``path:number`` once the
    limit is read, so an endless line never grows memory past it."""
    limit = MAX_LINE_CHARS
    try:
        line = handle.readline(limit + 1)
    except OSError as exc:
        raise InputError(path, number, f"cannot read: {exc.strerror or exc}") from None
    if len(line) > limit and not line.endswith("\n"):
        raise InputError(
            path, number, f"line longer than {limit:,} characters (the most one line may hold); is this a JSONL file?"
        )
    return line


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for every non-blank line (1-based line numbers)."""
    handle = _open_text(path)
    with handle:
        number = 0
        while True:
            line = _read_line(handle, path, number + 1)
            if not line:
                return
            number += 1
            if not line.strip():
                continue
            try:
                value = parse_json_line(line)
            except ValueError as exc:
                raise InputError(path, number, str(exc)) from None
            del line  # a huge line is not kept alive next to its parsed value
            yield number, value


def count_lines(path: str | Path) -> int:
    """Number of non-blank lines (for progress bars), read in pieces of at most 64 KiB: a file of
    one endless line costs one piece of memory."""
    count, content = 0, False  # content: the line being read has a non-blank character
    try:
        with open(path, "rb") as handle:
            while piece := handle.readline(1 << 16):
                content = content or bool(piece.decode("utf-8", "surrogateescape").strip())
                if piece.endswith(b"\n"):
                    count += content
                    content = False
    except OSError:
        return 0
    return count + content


def load_trajectories(path: str | Path) -> Iterator[tuple[int, Trajectory]]:
    """Yield ``(line_number, trajectory)``; a malformed record raises :class:`InputError`."""
    for number, _, trajectory in _load_records(path):
        yield number, trajectory


def _load_records(path: str | Path) -> Iterator[tuple[int, Any, Trajectory]]:
    for number, record in iter_jsonl(path):
        try:
            trajectory = Trajectory.from_record(record)
        except TrajectoryError as exc:
            raise InputError(path, number, str(exc)) from None
        except (RecursionError, OverflowError, TypeError, ValueError) as exc:  # safety net: never a traceback
            raise InputError(path, number, f"unusable record ({type(exc).__name__}: {exc})") from None
        problem = turn_reward_problem(trajectory.extra.get(TURN_REWARDS_KEY), trajectory.num_actions)
        if problem is not None:
            raise InputError(path, number, problem)
        yield number, record, trajectory


def group_key(record: dict[str, Any]) -> str:
    """The GRPO group id of one record (see :func:`group_keys`)."""
    return json.dumps(record.get("uid", record.get("id")), sort_keys=True, ensure_ascii=False)


def group_keys(records: Iterable[Any]) -> list[str]:
    """GRPO group ids that keep JSON types apart: ``json.dumps`` of each record's ``uid``
    (its ``id`` when absent), so ``1`` and ``"1"``, ``null`` and ``"None"`` are different groups."""
    return [group_key(r) for r in records]


class RolloutReader:
    """The trajectories of a rollouts file, one at a time: iterating yields ``(line_number,
    group_key, trajectory)`` (:func:`group_key`), and ``duplicates`` counts the repeated ids
    seen so far; ``warn`` gets one ``file:line: warning: ...`` line per duplicate id.

    Besides the current line, it keeps only each id's first line number (for the warning).
    """

    def __init__(self, path: str | Path, warn: Callable[[str], Any] | None = None):
        self.path, self.warn = path, warn
        self.duplicates = 0
        self._first_line: dict[str, int] = {}

    def __iter__(self) -> Iterator[tuple[int, str, Trajectory]]:
        for number, record, trajectory in _load_records(self.path):
            first = self._first_line.setdefault(trajectory.id, number)
            if first != number:
                self.duplicates += 1
                if self.warn is not None:
                    self.warn(
                        f"{self.path}:{number}: warning: duplicate trajectory id {trajectory.id!r} "
                        f"(first on line {first})"
                    )
            key = group_key(record)
            del record
            yield number, key, trajectory


def read_rollouts(
    path: str | Path, warn: Callable[[str], Any] | None = None, progress: Callable[[int], Any] | None = None
) -> tuple[list[Trajectory], list[str], int]:
    """Every trajectory of a rollouts file, its group key (:func:`group_keys`) and the number
    of duplicate ids; ``warn`` gets one ``file:line: warning: ...`` line per duplicate id."""
    trajectories: list[Trajectory] = []
    keys: list[str] = []
    reader = RolloutReader(path, warn)
    for _, key, trajectory in reader:
        trajectories.append(trajectory)
        keys.append(key)
        if progress is not None:
            progress(1)
    return trajectories, keys, reader.duplicates


@dataclass
class RolloutScan:
    """What one cheap pass over a rollouts file tells ``verl-credit route`` before it routes
    (:func:`scan_rollouts`); nothing of any transcript is kept.

    ``lines``: non-blank lines; ``records``: lines that look like trajectories (a JSON object
    with ``id``, ``messages`` and a finite number ``reward``); ``max_actions``: the most
    assistant messages of one of them (the batch width of the whole file); ``max_abs_reward``;
    ``groups``: distinct group keys; ``reopened``: ``(line, key, first_line)`` of the first
    record whose group already ended earlier in the file (``None``: the file is grouped, every
    group's lines are consecutive).
    """

    lines: int = 0
    records: int = 0
    max_actions: int = 0
    max_abs_reward: float = 0.0
    groups: int = 0
    reopened: tuple[int, str, int] | None = None

    @property
    def grouped(self) -> bool:
        return self.reopened is None


def scan_rollouts(path: str | Path, progress: Callable[[int], Any] | None = None) -> RolloutScan:
    """One pass over ``path`` holding one line at a time: counts, width, group structure.

    Lenient by design: a line that does not parse, or is not a trajectory, is skipped here (the
    strict reader reports it, naming file, line and field, when it gets there). Every line the
    strict reader accepts is read here with the same values (``reward``, group key, number of
    assistant messages), so the scan's figures are those of the file the strict reader sees.
    """
    scan = RolloutScan()
    group_start: dict[str, int] = {}  # key -> first line of the group
    current: str | None = None
    handle = _open_text(path)
    with handle:
        number = 0
        while True:
            line = _read_line(handle, path, number + 1)
            if not line:
                break
            number += 1
            if not line.strip():
                continue
            scan.lines += 1
            if progress is not None:
                progress(1)
            facts = _record_facts(line)
            del line
            if facts is None:
                continue
            key, reward, actions = facts
            scan.records += 1
            scan.max_actions = max(scan.max_actions, actions)
            scan.max_abs_reward = max(scan.max_abs_reward, abs(reward))
            if key != current:
                if key in group_start:
                    if scan.reopened is None:
                        scan.reopened = (number, key, group_start[key])
                else:
                    group_start[key] = number
                current = key
    scan.groups = len(group_start)
    return scan


def _record_facts(line: str) -> tuple[str, float, int] | None:
    """``(group key, reward, assistant messages)`` of a line that looks like a trajectory, else None."""
    try:
        record = json.loads(line)
        if not isinstance(record, dict) or "id" not in record or "messages" not in record:
            return None
        reward = record.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            return None
        reward = float(reward)
        if not math.isfinite(reward):
            return None
        messages = record["messages"]
        if not isinstance(messages, list):
            return None
        actions = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        return group_key(record), reward, actions
    except Exception:  # anything odd is the strict reader's to report
        return None


#: a flag and the path it was given (``None``: the flag was not given)
NamedPath = tuple[str, "str | Path | None"]


def _file_identity(path: str | Path) -> tuple[Any, ...] | None:
    """What tells files apart: ``(st_dev, st_ino)`` of an existing regular file (through
    symlinks; a hard link shares it), the resolved path of one that does not exist yet, ``None``
    for a device, FIFO or directory (writing to ``/dev/null`` twice replaces nothing)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return ("new", os.path.realpath(path))
    except OSError:
        return None  # unreadable: the reader or the writer names the problem
    if not stat.S_ISREG(info.st_mode):
        return None
    return ("file", info.st_dev, info.st_ino)


def check_distinct_files(inputs: Iterable[NamedPath], outputs: Iterable[NamedPath]) -> None:
    """Refuse an output (or a cache) that is the same file as an input or as another output.

    Each entry is ``(flag, path)``, e.g. ``("--input", "rollouts.jsonl")``. Two paths name the same
    file when they share ``st_dev`` and ``st_ino`` -- another spelling, a symlink or a hard link
    -- or, for files not created yet, the same resolved path. Devices and FIFOs may be named
    more than once (``--input /dev/stdin --out /dev/stdout`` on one terminal).

    Raises:
        OutputError: naming the output, its flag and the flag it collides with, before anything
            is read or written.
    """
    seen: dict[tuple[Any, ...], tuple[str, str, bool]] = {}  # identity -> (flag, path, is an input)
    for entries, is_input in ((inputs, True), (outputs, False)):
        for flag, path in entries:
            if path is None or str(path) == "":
                continue
            identity = _file_identity(path)
            if identity is None:
                continue
            if identity in seen:
                other_flag, other_path, other_is_input = seen[identity]
                if is_input:
                    continue  # reading one file twice (e.g. --input and --rollouts) is fine
                what = "an input would be overwritten" if other_is_input else "two outputs cannot share one file"
                raise OutputError(path, f"{flag} is the same file as {other_flag} {other_path}: {what}")
            seen[identity] = (flag, str(path), is_input)


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records, one JSON object a line; returns the count.

    A regular file (or a new path) is written to a temporary file next to it and renamed over
    it; a symlink is written through to its target the same way; a device or FIFO (``/dev/null``,
    ``/dev/stdout``, a named pipe) is written in place, each line flushed as it is written. A
    record with a non-finite number is refused (:class:`OutputError`): ``NaN``/``Infinity`` are
    not JSON.
    """
    target = Path(path)
    try:
        info = os.stat(target)  # follows symlinks
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise OutputError(path, f"cannot write: {exc.strerror or exc}") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise OutputError(path, "cannot write: is a directory")
    if info is not None and not stat.S_ISREG(info.st_mode):
        try:
            handle = open(target, "w", encoding="utf-8")
        except OSError as exc:
            raise OutputError(path, f"cannot write: {exc.strerror or exc}") from None
        with handle:
            return _write_records(handle, records, path, flush=True)
    real = Path(os.path.realpath(target))  # through any symlink (dangling: the path it names)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        temporary, fd = _create_temporary(real)
    except OSError as exc:
        raise OutputError(path, f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if info is not None:
                os.chmod(temporary, stat.S_IMODE(info.st_mode))
            count = _write_records(handle, records, path)
        os.replace(temporary, real)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(path, f"cannot write: {exc.strerror or exc}") from None
        raise
    return count


def _create_temporary(real: Path) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        temporary = real.with_name(f".{real.name}.{secrets.token_hex(4)}.tmp")
        try:
            return temporary, os.open(temporary, flags, 0o666)  # the umask applies, as for open()
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {real}")


def _write_records(handle: Any, records: Iterable[dict[str, Any]], path: str | Path, flush: bool = False) -> int:
    """``flush``: each line goes out as it is written (a pipe's reader sees every record as soon as
    it is done, not when a buffer fills)."""
    count = 0
    for record in records:
        try:
            text = json.dumps(record, ensure_ascii=False, allow_nan=False)
        except ValueError as exc:
            raise OutputError(path, f"record {count + 1}: {exc}") from None
        handle.write(text + "\n")
        if flush:
            handle.flush()
        count += 1
    return count
