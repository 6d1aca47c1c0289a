"""The partition count a deployment was created with, and the check every process makes.

The number of partitions (``ORGA_PARTITIONS``, :mod:`shared.keys`) is fixed when a deployment
is created: the first process started on a Redis stores it in ``orga:partitions`` (``SET NX``);
every process started later compares its own setting with the stored value and refuses to run
with another (a task's keys would be looked for in another partition). Pure: the callers read
and write Redis (coordinators and the client with redis-py, workers with theirs).
"""

from __future__ import annotations

from shared.errors import ConfigError

__all__ = ["check_partitions", "legacy_layout_error"]


def check_partitions(stored: str | bytes | None, configured: int, who: str) -> int:
    """The deployment's partition count; ConfigError naming both values and the fix when
    ``stored`` (``orga:partitions``, read after the ``SET NX``) is not ``configured``."""
    if stored is None:
        raise ConfigError(
            "orga:partitions is not set although it was just written: is the Redis evicting or "
            "read-only? Check its maxmemory-policy (noeviction) and that it is a primary"
        )
    text = stored.decode() if isinstance(stored, bytes) else str(stored)
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"orga:partitions holds {text!r}, not a partition count: the key was written by "
            "something else; set it back to the deployment's ORGA_PARTITIONS"
        )
    if int(text) != configured:
        raise ConfigError(
            f"this {who} was started with ORGA_PARTITIONS={configured} but the deployment was "
            f"created with {int(text)} partitions (Redis key orga:partitions): set "
            f"ORGA_PARTITIONS={int(text)} (the count is fixed once a deployment exists)"
        )
    return configured


def legacy_layout_error(found: list[str]) -> ConfigError:
    """The refusal of a coordinator that finds keys of the layout before partitions."""
    return ConfigError(
        f"this Redis holds keys of orga-queue's layout before partitions ({', '.join(found)}): "
        "their tasks and entries would never be driven again. Upgrade by draining: stop "
        "submitting, let the old version's coordinators finish every task (`orga status` shows "
        "no active task, the intake, observations, control and outbox streams empty), stop them, "
        "delete those keys (or use a fresh Redis), then start this version (docs/deploy.md)"
    )
