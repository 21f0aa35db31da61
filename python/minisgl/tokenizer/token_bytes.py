"""The bytes of a token, which the API shows beside each log-probability: OpenAI's ``bytes``
field, and the ``token`` text made from it.

Most tokens decode alone to their own text. A byte-level BPE token may hold part of a UTF-8
character, though (the first two of an emoji's four bytes), and decoded alone it gives the
replacement character U+FFFD; its bytes then come from the tokenizer's byte alphabet, in which
each of the 256 bytes is written as one character. A SentencePiece byte token, ``<0xE2>``,
names its byte.
"""

from __future__ import annotations

import functools
import re
from typing import Dict, List

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def byte_alphabet() -> Dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: the printable Latin-1 bytes stand for
    themselves, and the others (controls, space, ...) for the characters from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    others = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable}
    chars.update({chr(256 + i): b for i, b in enumerate(others)})
    return chars


class TokenBytes:
    """``TokenBytes(tokenizer)(ids)``: each id's bytes, worked out once per id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self._known: Dict[int, bytes] = {}

    def __call__(self, ids: List[int]) -> List[bytes]:
        missing = sorted({t for t in ids if t not in self._known})
        if missing:  # one batched decode for the ids not seen yet
            texts = self.tokenizer.batch_decode(
                [[t] for t in missing],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            pieces = self.tokenizer.convert_ids_to_tokens(missing)
            for token, text, piece in zip(missing, texts, pieces):
                self._known[token] = bytes_of(text, piece or "")
        return [self._known[t] for t in ids]


def bytes_of(text: str, piece: str) -> bytes:
    """A token's bytes from its text decoded alone and its piece (the vocabulary's entry)."""
    if REPLACEMENT not in text:
        return text.encode()
    alphabet = byte_alphabet()
    if piece and all(c in alphabet for c in piece):
        return bytes(alphabet[c] for c in piece)
    if m := _BYTE_TOKEN.fullmatch(piece):
        return bytes([int(m.group(1), 16)])
    return text.encode()  # a replacement character that is the token's own
