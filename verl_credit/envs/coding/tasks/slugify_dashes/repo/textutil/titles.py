"""Title casing."""

SMALL_WORDS = {"a", "an", "and", "of", "the", "to"}


def title_case(text: str) -> str:
    """Capitalize words except small words that are not first."""
    words = text.split()
    return " ".join(
        word if index and word.lower() in SMALL_WORDS else word.capitalize() for index, word in enumerate(words)
    )
