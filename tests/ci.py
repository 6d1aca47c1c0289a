"""What a test needs and CI always provides: missing in CI is a failure saying what is missing
and how to provide it, elsewhere a skip with the same words (as the real-Redis fixtures do)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["require"]


def require(what: str, fix: str) -> NoReturn:
    """Fail under ``CI=true`` (the test must run there), else skip; both say ``what`` is
    missing and the ``fix``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI and missing: {fix}", pytrace=False)
    pytest.skip(f"{what} is missing: {fix}")
