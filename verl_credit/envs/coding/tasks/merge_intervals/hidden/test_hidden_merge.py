from intervals.measure import total_length
from intervals.merge import merge


def test_touching_intervals_merge():
    assert merge([[1, 3], [3, 5]]) == [[1, 5]]


def test_overlapping_intervals_merge():
    assert merge([[1, 4], [2, 6], [8, 9]]) == [[1, 6], [8, 9]]


def test_contained_interval_keeps_outer_end():
    assert merge([[1, 10], [2, 3]]) == [[1, 10]]


def test_unsorted_input():
    assert merge([[5, 6], [1, 2]]) == [[1, 2], [5, 6]]


def test_disjoint_intervals_stay_apart():
    assert merge([[1, 2], [4, 5]]) == [[1, 2], [4, 5]]


def test_total_length_after_merge():
    assert total_length(merge([[0, 2], [1, 5], [5, 6]])) == 6
