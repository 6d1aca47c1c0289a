"""A held tool call through the ``orga`` entry point in subprocesses, on the embedded runtime:
``orga run`` stops at the held ``git push``, ``orga review show`` shows the call, a bad edit is
refused naming the field (the review stays open), an edit from a file runs the call."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.integration.harness import cli_env, run_orga, task_id_printed

pytestmark = pytest.mark.integration

PUSH = {"command": "git push origin main"}
EDITED = {"command": "echo pushed to review > pushed.txt"}


def test_held_push_is_edited_from_the_cli(tmp_path: Path) -> None:
    """`orga run` exits 3 printing the held call and its decide commands once the turn's other
    call answered; a bad edit exits 1 naming the field; `--edit --args-file` runs the edited
    call and the task completes."""
    task = tmp_path / "task.yaml"
    write = {"path": "notes.txt", "content": "written beside the push"}
    reply = {
        "tool_calls": [
            {"name": "run_command", "arguments": PUSH},
            {"name": "file_write", "arguments": write},
        ]
    }
    task.write_text(
        yaml.safe_dump(
            {
                "goal": "ship the fix",
                "provider": {"kind": "scripted", "replies": [reply, "pushed for review"]},
                "steps": [{"id": "ship", "instruction": "push the branch"}],
                "policy": {"require_approval": ["run_command:git push*"]},
            }
        )
    )
    env = cli_env(tmp_path)
    held = run_orga("run", str(task), env=env)
    assert held.returncode == 3, held.stdout + held.stderr
    task_id = task_id_printed(held.stdout)
    assert "held call: run_command" in held.stdout
    workspace = tmp_path / "workspaces" / task_id
    # `orga run` returned once the turn's other call answered (not under it)
    assert (workspace / "notes.txt").read_text() == "written beside the push"
    edit_line = next(line for line in held.stdout.splitlines() if "--edit" in line)
    assert shlex.split(edit_line)[-3:] == ["--edit", "--args", json.dumps(PUSH)]

    listed = run_orga("review", "list", "--json", env=env)
    (item,) = json.loads(listed.stdout)
    assert (item["task_id"], item["source"]) == (task_id, "call")
    review_id = item["review_id"]
    shown = json.loads(run_orga("review", "show", review_id, env=env).stdout)
    assert shown["snapshot"]["call"]["arguments"] == PUSH
    assert shown["input_schema"]["properties"]["command"]["type"] == "string"

    bad = run_orga("review", "decide", review_id, "--edit", "--args", '{"command": 3}', env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "at 'command': 3 is not of type 'string'" in " ".join((bad.stdout + bad.stderr).split())
    still = json.loads(run_orga("review", "list", "--json", env=env).stdout)
    assert [i["review_id"] for i in still] == [review_id]
    wrong = run_orga("review", "decide", review_id, "--retry", env=env)
    assert wrong.returncode == 1 and "holds one tool call" in wrong.stdout + wrong.stderr

    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps(EDITED))
    decided = run_orga(
        "review", "decide", review_id, "--edit", "--args-file", str(arguments), env=env
    )
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert "decision edit applied" in decided.stdout
    assert (workspace / "pushed.txt").read_text() == "pushed to review\n"
    journal = run_orga("journal", task_id, env=env)
    events = [json.loads(line)["event"] for line in journal.stdout.splitlines()]
    (decision,) = [e for e in events if e["type"] == "CallDecided"]
    assert json.loads(decision["arguments_before"]) == PUSH
    assert json.loads(decision["arguments_after"]) == EDITED
    assert decision["decision"] == "edit" and decision["decided_by"]
