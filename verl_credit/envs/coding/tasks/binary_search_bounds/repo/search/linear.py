"""Linear search, used as a reference in benchmarks."""


def find_linear(items: list[int], target: int) -> int:
    """Index of the first ``target`` in ``items``, or -1."""
    for index, item in enumerate(items):
        if item == target:
            return index
    return -1
