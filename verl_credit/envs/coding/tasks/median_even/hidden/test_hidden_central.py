import pytest
from stats.central import mean, median


def test_median_even_count():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_odd_count():
    assert median([5, 1, 3]) == 3


def test_median_single_value():
    assert median([7]) == 7


def test_median_two_values():
    assert median([10, 0]) == 5


def test_median_empty():
    with pytest.raises(ValueError):
        median([])


def test_mean_unchanged():
    assert mean([1, 2, 3, 4]) == 2.5
