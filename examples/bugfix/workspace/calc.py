"""A tiny calculator with a bug in add."""


def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a - b


def mul(a: int, b: int) -> int:
    """Return the product of a and b."""
    return a * b
