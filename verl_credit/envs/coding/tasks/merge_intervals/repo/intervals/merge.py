"""Merging overlapping intervals."""


def merge(intervals: list[list[int]]) -> list[list[int]]:
    """Merge overlapping or touching closed intervals; the result is sorted by start."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return merged
