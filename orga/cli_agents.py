"""``orga agents add FILE | list | show NAME | remove NAME``: the agent registry.

A profile file is YAML or JSON (:class:`shared.agent_profile.AgentProfile`); a typo is refused
with the field and the fix, as in a task file. A task uses a profile with ``agent: NAME``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from coordinator.agents import AgentExistsError, AgentRegistry
from orga.cli_runtime import fail, out, say, with_redis
from shared.agent_profile import AgentProfile, AgentProfileError, load_agent_file

__all__ = ["agents_app"]

agents_app = typer.Typer(
    help="Named agent profiles a task can start from (`agent: NAME`).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

AgentName = Annotated[str, typer.Argument(metavar="NAME", help="A registered agent's name.")]


@agents_app.command("add")
def agents_add(
    agent_file: Annotated[
        Path, typer.Argument(metavar="FILE", help="A YAML or JSON agent profile.")
    ],
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite an agent of the same name.")
    ] = False,
) -> None:
    """Register an agent profile."""
    try:
        profile = load_agent_file(agent_file)
    except AgentProfileError as exc:
        raise fail("invalid agent:", exc, 2) from exc
    try:
        with_redis(lambda r: AgentRegistry(r).add(profile, replace=replace))
    except AgentExistsError as exc:
        raise fail("error:", exc, 1) from exc
    say(f"agent {profile.name} registered")


@agents_app.command("list")
def agents_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The registered agents."""
    profiles = with_redis(lambda r: AgentRegistry(r).profiles())
    if as_json:
        out.print_json(json.dumps([json.loads(p.to_json()) for p in profiles]))
        return
    table = Table("agent", "provider", "model", "tools", "policy", "description")
    for profile in profiles:
        table.add_row(*(Text(cell) for cell in _row(profile)))
    out.print(table)


def _row(profile: AgentProfile) -> tuple[str, ...]:
    provider = profile.provider
    return (
        profile.name,
        (provider.kind if provider else None) or "-",
        (provider.model if provider else None) or "-",
        ", ".join(profile.tools) if profile.tools is not None else "-",
        profile.policy.kind if profile.policy else "-",
        profile.description or "",
    )


@agents_app.command("show")
def agents_show(name: AgentName) -> None:
    """One agent profile, as JSON."""
    try:
        profile = with_redis(lambda r: AgentRegistry(r).require(name))
    except LookupError as exc:
        raise fail("error:", exc.args[0], 1) from exc
    out.print_json(profile.to_json())


@agents_app.command("remove")
def agents_remove(name: AgentName) -> None:
    """Unregister an agent (tasks already accepted keep what they were merged with)."""
    removed = with_redis(lambda r: AgentRegistry(r).remove(name))
    if not removed:
        raise fail("error:", f"no agent {name!r}; `orga agents list` shows them", 1)
    say(f"agent {name} removed")
