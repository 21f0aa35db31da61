from __future__ import annotations


class StopCutter:
    """A request's text, cut before its first stop string, holding back what may become one."""

    def __init__(self, stops: list[str]):
        raise NotImplementedError

    def push(self, piece: str, finished: bool = False) -> str:
        """The part of the text so far that may be sent now and was not sent yet."""
        raise NotImplementedError
