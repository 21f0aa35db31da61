from __future__ import annotations


class StopCutter:
    """A request's text, cut before its first stop string, holding back what may become one."""

    def __init__(self, stops: list[str]):
        self.stops = list(stops)
        self.text = ""
        self.sent_offset = 0
        self.stopped = False

    def push(self, piece: str, finished: bool = False) -> str:
        """The part of the text so far that may be sent now and was not sent yet."""
        if self.stopped:
            return ""
        self.text += piece
        start = self.sent_offset
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:  # nothing before start was held back, so no stop string begins there
            end = min(hits)
            self.stopped = True
        elif finished:
            end = len(self.text)
        else:
            end = max(start, len(self.text) - self._partial_stop_length())
        self.sent_offset = end
        return self.text[start:end]

    def _partial_stop_length(self) -> int:
        """The longest end of the text that begins a stop string (and is not all of it)."""
        return max(
            (k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])),
            default=0,
        )
