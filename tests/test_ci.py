"""A test's missing prerequisite fails under CI=true and skips elsewhere, saying what and how."""

from __future__ import annotations

import pytest

from tests.ci import require


def test_a_missing_prerequisite_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under CI=true, require() fails with what is missing and the fix."""
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the scorer is required in CI and missing: x"):
        require("the scorer", "x")


def test_a_missing_prerequisite_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside CI, require() skips with the same words."""
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the scorer is missing: x"):
        require("the scorer", "x")
