"""A small service whose latency report someone asked about."""

import time

CACHE: dict[str, str] = {}


def handle(key: str) -> str:
    """Answer a request; slow when the cache is cold."""
    if key not in CACHE:
        time.sleep(0.2)  # simulated backend call
        CACHE[key] = key.upper()
    return CACHE[key]
