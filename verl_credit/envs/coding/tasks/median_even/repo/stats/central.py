"""Measures of central tendency."""


def mean(values: list[float]) -> float:
    """Arithmetic mean."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    """Middle value; for an even number of values, the mean of the two middle values."""
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid]
