from intervals.merge import merge


def test_touching_intervals_merge():
    assert merge([[1, 3], [3, 5]]) == [[1, 5]]
