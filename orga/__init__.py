"""Process assembly: the ``orga`` command, the embedded runtime, the in-process driver, the
worker topology and its supervisor, and the Celery app (``celery -A orga worker``).

This is the one package that may import both :mod:`coordinator` and :mod:`workers`: it puts
their code into processes. Neither of them imports it, and the coordinator never imports the
workers (``docs/architecture.md`` §1, checked by ``tests/test_layers.py``).

Nothing is imported here: ``orga.celery`` builds its app from the settings when imported (and
refuses to without ``ORGA_REDIS_URL``), and ``python -m orga.supervisor`` must stay small.
"""

__all__: list[str] = []
