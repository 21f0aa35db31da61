from __future__ import annotations


def stream_chunks(replies: list[dict], chat: bool, include_usage: bool, prompt_tokens: int) -> list:
    """The payloads of a streamed reply, in order, ending with "[DONE]"."""
    raise NotImplementedError
