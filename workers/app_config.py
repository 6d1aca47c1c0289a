"""What a worker's Celery app is configured with beyond Celery's own settings: the runtime
settings, the model keys and the state's client builders, kept beside the app, never in
``app.conf``.

``celery inspect conf`` and Flower's configuration view show ``app.conf`` uncensored (the
worker's ``conf`` control command), and a ``RedisClients``' or ``OrgaSettings``' repr shows
the Redis URL with its password: none of it goes there. :mod:`orga.celery` registers a
:class:`WorkerConfig` for its app; the worker's tasks and bootsteps read it with
:func:`worker_config`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from shared.errors import ConfigError
from shared.settings import OrgaSettings

__all__ = ["WorkerConfig", "register", "worker_config"]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A worker app's settings, model keys and state client builders."""

    settings: OrgaSettings = field(repr=False)
    model_keys: dict[str, str] = field(default_factory=dict, repr=False)
    async_redis: Callable[..., Any] | None = field(default=None, repr=False)
    """Builds the asyncio client of the state (a RedisCluster on a cluster); None: a
    standalone Redis at ``settings.redis_url``."""
    sync_redis: Callable[..., Any] | None = field(default=None, repr=False)
    """The blocking one, for the worker's start checks."""


_CONFIGS: weakref.WeakKeyDictionary[Celery, WorkerConfig] = weakref.WeakKeyDictionary()


def register(app: Celery, config: WorkerConfig) -> None:
    """Keep ``config`` for ``app`` (replacing any)."""
    _CONFIGS[app] = config


def worker_config(app: Celery) -> WorkerConfig:
    """The configuration registered for ``app``; ConfigError when none is."""
    try:
        return _CONFIGS[app]
    except KeyError:
        raise ConfigError(
            f"the Celery app {app.main!r} was not made by orga.celery.create_app: start the "
            "workers with `orga worker` or `celery -A orga worker`"
        ) from None
