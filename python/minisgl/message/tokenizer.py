"""What the tokenizer/detokenizer worker receives: prompts from the frontend, and each step's
new tokens from the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from minisgl.core import Logprobs, SamplingParams

from .backend import ExitMsg
from .utils import classes_by_name, from_dict, to_dict


@dataclass
class BaseTokenizerMsg:
    @staticmethod
    def encoder(msg: BaseTokenizerMsg | ExitMsg) -> Dict[str, Any]:
        return to_dict(msg)

    @staticmethod
    def decoder(data: Dict[str, Any]) -> BaseTokenizerMsg | ExitMsg:
        return from_dict(data, _CLASSES)


@dataclass
class BatchTokenizerMsg(BaseTokenizerMsg):
    data: List[BaseTokenizerMsg]  # several messages in one send


@dataclass
class TokenizeMsg(BaseTokenizerMsg):
    """A new request from the frontend."""

    uid: int
    text: str | List[int] | List[Dict[str, str]]  # a prompt, its token ids, or chat messages
    sampling_params: SamplingParams
    stop: List[str] = field(default_factory=list)  # strings that end the reply, cut from it
    echo: bool = False  # the reply starts with the prompt's text (completions' echo)


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    """One request's new token from one scheduler step (or its refusal)."""

    uid: int
    next_token: int  # -1 when there is none: the request was refused
    finished: bool
    finish_reason: str = ""  # once finished: "length", "stop" (an EOS) or "error"
    error: str = ""  # why the scheduler refused the request
    index: int = 0  # which of the request's n choices
    logprobs: Logprobs | None = None  # the token's entry, where the request asks
    prompt_logprobs: Logprobs | None = None  # with a choice's first token, where it asks


@dataclass
class AbortMsg(BaseTokenizerMsg):
    """The frontend gives up on a request (its client disconnected)."""

    uid: int


_CLASSES = classes_by_name(
    BatchTokenizerMsg, TokenizeMsg, DetokenizeMsg, AbortMsg, ExitMsg, SamplingParams, Logprobs
)
