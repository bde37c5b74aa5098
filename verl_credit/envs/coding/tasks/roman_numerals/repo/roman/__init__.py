"""Roman numeral conversion."""
