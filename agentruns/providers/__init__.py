"""Providers: where a model turn comes from (``scripted`` or any OpenAI-compatible endpoint)."""
