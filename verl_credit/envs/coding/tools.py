"""Tool schemas of the coding sandbox (OpenAI function-tool format) and argument checking.

The names follow docs/design.md section 2.2's role signals: ``read_file``/``search``/``list_dir`` gather
information (IG), ``edit_file``/``write_file`` execute (AE, their results hold a unified diff),
``run_tests`` verifies (RV); ``bash`` is classified by its command line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["TOOL_NAMES", "TOOL_SCHEMAS", "ToolArgumentError", "check_arguments"]


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_PATH = {"type": "string", "description": "Path relative to the repository root."}
_LINE = {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    _tool(
        "read_file",
        "Read a text file of the repository. Optional 1-based inclusive line range.",
        {"path": _PATH, "start_line": _LINE, "end_line": _LINE},
        ["path"],
    ),
    _tool(
        "search",
        "Search file contents for a regular expression (like `grep -rn`). Prints path:line:text.",
        {"pattern": {"type": "string"}, "path": {**_PATH, "description": "Directory or file to search (default .)."}},
        ["pattern"],
    ),
    _tool("list_dir", "List a directory (directories end with /).", {"path": _PATH}, []),
    _tool(
        "edit_file",
        "Replace the exact text `old` by `new` in a file. `old` must occur exactly once unless replace_all "
        "is true. The file must have been read first. The result shows the unified diff.",
        {
            "path": _PATH,
            "old": {"type": "string"},
            "new": {"type": "string"},
            "replace_all": {"type": "boolean"},
        },
        ["path", "old", "new"],
    ),
    _tool(
        "write_file",
        "Create or overwrite a file with `content` (an existing file must have been read first). "
        "The result shows the unified diff.",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _tool(
        "run_tests",
        "Run the repository's visible tests with pytest (optionally only `path`) under a time limit.",
        {"path": {**_PATH, "description": "Test file or directory (default: all tests)."}},
        [],
    ),
    _tool(
        "bash",
        "Run a shell command in the repository root (time- and output-limited; no network; "
        "nothing outside the repository is writable).",
        {
            "command": {"type": "string"},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400, "description": "Seconds (capped)."},
        },
        ["command"],
    ),
]

TOOL_NAMES: tuple[str, ...] = tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS)
_SCHEMA_BY_NAME = {schema["function"]["name"]: schema["function"]["parameters"] for schema in TOOL_SCHEMAS}
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


class ToolArgumentError(ValueError):
    """A tool call with an unknown name, a missing argument, or an argument of the wrong type or
    out of its range."""


def check_arguments(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``arguments`` against the tool's schema; returns a plain dict of the known arguments.

    Raises:
        ToolArgumentError: naming the tool and the offending argument.
    """
    if name not in _SCHEMA_BY_NAME:
        raise ToolArgumentError(f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}")
    if not isinstance(arguments, Mapping):
        raise ToolArgumentError(f"{name}: arguments must be a JSON object, got {type(arguments).__name__}")
    schema = _SCHEMA_BY_NAME[name]
    properties: dict[str, Any] = schema["properties"]
    missing = [key for key in schema["required"] if key not in arguments]
    if missing:
        raise ToolArgumentError(f"{name}: missing required argument(s) {', '.join(missing)}")
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise ToolArgumentError(f"{name}: unknown argument(s) {', '.join(unknown)}; known: {', '.join(properties)}")
    checked: dict[str, Any] = {}
    for key, value in arguments.items():
        if value is None and key not in schema["required"]:
            continue
        expected = _JSON_TYPES[properties[key]["type"]]
        bad_bool = isinstance(value, bool) and bool not in expected
        if not isinstance(value, expected) or bad_bool:
            raise ToolArgumentError(
                f"{name}: argument {key!r} must be of type {properties[key]['type']}, got {type(value).__name__}"
            )
        problem = _value_problem(value, properties[key])
        if problem is not None:
            raise ToolArgumentError(f"{name}: argument {key!r} {problem}")
        checked[key] = value
    return checked


def _value_problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    """Why ``value`` (already of the schema's type) is unusable, or None.

    JSON lets a model send ``NaN``, ``Infinity``, ``1e999`` or a 400-digit integer: numbers must be
    finite and inside the schema's ``minimum``/``maximum``/``exclusiveMinimum``, so that no value
    disables a cap (a NaN deadline never passes) or overflows a conversion. Strings must be
    encodable text (a lone surrogate such as ``"\\ud800"`` cannot be written to a file or an argv).
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"is not valid text (a lone surrogate at position {exc.start})"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if abs(value) < 10**15:
        shown: Any = value
    else:  # never float() or str() a huge integer (OverflowError, the int-to-str digit limit)
        sign = "-" if value < 0 else ""
        shown = f"{value:.3g}" if isinstance(value, float) else f"{sign}an integer of {value.bit_length()} bits"
    if "minimum" in schema and value < schema["minimum"]:
        return f"must be >= {schema['minimum']}, got {shown}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return f"must be > {schema['exclusiveMinimum']}, got {shown}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"must be <= {schema['maximum']}, got {shown}"
    return None
