"""Breaks: the delta is {} when the text is empty."""

from __future__ import annotations


def _chunk(text: str, reason: str | None, chat: bool) -> dict:
    if chat:
        return {"delta": {"content": text}, "finish_reason": reason}
    return {"text": text, "finish_reason": reason}


def stream_chunks(replies: list[dict], chat: bool, include_usage: bool, prompt_tokens: int) -> list:
    """The payloads of a streamed reply, in order, ending with "[DONE]"."""
    out: list = []
    if chat:
        out.append({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    completion_tokens = 0
    for reply in replies:
        completion_tokens += reply["num_tokens"]
        if reply["text"] or reply["finished"]:
            out.append(_chunk(reply["text"], reply["finish_reason"], chat))
        if reply["finished"]:
            break
    if include_usage:
        out.append(
            {
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
            }
        )
    return out + ["[DONE]"]
