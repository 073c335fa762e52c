from agent.response_cache import CachedGeneration, ResponseCache, cache_key


def entry(text: str) -> CachedGeneration:
    return CachedGeneration(text, (1, 2, 3), "stop", 10, 3)


def test_round_trip_and_key_ignores_field_order() -> None:
    cache = ResponseCache(10_000)
    a = cache_key("m", "v1", "chat", {"x": 1, "y": [1, 2]})
    b = cache_key("m", "v1", "chat", {"y": [1, 2], "x": 1})
    assert a == b
    cache.put(a, entry("hello"))
    assert cache.get(b) == entry("hello")


def test_other_version_or_request_misses() -> None:
    cache = ResponseCache(10_000)
    cache.put(cache_key("m", "v1", "chat", {"x": 1}), entry("hello"))
    assert cache.get(cache_key("m", "v2", "chat", {"x": 1})) is None
    assert cache.get(cache_key("m", "v1", "chat", {"x": 2})) is None


def test_lru_eviction_under_byte_budget() -> None:
    probe = ResponseCache(10_000)
    probe.put(cache_key("m", "v", "e", {}), entry("x"))
    cache = ResponseCache(3 * probe.bytes_used)  # room for exactly three entries
    keys = [cache_key("m", "v", "e", {"i": i}) for i in range(4)]
    for k in keys[:3]:
        cache.put(k, entry("x"))
    assert cache.get(keys[0]) is not None  # 0 is now the most recently used
    cache.put(keys[3], entry("x"))
    assert cache.get(keys[1]) is None  # the least recently used went
    assert cache.get(keys[0]) is not None
    assert cache.bytes_used <= cache.max_bytes


def test_entry_larger_than_budget_is_not_stored() -> None:
    cache = ResponseCache(100)
    cache.put(cache_key("m", "v", "e", {}), entry("x" * 1000))
    assert len(cache) == 0
