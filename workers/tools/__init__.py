"""Tools the agent can call, and their registry (built-ins plus the ``orga.tools`` entry points)."""
