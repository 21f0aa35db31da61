"""Breaks: stream must get a new list."""

from __future__ import annotations

from typing import Callable, Iterator

HELP = "/reset forgets the conversation, /exit (or Ctrl-D) leaves"


class Shell:
    """The conversation, and what each line of input does with it."""

    def __init__(self, stream: Callable[[list[dict]], Iterator[str]]):
        self.stream = stream
        self.history: list[dict] = []
        self.printed = ""

    def handle(self, line: str) -> bool:
        """One line of input; False when the shell should stop."""
        line = line.strip()
        if line == "/exit":
            return False
        if line == "/reset":
            self.history = []
            self.printed += "(the conversation is forgotten)\n"
        elif line.startswith("/"):
            self.printed += f"(unknown command {line}; {HELP})\n"
        elif line:
            self._turn(line)
        return True

    def _turn(self, text: str) -> None:
        messages = self.history + [{"role": "user", "content": text}]
        pieces = []
        try:
            for piece in self.stream(messages):
                pieces.append(piece)
                self.printed += piece
        except KeyboardInterrupt:
            self.printed += "\n(stopped)\n"
            return  # a stopped turn is not part of the conversation
        self.printed += "\n"
        self.history = messages + [{"role": "assistant", "content": "".join(pieces)}]
