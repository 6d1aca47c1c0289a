"""Task ids: one plain folder name, so a task's workspace stays under ORGA_WORKSPACE_ROOT."""

from __future__ import annotations

import pytest

from shared.task_spec import TaskSpecError, check_task_id, task_workspace


@pytest.mark.parametrize("task_id", ["a", "A.b-c_d", "0" * 128, "41abe5d04609"])
def test_a_valid_id_names_a_folder_under_the_root(task_id: str) -> None:
    """A valid id is returned as is and its workspace is ``{root}/{task_id}``."""
    assert check_task_id(task_id) == task_id
    assert task_workspace("/ws", task_id) == f"/ws/{task_id}"


@pytest.mark.parametrize(
    "task_id",
    ["", ".", "..", "../escape", "a/b", "a\\b", "/abs", ".hidden", "x" * 129, "é", "a b", "a\0"],
)
def test_an_invalid_id_is_refused_naming_it_and_the_rule(task_id: str) -> None:
    """Empty, dot names, separators, a leading dot, over 128 characters, non-ASCII, spaces and
    NUL are refused with the id, the rule and the fix."""
    with pytest.raises(TaskSpecError, match="is not valid: use 1 to 128 letters") as caught:
        check_task_id(task_id)
    assert repr(task_id[:64]) in str(caught.value)
    with pytest.raises(TaskSpecError):
        task_workspace("/ws", task_id)


def test_a_huge_id_is_shown_cut_with_its_length() -> None:
    """A megabyte id is named by its first 64 characters and its length, not echoed whole."""
    with pytest.raises(TaskSpecError) as caught:
        check_task_id("y" * 1_000_000)
    assert "(1000000 characters)" in str(caught.value)
    assert len(str(caught.value)) < 400
