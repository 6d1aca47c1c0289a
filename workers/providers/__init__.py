"""Inference providers: OpenAI-compatible, Anthropic, scripted and function providers."""
