"""The one ``DriverInfo`` a worker process gives every Redis connection it opens.

redis-py 8 sends ``CLIENT SETINFO LIB-NAME / LIB-VER`` on each new connection, from the
connection's ``DriverInfo``; given none, it builds one per connection, and that reads the
version from the installed package's metadata (``importlib.metadata.version("redis")``, a file
read): about 3 % of a reasoning worker's CPU while its pools grow in a burst. Built once here
and passed to every pool the workers build, it reports the same name and version.
"""

from __future__ import annotations

from redis.driver_info import DriverInfo

__all__ = ["DRIVER_INFO"]

DRIVER_INFO = DriverInfo()
"""redis-py's name and version, read once per process."""
