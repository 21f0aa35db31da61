"""Text to token ids and back: chat templates, and incremental detokenization with stop strings.
Only ``transformers`` is needed: the offline path imports no server package."""

from __future__ import annotations

from .detokenize import DecodeState, check_stop, detokenize
from .tokenize import apply_chat_template, encode_text, tokenize_request

__all__ = [
    "DecodeState",
    "apply_chat_template",
    "check_stop",
    "detokenize",
    "encode_text",
    "tokenize_request",
]
