from textutil.slug import slugify
from textutil.titles import title_case


def test_double_space_gives_one_dash():
    assert slugify("hello  world") == "hello-world"


def test_punctuation_is_stripped_at_the_ends():
    assert slugify("Hello, World!") == "hello-world"


def test_leading_symbols():
    assert slugify("  --Rust & Go--  ") == "rust-go"


def test_digits_kept():
    assert slugify("Top 10 Tips") == "top-10-tips"


def test_title_case_unchanged():
    assert title_case("the art of war") == "The Art of War"
