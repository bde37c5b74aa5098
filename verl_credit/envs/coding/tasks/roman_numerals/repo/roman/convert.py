"""Integers to Roman numerals (standard subtractive notation, 1..3999)."""

NUMERALS = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(number: int) -> str:
    """``to_roman(1994) == "MCMXCIV"``."""
    if not 0 < number < 4000:
        raise ValueError("number must be in 1..3999")
    parts = []
    for value, symbol in NUMERALS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)
