"""One object per distinct JSON value of a gateway log.

Every call of a session re-sends the whole conversation so far (and usually the same tool list),
so a session of n calls logs O(n^2) messages of which only O(n) are distinct. The reader passes
each call's request messages and tools through one :class:`Interner`, so equal values share one
object and memory grows with the distinct content, not with the re-sent text. The shared objects
are read, never changed: records built from them copy what they alter.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["Interner"]


class Interner:
    """Maps each value to the first equal one seen (equal: the same JSON text, key order included,
    so a record written from the shared object is byte for byte the one it replaces)."""

    def __init__(self) -> None:
        self._seen: dict[bytes, Any] = {}  # sha256 of the JSON text -> the first value with it

    def __len__(self) -> int:
        return len(self._seen)

    def one(self, value: Any) -> Any:
        """``value`` or the equal value seen first."""
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError):  # not plain JSON: kept as it is
            return value
        return self._seen.setdefault(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), value)

    def many(self, values: list[Any]) -> list[Any]:
        """A new list of :meth:`one` of each value."""
        return [self.one(value) for value in values]
