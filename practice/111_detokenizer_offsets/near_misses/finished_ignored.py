"""Breaks: finished=True: everything held back is sent."""

from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """One request's text, streamed as its ids arrive; never half a character."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""  # the decoding of ids[:read_offset]
        self.surr_offset = self.read_offset = self.sent_offset = 0

    def feed(self, new_ids: list[int], finished: bool = False) -> str:
        """The text that became final with new_ids ("" if none)."""
        self.ids.extend(new_ids)
        read_text = self.decode(self.ids[self.surr_offset :])
        surr_text = self.decode(self.ids[self.surr_offset : self.read_offset])
        new_text = read_text[len(surr_text) :]  # what ids[read_offset:] add
        if new_text and not new_text.endswith(REPLACEMENT):
            self.text += new_text  # ends on a whole character: final
            self.surr_offset, self.read_offset = self.read_offset, len(self.ids)
            visible = self.text
        else:  # ends inside a character: what comes before it may go
            visible = self.text + new_text.rstrip(REPLACEMENT)
        piece = visible[self.sent_offset :]
        self.sent_offset = len(visible)
        return piece
