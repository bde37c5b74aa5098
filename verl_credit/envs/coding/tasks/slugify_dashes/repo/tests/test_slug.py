from textutil.slug import slugify


def test_double_space_gives_one_dash():
    assert slugify("hello  world") == "hello-world"
