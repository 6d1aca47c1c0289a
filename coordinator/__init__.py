"""The orga-queue coordinator: decides continue, skip, abort or escalate for every task."""
