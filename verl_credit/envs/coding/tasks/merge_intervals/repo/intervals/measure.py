"""Sizes of interval sets."""


def total_length(intervals: list[list[int]]) -> int:
    """Sum of the lengths of (already disjoint) intervals."""
    return sum(end - start for start, end in intervals)


def contains(intervals: list[list[int]], point: int) -> bool:
    """Whether ``point`` lies in any interval."""
    return any(start <= point <= end for start, end in intervals)
