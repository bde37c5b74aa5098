from stats.central import median


def test_median_even_count():
    assert median([4, 1, 3, 2]) == 2.5
