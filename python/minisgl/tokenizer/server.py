"""The tokenizer/detokenizer worker process: prompts from the frontend become token ids for the
scheduler, and the tokens the scheduler sends back become text for the frontend, piece by piece
(chapter 11's incremental detokenization). Stop strings are found here, on the text; the request
is then aborted in the scheduler so that its pages go back at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
    UserReply,
)
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, parent_sentinel

from .detokenize import DecodeState, detokenize
from .tokenize import tokenize_request


@dataclass
class _Request:
    state: DecodeState  # its detokenization so far
    num_prompt_tokens: int


class TokenizerServer:
    """What the worker does with a batch of messages, without the sockets: ``handle`` returns
    the messages for the scheduler and the replies for the frontend."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self._requests: Dict[int, _Request] = {}  # uid -> request, until its reply finishes

    def handle(self, msgs: Sequence[BaseTokenizerMsg | ExitMsg]
               ) -> Tuple[List[BaseBackendMsg], List[UserReply]]:
        """New requests first, then the scheduler's tokens, then aborts; an exit message is
        passed on to the scheduler, last."""
        to_backend: List[BaseBackendMsg] = []
        replies: List[UserReply] = []
        for msg in msgs:
            if isinstance(msg, TokenizeMsg):
                self._tokenize(msg, to_backend, replies)
        self._detokenize([m for m in msgs if isinstance(m, DetokenizeMsg)], to_backend, replies)
        for msg in msgs:
            if isinstance(msg, AbortMsg) and self._requests.pop(msg.uid, None) is not None:
                to_backend.append(AbortBackendMsg(msg.uid))
        to_backend += [msg for msg in msgs if isinstance(msg, ExitMsg)]
        return to_backend, replies

    def _tokenize(self, msg: TokenizeMsg, to_backend: List[BaseBackendMsg],
                  replies: List[UserReply]) -> None:
        is_chat = isinstance(msg.text, list) and any(isinstance(m, dict) for m in msg.text)
        try:
            ids = (tokenize_request(self.tokenizer, messages=msg.text) if is_chat
                   else tokenize_request(self.tokenizer, prompt=msg.text))
            state = DecodeState(stop=msg.stop)
        except (TypeError, ValueError) as e:
            replies.append(UserReply(msg.uid, "", True, finish_reason="error", error=str(e)))
            return
        self._requests[msg.uid] = _Request(state, len(ids))
        to_backend.append(UserMsg(msg.uid, torch.tensor(ids, dtype=torch.int32),
                                  msg.sampling_params))

    def _detokenize(self, msgs: List[DetokenizeMsg], to_backend: List[BaseBackendMsg],
                    replies: List[UserReply]) -> None:
        """Every request's new tokens of this batch (one per scheduler step) in one call."""
        tokens: Dict[int, List[int]] = {}
        last: Dict[int, DetokenizeMsg] = {}
        for msg in msgs:
            if msg.uid not in self._requests:
                continue  # aborted (or stopped by a stop string): its late tokens are dropped
            if msg.error:
                replies.append(UserReply(msg.uid, "", True, msg.finish_reason, error=msg.error))
                del self._requests[msg.uid]
                continue
            tokens.setdefault(msg.uid, []).append(msg.next_token)
            last[msg.uid] = msg
        uids = list(tokens)
        # an EOS that ended the request stays in its token ids but not in its text
        texts = [tokens[u][:-1] if last[u].finish_reason == "stop" else tokens[u] for u in uids]
        states = [self._requests[u].state for u in uids]
        pieces = detokenize(self.tokenizer, states, texts, [last[u].finished for u in uids])
        for uid, piece, state in zip(uids, pieces, states):
            at_stop = state.finish_reason == "stop"  # the text reached a stop string
            finished = last[uid].finished or at_stop
            replies.append(UserReply(uid, piece, finished,
                                     "stop" if at_stop else last[uid].finish_reason,
                                     tokens[uid], self._requests[uid].num_prompt_tokens))
            if at_stop and not last[uid].finished:
                to_backend.append(AbortBackendMsg(uid))  # its pages back now, not at max_tokens
            if finished:
                del self._requests[uid]


def tokenizer_worker(model_path: str, inbox_addr: str, backend_addr: str, frontend_addr: str,
                     ready: Callable[[], None] = lambda: None) -> None:
    """The worker process: binds its inbox (the frontend and the scheduler both connect to it),
    says ready, and serves until an exit message, which it passes on to the scheduler."""
    server = TokenizerServer(AutoTokenizer.from_pretrained(model_path))
    inbox = ZmqPullQueue(inbox_addr, create=True, decoder=BaseTokenizerMsg.decoder)
    to_backend = ZmqPushQueue(backend_addr, create=False, encoder=BaseBackendMsg.encoder)
    to_frontend = ZmqPushQueue(frontend_addr, create=False, encoder=BaseFrontendMsg.encoder)
    ready()
    try:
        while True:
            first = inbox.get(watch=parent_sentinel())  # sleeps until a message comes
            msgs = [ExitMsg() if first is None else first]  # the parent gone: exit
            while (msg := inbox.get_nowait()) is not None:
                msgs.append(msg)
            msgs = [m for msg in msgs for m in (msg.data if isinstance(msg, BatchTokenizerMsg)
                                                else [msg])]
            backend_msgs, replies = server.handle(msgs)
            _put_batched(to_backend, backend_msgs, BatchBackendMsg)
            _put_batched(to_frontend, replies, BatchFrontendMsg)
            if any(isinstance(m, ExitMsg) for m in msgs):
                return
    finally:
        for queue in (inbox, to_backend, to_frontend):
            queue.close()


def _put_batched(queue: ZmqPushQueue, msgs: List, batch: Callable) -> None:
    """One message as it is, several in one batch message: one send either way."""
    if len(msgs) == 1:
        queue.put(msgs[0])
    elif msgs:
        queue.put(batch(data=msgs))
