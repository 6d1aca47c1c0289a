"""Test doubles that speak real wire formats (fake LLM servers on 127.0.0.1)."""
