"""The OpenAI-compatible client of `tracekit agent` and `analyze --llm` (the `agent` extra)."""

from __future__ import annotations


def openai_client(base_url: str | None, key: str, timeout: float = 120.0):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=1)
