"""URL slugs."""

import re


def slugify(text: str) -> str:
    """Lowercase ASCII slug: runs of other characters become one dash; no leading/trailing dashes."""
    return re.sub(r"[^a-z0-9]", "-", text.lower())
