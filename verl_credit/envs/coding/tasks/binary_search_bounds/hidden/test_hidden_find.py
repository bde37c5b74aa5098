from search.bisect_find import find
from search.linear import find_linear


def test_last_element_is_found():
    assert find([1, 3, 5, 7], 7) == 3


def test_first_element_is_found():
    assert find([1, 2, 3], 1) == 0


def test_single_element():
    assert find([4], 4) == 0
    assert find([4], 5) == -1


def test_absent_values():
    assert find([], 1) == -1
    assert find([1, 3, 5], 4) == -1
    assert find([1, 3, 5], 9) == -1


def test_agrees_with_linear_search():
    items = list(range(0, 40, 3))
    for target in range(-2, 45):
        assert find(items, target) == find_linear(items, target)
