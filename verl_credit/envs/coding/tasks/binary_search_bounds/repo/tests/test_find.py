from search.bisect_find import find


def test_last_element_is_found():
    assert find([1, 3, 5, 7], 7) == 3
