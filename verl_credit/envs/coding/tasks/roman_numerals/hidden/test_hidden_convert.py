import pytest
from roman.convert import to_roman
from roman.parse import from_roman


def test_four_and_nine():
    assert to_roman(4) == "IV"
    assert to_roman(9) == "IX"


def test_tens_and_hundreds():
    assert to_roman(40) == "XL"
    assert to_roman(90) == "XC"
    assert to_roman(400) == "CD"
    assert to_roman(900) == "CM"


def test_full_numbers():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
    assert to_roman(8) == "VIII"


def test_round_trip():
    for number in range(1, 400):
        assert from_roman(to_roman(number)) == number


def test_out_of_range():
    with pytest.raises(ValueError):
        to_roman(0)
