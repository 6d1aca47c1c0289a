"""The review inbox on the web (``orga inbox``): open reviews with their context and the three
decisions, the tasks with live progress, each task's journal.

Server-rendered (Starlette, Jinja2 with autoescape, a small script for live updates), behind
reviewer authentication and CSRF-checked forms; decisions go through :class:`OrgaClient`, the
same control path as ``orga review decide``.
"""

from coordinator.inbox.app import create_app
from coordinator.inbox.auth import InboxConfigError, ReviewerAuth
from coordinator.inbox.server import run_inbox

__all__ = ["InboxConfigError", "ReviewerAuth", "create_app", "run_inbox"]
