from __future__ import annotations

from typing import Callable, Iterator

HELP = "/reset forgets the conversation, /exit (or Ctrl-D) leaves"


class Shell:
    """The conversation, and what each line of input does with it."""

    def __init__(self, stream: Callable[[list[dict]], Iterator[str]]):
        raise NotImplementedError

    def handle(self, line: str) -> bool:
        """One line of input; False when the shell should stop."""
        raise NotImplementedError
