"""Errors as values that carry their location until the command line prints them."""

from __future__ import annotations


class BookError(Exception):
    """Bad input: a malformed book, an unknown chapter, a DEST that exists.

    `where` is a location a person can open (`steps.yaml:12`, a path), or "" when there is none.
    The command line prints `where: message` on one line and exits with status 2.
    """

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.message = message
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message
