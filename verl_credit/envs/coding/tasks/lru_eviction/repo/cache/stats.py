"""Hit/miss counting wrapper."""

from cache.lru import LRUCache

_MISSING = object()


class CountingCache:
    """Wraps a cache and counts hits and misses of ``get``."""

    def __init__(self, cache: LRUCache) -> None:
        self.cache = cache
        self.hits = 0
        self.misses = 0

    def get(self, key):
        value = self.cache.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return None
        self.hits += 1
        return value
