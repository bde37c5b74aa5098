from cache.lru import LRUCache
from cache.stats import CountingCache


def test_read_protects_from_eviction():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache
    assert "b" not in cache


def test_get_keeps_the_entry():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("a") == 1
    assert len(cache) == 1


def test_eviction_order_after_several_reads():
    cache = LRUCache(3)
    for key in "abc":
        cache.put(key, key.upper())
    cache.get("a")
    cache.get("b")
    cache.put("d", "D")
    assert sorted(cache._data) == ["a", "b", "d"]
    cache.put("e", "E")
    assert sorted(cache._data) == ["b", "d", "e"]


def test_missing_key_default():
    assert LRUCache(1).get("x", 5) == 5


def test_counting_wrapper():
    counting = CountingCache(LRUCache(1))
    counting.cache.put("k", 1)
    assert counting.get("k") == 1
    assert counting.get("z") is None
    assert (counting.hits, counting.misses) == (1, 1)
