"""MCP server declarations: validation with clear errors, the offered tool names, the
ORGA_MCP_SERVERS file, and their place in tasks and agent profiles."""

from __future__ import annotations

import json
import re

import pytest

from shared.agent_profile import AgentProfileError, parse_agent
from shared.errors import ConfigError
from shared.mcp import (
    McpListing,
    McpServerSpec,
    McpToolEntry,
    combined_servers,
    offered_tool_name,
    parse_mcp_servers,
    redact_command,
    redact_url,
    split_tool_name,
)
from shared.task_spec import TaskSpecError, parse_task

PROVIDER_NAME = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")


def test_a_stdio_and_an_http_server_are_accepted() -> None:
    """``command`` makes a stdio server and ``url`` a streamable HTTP one."""
    stdio = McpServerSpec(name="notes", command=["python3", "s.py"], env={"A": "1"}, cwd="sub")
    http = McpServerSpec(name="search-1", url="http://127.0.0.1:9/mcp", headers={"X": "y"})
    assert (stdio.transport, http.transport) == ("stdio", "http")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"name": "a b", "command": ["x"]}, "must match"),
        ({"name": "a__b", "command": ["x"]}, "without '__'"),
        ({"name": "a", "command": ["x"], "url": "http://h/mcp"}, "both 'command' and 'url'"),
        ({"name": "a"}, "neither 'command' nor 'url'"),
        ({"name": "a", "url": "ftp://h"}, "not an http(s) URL"),
        ({"name": "a", "url": "http://h/mcp", "env": {"A": "1"}}, "for a 'command' server"),
        ({"name": "a", "command": ["x"], "headers": {"A": "1"}}, "for a 'url' server only"),
        ({"name": "a", "command": [" "]}, "command[0] is empty"),
    ],
)
def test_a_bad_server_is_refused_naming_the_fault(data: dict[str, object], fragment: str) -> None:
    """Each mistake is refused with a message that names it and the fix."""
    with pytest.raises(TaskSpecError, match=re.escape(fragment)):
        parse_task({"goal": "g", "mcp_servers": [data]})


def test_a_credential_in_a_task_or_profile_is_refused_but_not_in_the_deployment_file() -> None:
    """A task and its config are stored (Redis, the journal): an Authorization header or a
    token variable is refused there, with the fix; the workers' file may hold them."""
    header = {"name": "s", "url": "http://h/mcp", "headers": {"Authorization": "Bearer x"}}
    env = {"name": "c", "command": ["x"], "env": {"SEARCH_API_TOKEN": "t"}}
    for server in (header, env):
        with pytest.raises(TaskSpecError, match=r"looks like a credential.*ORGA_MCP_SERVERS"):
            parse_task({"goal": "g", "mcp_servers": [server]})
        with pytest.raises(AgentProfileError, match="looks like a credential"):
            parse_agent({"name": "p", "mcp_servers": [server]})
    assert parse_mcp_servers(json.dumps([header, env]), "f.json")[0].headers
    assert parse_task({"goal": "g", "mcp_servers": [{**env, "env": {"NOTES": "n"}}]})


@pytest.mark.parametrize(
    ("server", "fragment"),
    [
        ({"url": "http://me:hunter2@h/mcp"}, "user information"),
        ({"url": "http://me@h/mcp"}, "user information"),
        ({"url": "https://h/mcp?access_token=abc"}, "'access_token'"),
        ({"url": "https://h/mcp?x=1&api_key=abc"}, "'api_key'"),
        ({"url": "https://h/mcp?X-Amz-Signature=abc"}, "'X-Amz-Signature'"),
        ({"url": "https://h/mcp?password=abc"}, "'password'"),
        ({"url": "https://h/mcp?auth=abc"}, "'auth'"),
        ({"url": "https://h/mcp?client_secret=abc"}, "'client_secret'"),
        ({"command": ["srv", "--token=abc"]}, "--token"),
        ({"command": ["srv", "--api-key", "abc"]}, "--api-key"),
        ({"command": ["srv", "--password", "abc"]}, "--password"),
        ({"command": ["srv", "--client-secret=abc"]}, "--client-secret"),
    ],
)
def test_a_credential_in_a_url_or_argv_is_refused_in_a_task_and_a_profile(
    server: dict[str, object], fragment: str
) -> None:
    """Userinfo, a credential-named query parameter or a ``--token=``-like argument is refused
    in a task and a profile (the value never quoted); the deployment file may hold them."""
    spec = {"name": "s", **server}
    with pytest.raises(TaskSpecError, match="looks like a credential") as raised:
        parse_task({"goal": "g", "mcp_servers": [spec]})
    assert fragment in str(raised.value)
    assert "abc" not in str(raised.value) and "hunter2" not in str(raised.value)
    with pytest.raises(AgentProfileError, match="looks like a credential"):
        parse_agent({"name": "p", "mcp_servers": [spec]})
    assert parse_mcp_servers(json.dumps([spec]), "f.json")[0].name == "s"


@pytest.mark.parametrize(
    "server",
    [
        {"url": "https://h/mcp?page=2&lang=en"},
        {"command": ["srv", "--verbose", "--port", "9"]},
        {"command": ["srv", "--token-file", "/run/secrets/t"]},
        {"command": ["srv", "--api-key"]},
    ],
)
def test_harmless_urls_and_arguments_are_accepted(server: dict[str, object]) -> None:
    """Other query parameters and options, and a credential flag without a value, pass."""
    assert parse_task({"goal": "g", "mcp_servers": [{"name": "s", **server}]})


def test_urls_and_commands_are_redacted_for_errors() -> None:
    """What an error quotes carries no userinfo, no query and no credential option's value."""
    assert redact_url("https://me:pw@h:8443/mcp?token=abc#f") == "https://h:8443/mcp?***"
    assert redact_url("http://h/mcp") == "http://h/mcp"
    assert redact_command(["srv", "--token=abc", "--api-key", "k", "-v"]) == [
        "srv",
        "--token=***",
        "--api-key",
        "***",
        "-v",
    ]


def test_a_server_name_used_twice_is_refused_in_a_task_and_a_profile() -> None:
    """Two servers of one task (or profile) may not share a name."""
    servers = [{"name": "a", "command": ["x"]}, {"name": "a", "url": "http://h/mcp"}]
    with pytest.raises(TaskSpecError, match="'a' is used twice"):
        parse_task({"goal": "g", "mcp_servers": servers})
    with pytest.raises(AgentProfileError, match="'a' is used twice"):
        parse_agent({"name": "p", "mcp_servers": servers})


def test_the_task_servers_reach_the_loop_config_and_a_profile_sets_them() -> None:
    """A task's servers travel in its loop config; a profile's are task defaults."""
    task = parse_task({"goal": "g", "mcp_servers": [{"name": "a", "command": ["x"]}]})
    config = task.loop_config()
    assert config.mcp_servers is not None and config.mcp_servers[0].name == "a"
    assert "mcp_servers" not in parse_task({"goal": "g"}).loop_config().model_dump(mode="json")
    profile = parse_agent({"name": "p", "mcp_servers": [{"name": "b", "url": "http://h/mcp"}]})
    assert profile.task_defaults()["mcp_servers"][0]["name"] == "b"


def test_a_task_server_may_not_reuse_a_deployment_name() -> None:
    """The deployment's names are reserved; the error names the clash and the fix."""
    deployment = (McpServerSpec(name="a", command=["x"]),)
    task = [McpServerSpec(name="a", url="http://h/mcp"), McpServerSpec(name="b", command=["y"])]
    with pytest.raises(ConfigError, match=r"\['a'\].*rename the task's server"):
        combined_servers(deployment, task)
    assert [s.name for s in combined_servers(deployment, task[1:])] == ["a", "b"]


def test_the_deployment_file_is_json_or_yaml_and_errors_name_it() -> None:
    """ORGA_MCP_SERVERS holds a list (or {mcp_servers: [...]}); a fault names the file."""
    assert parse_mcp_servers('[{"name": "a", "command": ["x"]}]', "f.json")[0].name == "a"
    text = "mcp_servers:\n  - name: b\n    url: http://h/mcp\n"
    assert parse_mcp_servers(text, "f.yaml")[0].url == "http://h/mcp"
    with pytest.raises(ConfigError, match=r"f.yaml: server 0: .*both 'command' and 'url'"):
        parse_mcp_servers("- {name: a, command: [x], url: 'http://h/mcp'}", "f.yaml")
    with pytest.raises(ConfigError, match=r"f\.yaml: expected a list"):
        parse_mcp_servers("name: a", "f.yaml")
    with pytest.raises(ConfigError, match=r"'a' is used twice in f\.yaml"):
        parse_mcp_servers("- {name: a, command: [x]}\n- {name: a, command: [y]}", "f.yaml")


@pytest.mark.parametrize(
    "tool",
    ["search", "read.file", "a/b c", "x" * 80, "ünïcode", ""],
)
def test_offered_names_are_names_both_wires_accept(tool: str) -> None:
    """``<server>__<tool>`` is made to fit ``^[A-Za-z0-9_-]{1,64}$`` and keeps its server."""
    name = offered_tool_name("s" * 40, tool)
    assert PROVIDER_NAME.match(name), name
    assert split_tool_name(name)[0] == "s" * 40


def test_offered_names_stay_distinct() -> None:
    """Two tools that clean up to the same name are offered under different names."""
    assert offered_tool_name("srv", "a_b") == "srv__a_b"
    cleaned = offered_tool_name("srv", "a.b", taken=["srv__a_b"])
    assert cleaned.startswith("srv__a_b_") and cleaned != "srv__a_b"
    clash = offered_tool_name("srv", "a_b", taken=["srv__a_b"])
    assert clash.startswith("srv__a_b_") and clash != cleaned
    assert offered_tool_name("srv", "plain") == "srv__plain"


def test_a_listing_resolves_the_target_of_an_offered_name() -> None:
    """The listing maps an offered name back to the server and the server's own tool name."""
    spec = McpServerSpec(name="srv", command=["x"])
    entry = McpToolEntry(offered="srv__a_b_1234", server="srv", tool="a.b")
    listing = McpListing(tools=[entry])
    target = listing.target("srv__a_b_1234", [spec])
    assert target is not None and (target.server.name, target.tool) == ("srv", "a.b")
    assert listing.target("srv__other", [spec]) is None
    assert McpListing.model_validate_json(listing.to_json()) == listing


def test_a_task_naming_an_agent_gets_its_servers_unless_it_declares_its_own() -> None:
    """An agent profile's ``mcp_servers`` are the task's default; a task's own replace them."""
    from shared.agent_profile import resolve_agent

    profile = parse_agent({"name": "p", "mcp_servers": [{"name": "a", "command": ["x"]}]})
    inherited = resolve_agent({"goal": "g", "agent": "p"}, {"p": profile}, "t")
    assert [s.name for s in inherited.mcp_servers] == ["a"]
    own = {"goal": "g", "agent": "p", "mcp_servers": [{"name": "b", "url": "http://h/mcp"}]}
    assert [s.name for s in resolve_agent(own, {"p": profile}, "t").mcp_servers] == ["b"]
