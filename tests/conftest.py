"""Test-wide fixtures."""
