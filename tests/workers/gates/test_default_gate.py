"""The default gate's rules: allow-list, workspace paths, destructive commands, escapes, depth."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.actions import Allow, Deny, ToolCallAction
from shared.errors import ConfigError
from tests.workers.gates.actions import context, decide, delegate, respond, terminate, tool
from workers.gates.default import DefaultPolicyGate

GATE = DefaultPolicyGate()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace with a file, a sub-directory, and a symlink pointing out of it."""
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print(1)\n")
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "key.txt").write_text("k")
    (root / "escape").symlink_to(outside)
    (root / "inner").symlink_to(root / "src")
    return root


def reason_of(decision: object) -> str:
    """The reason of a Deny (fails the test for anything else)."""
    assert isinstance(decision, Deny), decision
    return decision.reason


# -- what is always allowed ------------------------------------------------------------------


def test_respond_and_terminate_allowed() -> None:
    """Unlike Symbiont's fail-closed default, the agent may always answer and stop."""
    assert isinstance(decide(GATE, respond()), Allow)
    assert isinstance(decide(GATE, terminate()), Allow)


def test_ordinary_tools_allowed_without_workspace_rules() -> None:
    """A tool that is neither a file nor a command tool is allowed (not deny-everything)."""
    assert isinstance(decide(GATE, tool("web_fetch", {"url": "https://example.com"})), Allow)
    assert isinstance(decide(GATE, delegate()), Allow)


# -- the per-task allow-list -----------------------------------------------------------------


def test_allow_list_denies_unlisted_tool() -> None:
    """A tool outside GateContext.allowed_tools is denied, naming the allowed ones."""
    ctx = context(allowed_tools=frozenset({"grep", "file_read"}))
    decision = decide(GATE, tool("run_command", {"command": "ls"}), ctx)
    assert reason_of(decision) == (
        "Tool 'run_command' not in allowed list (allowed: file_read, grep)"
    )


def test_allow_list_allows_listed_tool(workspace: Path) -> None:
    """A listed tool goes on to the other rules."""
    ctx = context(workspace, allowed_tools=frozenset({"file_read"}))
    assert isinstance(decide(GATE, tool("file_read", {"path": "src/app.py"}), ctx), Allow)


def test_empty_allow_list_denies_every_tool() -> None:
    """An empty allow-list means no tool at all."""
    decision = decide(GATE, tool("grep", {"pattern": "x"}), context(allowed_tools=frozenset()))
    assert reason_of(decision) == "Tool 'grep' not in allowed list (allowed: none)"


# -- file tool paths -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("file_read", {"path": "src/app.py"}),
        ("file_read", {"path": "./src/../src/app.py"}),
        ("file_read", {"path": "inner/app.py"}),
        ("file_write", {"path": "new/dir/file.txt", "content": "x"}),
        ("file_list", {"path": "."}),
        ("file_list", {}),
        ("grep", {"pattern": "print", "path": "src"}),
    ],
)
def test_paths_inside_workspace_allowed(
    workspace: Path, name: str, arguments: dict[str, str]
) -> None:
    """Relative paths that stay inside (symlinks inside included) are allowed."""
    assert isinstance(decide(GATE, tool(name, arguments), context(workspace)), Allow)


def test_absolute_path_inside_workspace_allowed(workspace: Path) -> None:
    """An absolute path is fine when it lands inside the workspace."""
    action = tool("file_read", {"path": str(workspace / "src" / "app.py")})
    assert isinstance(decide(GATE, action, context(workspace)), Allow)


def test_dotdot_escape_denied(workspace: Path) -> None:
    """A path climbing out with '..' is denied, naming the rule, the argument and the target."""
    decision = decide(GATE, tool("file_read", {"path": "../secrets/key.txt"}), context(workspace))
    target = workspace.parent.resolve() / "secrets" / "key.txt"
    assert reason_of(decision) == (
        f"rule 'workspace-paths': file_read argument 'path'='../secrets/key.txt' resolves to "
        f"{target}, outside the workspace {workspace.resolve()}"
    )


def test_absolute_path_outside_denied(workspace: Path) -> None:
    """An absolute path elsewhere is denied."""
    decision = decide(
        GATE, tool("file_write", {"path": "/etc/passwd", "content": "x"}), context(workspace)
    )
    assert "rule 'workspace-paths': file_write argument 'path'='/etc/passwd'" in reason_of(decision)


def test_symlink_out_denied(workspace: Path) -> None:
    """A symlink inside the workspace that points out is resolved and denied."""
    decision = decide(GATE, tool("file_read", {"path": "escape/key.txt"}), context(workspace))
    assert "outside the workspace" in reason_of(decision)
    assert "secrets" in reason_of(decision)


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("file_read", {"path": "../ws-evil/loot.txt"}),
        ("file_write", {"path": "../ws-evil/new.txt", "content": "x"}),
        ("file_list", {"path": "../ws-evil"}),
        ("grep", {"pattern": "x", "path": "../ws-evil"}),
        ("file_read", {"path": "{root}-evil/loot.txt"}),
        ("run_command", {"command": "ls", "cwd": "{root}-evil"}),
    ],
)
def test_sibling_sharing_the_workspace_name_is_outside(
    workspace: Path, name: str, arguments: dict[str, str]
) -> None:
    """``ws-evil`` next to ``ws`` is outside ``ws``: containment compares whole path components,
    not string prefixes."""
    (workspace.parent / "ws-evil").mkdir()
    (workspace.parent / "ws-evil" / "loot.txt").write_text("loot")
    filled = {k: v.replace("{root}", str(workspace)) for k, v in arguments.items()}
    decision = decide(GATE, tool(name, filled), context(workspace))
    assert f"resolves to {workspace.resolve()}-evil" in reason_of(decision)


@pytest.mark.parametrize(
    "command",
    ["cd ../ws-evil && ls", "echo x > ../ws-evil/f", "cd {root}-evil", "tee {root}-evil/f"],
)
def test_command_into_a_sibling_sharing_the_workspace_name_is_denied(
    workspace: Path, command: str
) -> None:
    """A command that cds or writes into ``ws-evil`` next to ``ws`` leaves the workspace."""
    (workspace.parent / "ws-evil").mkdir()
    action = tool("run_command", {"command": command.replace("{root}", str(workspace))})
    assert reason_of(decide(GATE, action, context(workspace))).startswith(
        "rule 'command-workspace-escape'"
    )


def test_sibling_sharing_an_extra_root_name_is_outside(workspace: Path, tmp_path: Path) -> None:
    """An extra write root ``cache`` does not admit ``cache-evil`` beside it."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache-evil").mkdir()
    gate = DefaultPolicyGate(extra_write_roots=[tmp_path / "cache"])
    action = tool("file_write", {"path": str(tmp_path / "cache-evil" / "a"), "content": ""})
    assert "outside the workspace" in reason_of(decide(gate, action, context(workspace)))


def test_grep_path_checked(workspace: Path) -> None:
    """grep's path argument is a file path too."""
    decision = decide(GATE, tool("grep", {"pattern": "k", "path": "/"}), context(workspace))
    assert reason_of(decision).startswith("rule 'workspace-paths': grep argument 'path'='/'")


def test_nul_byte_in_path_denied(workspace: Path) -> None:
    """A path that cannot be resolved is denied, not raised."""
    decision = decide(GATE, tool("file_read", {"path": "a\x00b"}), context(workspace))
    assert "cannot be resolved" in reason_of(decision)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("src/app.py", None),
        ("a/../b", None),
        ("../x", "climbs out of the working directory"),
        ("a/../../x", "climbs out of the working directory"),
        ("/etc/passwd", "is an absolute path, and no workspace is set to check it against"),
    ],
)
def test_paths_without_workspace(path: str, expected: str | None) -> None:
    """Without a workspace, relative paths must not climb out and absolute paths are refused."""
    decision = decide(GATE, tool("file_read", {"path": path}), context())
    if expected is None:
        assert isinstance(decision, Allow)
    else:
        assert reason_of(decision).endswith(expected)


def test_extra_write_root_allowed(workspace: Path, tmp_path: Path) -> None:
    """A configured extra root is as good as the workspace."""
    cache = tmp_path / "cache"
    cache.mkdir()
    gate = DefaultPolicyGate(extra_write_roots=[cache])
    action = tool("file_write", {"path": str(cache / "a.bin"), "content": ""})
    assert isinstance(decide(gate, action, context(workspace)), Allow)
    assert isinstance(decide(GATE, action, context(workspace)), Deny)


def test_unparsable_arguments_fail_closed(workspace: Path) -> None:
    """Arguments that cannot be read cannot be checked, so the file tool is denied."""
    action = ToolCallAction(call_id="c", name="file_read", arguments="[1]")
    assert "arguments cannot be checked" in reason_of(decide(GATE, action, context(workspace)))


# -- commands --------------------------------------------------------------------------------


def test_destructive_command_reason(workspace: Path) -> None:
    """A deny-list hit names the rule, what it guards against, and the command."""
    decision = decide(GATE, tool("run_command", {"command": "sudo rm -rf /"}), context(workspace))
    assert reason_of(decision) == (
        "rule 'rm-root' (recursive delete of /, the home directory or a system directory) "
        "denied run_command: 'sudo rm -rf /'"
    )


@pytest.mark.parametrize(
    "command",
    [
        "pytest -q",
        "rm -rf build/ && make",
        "git push origin feature",
        "cd src && ls",
        "cd src && cd .. && ls",
        "echo x > out.txt",
        "echo x >> logs/run.log 2>&1",
        "make 2>/dev/null",
        "cat a | tee copy.txt",
        "echo $HOME_DIR",
        "cd $BUILD_DIR",
        "python -c 'open(\"/tmp/x\")'",
    ],
)
def test_ordinary_commands_allowed(workspace: Path, command: str) -> None:
    """Everyday commands in the workspace pass every rule."""
    assert isinstance(
        decide(GATE, tool("run_command", {"command": command}), context(workspace)), Allow
    )


@pytest.mark.parametrize(
    ("command", "verb", "target"),
    [
        ("cd / && ls", "changes directory to", "/"),
        ("cd ..", "changes directory to", ".."),
        ("cd src; cd ../..", "changes directory to", "../.."),
        ("cd", "changes directory to", "~"),
        ("cd ~/other", "changes directory to", "~/other"),
        ("echo x > /tmp/out.txt", "writes to", "/tmp/out.txt"),
        ("make &> ../build.log", "writes to", "../build.log"),
        ("cd src && echo x > ../../x", "writes to", "../../x"),
        ("date | tee -a /var/tmp/log", "writes to", "/var/tmp/log"),
        ("echo x > escape/key.txt", "writes to", "escape/key.txt"),
        ("echo x > $HOME/.bashrc", "writes to", "$HOME/.bashrc"),
    ],
)
def test_command_workspace_escape_denied(
    workspace: Path, command: str, verb: str, target: str
) -> None:
    """cd and write targets outside the workspace are denied, naming the target."""
    decision = decide(GATE, tool("run_command", {"command": command}), context(workspace))
    reason = reason_of(decision)
    assert reason.startswith(
        f"rule 'command-workspace-escape': run_command {verb} '{target}', which "
    )
    assert reason.endswith(f"(command: '{command}')")


def test_command_escape_without_workspace() -> None:
    """Without a workspace, cd to an absolute path is refused too."""
    decision = decide(GATE, tool("run_command", {"command": "cd /srv && ls"}), context())
    assert "is an absolute path" in reason_of(decision)


def test_command_as_argv_list(workspace: Path) -> None:
    """An argv list is shell-quoted and checked: its items are data unless a shell runs them."""
    ctx = context(workspace)
    assert reason_of(
        decide(GATE, tool("run_command", {"command": ["rm", "-rf", "/"]}), ctx)
    ).startswith("rule 'rm-root'")
    wrapped = tool("run_command", {"command": ["bash", "-c", "make; reboot"]})
    assert reason_of(decide(GATE, wrapped, ctx)).startswith("rule 'power-state'")
    data = tool("run_command", {"command": ["git", "commit", "-m", "a; reboot"]})
    assert isinstance(decide(GATE, data, ctx), Allow)


def test_long_command_is_cut_in_the_reason(workspace: Path) -> None:
    """The reason quotes at most 200 characters of the command."""
    command = "rm -rf / " + "x" * 500
    reason = reason_of(decide(GATE, tool("run_command", {"command": command}), context(workspace)))
    assert reason.endswith("x…'")
    assert len(reason) < 400


def test_extra_deny_pattern(workspace: Path) -> None:
    """A configured pattern denies, under its own name."""
    gate = DefaultPolicyGate(extra_deny_patterns={"no-publish": r"\bnpm publish\b"})
    decision = decide(
        gate, tool("run_command", {"command": "npm publish --access public"}), context(workspace)
    )
    assert reason_of(decision).startswith(
        "rule 'no-publish' (matches the configured deny pattern '\\\\bnpm publish\\\\b')"
    )


def test_disabled_rules(workspace: Path) -> None:
    """Disabled rules no longer deny; the others still do."""
    gate = DefaultPolicyGate(disabled_rules=["rm-workspace-wipe", "command-workspace-escape"])
    ctx = context(workspace)
    assert isinstance(decide(gate, tool("run_command", {"command": "rm -rf *"}), ctx), Allow)
    assert isinstance(decide(gate, tool("run_command", {"command": "cd / && ls"}), ctx), Allow)
    assert isinstance(decide(gate, tool("run_command", {"command": "rm -rf /"}), ctx), Deny)


def test_disabled_workspace_paths(workspace: Path) -> None:
    """Turning off workspace-paths lets a file tool reach outside."""
    gate = DefaultPolicyGate(disabled_rules=["workspace-paths"])
    assert isinstance(
        decide(gate, tool("file_read", {"path": "/etc/hosts"}), context(workspace)), Allow
    )


def test_unknown_disabled_rule_rejected() -> None:
    """A misspelt rule name is a configuration error."""
    with pytest.raises(ConfigError, match="unknown rule name"):
        DefaultPolicyGate(disabled_rules=["workspace-path"])


def test_custom_command_tools(workspace: Path) -> None:
    """Other tool names can be treated as shell commands."""
    gate = DefaultPolicyGate(command_tools={"run_command", "bash"})
    assert isinstance(decide(gate, tool("bash", {"command": "reboot"}), context(workspace)), Deny)


# -- delegation ------------------------------------------------------------------------------


@pytest.mark.parametrize(("depth", "allowed"), [(0, True), (2, True), (3, False), (7, False)])
def test_delegation_depth(depth: int, allowed: bool) -> None:
    """Delegating from depth d creates depth d+1, allowed up to the limit (3 by default)."""
    decision = decide(GATE, delegate("helper"), context(delegation_depth=depth))
    if allowed:
        assert isinstance(decision, Allow)
    else:
        assert reason_of(decision) == (
            f"rule 'delegation-depth': delegating to 'helper' would reach depth {depth + 1}, "
            "over the limit of 3"
        )


def test_delegation_unbounded() -> None:
    """max_delegation_depth=None removes the limit."""
    gate = DefaultPolicyGate(max_delegation_depth=None)
    assert isinstance(decide(gate, delegate(), context(delegation_depth=50)), Allow)


@settings(max_examples=200, deadline=None)
@given(command=st.text(max_size=300), path=st.text(max_size=60))
def test_never_raises_on_arbitrary_input(command: str, path: str) -> None:
    """Whatever the model sends, the gate answers with a decision instead of raising."""
    ctx = context(Path("/tmp/orga-ws-does-not-exist"))
    GATE.denial_reason(tool("run_command", {"command": command}), ctx)
    GATE.denial_reason(tool("file_read", {"path": path}), ctx)
    GATE.denial_reason(tool("run_command", {"command": command}), context())
