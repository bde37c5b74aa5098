"""Split a list into pages."""


def page_count(total: int, per_page: int) -> int:
    """Number of pages needed for ``total`` items."""
    if per_page < 1:
        raise ValueError("per_page must be >= 1")
    return -(-total // per_page)


def paginate(items: list, page: int, per_page: int) -> list:
    """Return the items on the 1-based page ``page``."""
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be >= 1")
    start = page * per_page
    return items[start : start + per_page]
