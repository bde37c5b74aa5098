"""Roman numerals back to integers."""

VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def from_roman(text: str) -> int:
    """``from_roman("XIV") == 14``."""
    total = 0
    for index, char in enumerate(text):
        value = VALUES[char]
        if index + 1 < len(text) and VALUES[text[index + 1]] > value:
            total -= value
        else:
            total += value
    return total
