"""The offline API: ``from minisgl.llm import LLM``."""

from __future__ import annotations

from .llm import LLM

__all__ = ["LLM"]
