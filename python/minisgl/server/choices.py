"""A request's choices as their pieces come: each choice's text, its token count, why it
finished, and its log-probabilities, in OpenAI's shapes (``logprobs.py``).

A piece is what one ``UserReply`` adds to its choice: the text, and the stretches of tokens whose
log-probabilities it carries, each with the character of the choice's text it begins at (the
legacy shape's ``text_offset``). With ``echo`` a choice's first piece starts with the prompt's
text and the prompt's log-probabilities; with ``drop_output`` (``max_tokens: 0``, the request
scores its prompt and the one token drawn for it is not shown) only those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Dict, List, Tuple

from minisgl.message import UserReply
from minisgl.message.frontend import TextLogprobs

from .logprobs import chat_logprobs, completion_logprobs, joined

Stretch = Tuple[TextLogprobs, int]  # tokens, and where their text begins in the choice's


@dataclass
class Piece:
    text: str = ""
    stretches: List[Stretch] = field(default_factory=list)


@dataclass
class Choice:
    """One choice of a request, as its replies arrive."""

    index: int
    echo: bool = False
    drop_output: bool = False
    text: str = ""
    num_tokens: int = 0  # the tokens its replies carried (usage)
    finish_reason: str | None = None
    stretches: List[Stretch] = field(default_factory=list)
    started: bool = False

    def add(self, reply: UserReply) -> Piece:
        """Take the choice's next reply; what it adds."""
        piece = Piece()
        if not self.started:
            self.started = True
            if self.echo:
                self._extend(piece, reply.prompt_text or "", reply.prompt_logprobs)
        if not self.drop_output:
            self.num_tokens += len(reply.token_ids)
            self._extend(piece, reply.incremental_output, reply.logprobs)
        if reply.finished:  # the token drawn for a prompt to be scored was never shown
            self.finish_reason = "length" if self.drop_output else reply.finish_reason
        return piece

    def _extend(self, piece: Piece, text: str, logprobs: TextLogprobs | None) -> None:
        if logprobs is not None and len(logprobs):
            stretch = (logprobs, len(self.text))
            piece.stretches.append(stretch)
            self.stretches.append(stretch)
        piece.text += text
        self.text += text


def rendered_logprobs(stretches: List[Stretch], chat: bool) -> Dict[str, Any] | None:
    """The stretches' log-probabilities in the endpoint's shape; None when there are none."""
    if not stretches:
        return None
    if chat:
        return {"content": [c for lp, _ in stretches for c in chat_logprobs(lp)["content"]]}
    return reduce(joined, (completion_logprobs(lp, start) for lp, start in stretches))
