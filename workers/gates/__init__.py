"""Policy gates: each proposed action is allowed, denied or modified before it runs."""
