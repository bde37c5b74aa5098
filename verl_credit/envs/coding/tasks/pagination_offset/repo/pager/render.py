"""Text rendering of a page for the command line."""

from pager.core import page_count


def render_header(page: int, total: int, per_page: int) -> str:
    """``"Page 2 of 5"``."""
    return f"Page {page} of {page_count(total, per_page)}"


def render_page(items: list) -> str:
    """One item per line, numbered from 1."""
    return "\n".join(f"{number}. {item}" for number, item in enumerate(items, start=1))
