"""Chapter 11: chat templates and incremental detokenization.

A chat request becomes token ids through the tokenizer's own chat template. Generated ids become
text piece by piece, as a server streams them: SGLang's offsets decide what is final, so that no
piece ends halfway through a UTF-8 character or with the start of a stop string.
"""

from __future__ import annotations

import tempfile
from typing import Sequence

import tiny_models
import torch
from transformers import AutoTokenizer
from transformers.utils import logging

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.tokenizer import DecodeState, apply_chat_template, detokenize, tokenize_request

torch.set_num_threads(1)
logging.set_verbosity_error()


def byte_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: each of the 256 bytes is written as one printable
    character in a token's string; this maps the character back to its byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    chars = [*printable, *range(256, 256 + len(others))]
    return {chr(c): b for c, b in zip(chars, printable + others)}


BYTES = byte_table()


def token_bytes(tokenizer, token_id: int) -> str:
    """A token's bytes in hex, ASCII shown as itself: 'f' 'c3a9' ('fé')."""
    raw = bytes(BYTES[c] for c in tokenizer.convert_ids_to_tokens(token_id))
    return " ".join(chr(b) if 32 < b < 127 else f"{b:02x}" for b in raw)


def stream(tokenizer, ids: list[int], stop: Sequence[str] = ()) -> list[str]:
    """Detokenize ids one at a time, printing the offsets after each; returns the pieces."""
    state = DecodeState(stop=stop)
    print("  step  id   bytes           piece    surr read sent")
    pieces = []
    for step, token in enumerate(ids):
        last = step == len(ids) - 1
        piece = detokenize(tokenizer, [state], [[token]], [last])[0]
        pieces.append(piece)
        print(
            f"  {step:4d} {token:4d}  {token_bytes(tokenizer, token):15s} {piece!r:8s} "
            f"{state.surr_offset:4d} {state.read_offset:4d} {state.sent_offset:4d}"
            + (f"  finish_reason={state.finish_reason!r}" if state.finish_reason else "")
        )
    return pieces


with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("qwen2bytes", f"{tmp}/qwen2bytes"))
    tok = AutoTokenizer.from_pretrained(path)

    messages = [{"role": "user", "content": "Say hello in French."}]
    print("the chat template applied to", messages, "(the tokenizer's own template):")
    print("  " + repr(apply_chat_template(tok, messages)))
    ids = tokenize_request(tok, messages=messages)
    reference = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    print(
        f"  {len(ids)} token ids, equal to apply_chat_template(..., tokenize=True):",
        ids == reference,
    )

    reply = "Café 很好 😀!"
    reply_ids = tok.encode(reply)
    print(
        f"\n{reply!r} is {len(reply.encode())} bytes, {len(reply_ids)} tokens; streamed one "
        "token at a time:"
    )
    pieces = stream(tok, reply_ids)
    print(f"  pieces {pieces}")
    print("  joined equal decode(ids):", "".join(pieces) == tok.decode(reply_ids))

    print("\nthe same tokens with stop=['很好'] (the stop string spans four tokens):")
    pieces = stream(tok, reply_ids, stop=["很好"])
    print(f"  joined {''.join(pieces)!r}: cut before the stop string")

    llm = LLM(path, device="cpu", page_size=4, num_pages=64, max_running_req=2)
    out = llm.generate([ids], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    state = DecodeState()
    streamed = [
        detokenize(tok, [state], [[t]], [i == 15])[0] for i, t in enumerate(out["token_ids"])
    ]
    print("\nthe tiny model's greedy reply to the chat prompt, streamed:", streamed)
    print("  joined equal the offline text:", "".join(streamed) == out["text"])
    llm.shutdown()
