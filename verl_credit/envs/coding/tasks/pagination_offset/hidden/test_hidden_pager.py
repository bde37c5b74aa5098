import pytest
from pager.core import page_count, paginate
from pager.render import render_header


def test_first_page():
    assert paginate(list(range(10)), 1, 3) == [0, 1, 2]


def test_middle_page():
    assert paginate(list(range(10)), 2, 3) == [3, 4, 5]


def test_last_partial_page():
    assert paginate(list(range(10)), 4, 3) == [9]


def test_page_past_the_end_is_empty():
    assert paginate(list(range(10)), 5, 3) == []


def test_invalid_page():
    with pytest.raises(ValueError):
        paginate([1, 2], 0, 3)


def test_header():
    assert page_count(10, 3) == 4
    assert render_header(2, 10, 3) == "Page 2 of 4"
