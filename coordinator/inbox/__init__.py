"""The review inbox on the web (``orga inbox``): open reviews with their context and the three
decisions, the tasks with live progress, each task's journal.

Server-rendered (Starlette, Jinja2 with autoescape, a small script for live updates), behind
reviewer authentication and CSRF-checked forms; decisions go through :class:`OrgaClient`, the
same control path as ``orga review decide``. Serving it (uvicorn, the embedded runtime) is
process assembly: :mod:`orga.inbox`.
"""

from coordinator.inbox.app import create_app
from coordinator.inbox.auth import InboxConfigError, ReviewerAuth

__all__ = ["InboxConfigError", "ReviewerAuth", "create_app"]
