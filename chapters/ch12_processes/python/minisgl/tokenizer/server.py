"""The tokenizer/detokenizer worker process: prompts from the frontend become token ids for the
scheduler, and the tokens the scheduler sends back become text for the frontend, piece by piece
(detokenize.py's incremental detokenization). Stop strings are found here, on the text; the request
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

    def handle(
        self, msgs: Sequence[BaseTokenizerMsg | ExitMsg]
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

    def _tokenize(
        self, msg: TokenizeMsg, to_backend: List[BaseBackendMsg], replies: List[UserReply]
    ) -> None:
        is_chat = isinstance(msg.text, list) and any(isinstance(m, dict) for m in msg.text)
        try:
            ids = (
                tokenize_request(self.tokenizer, messages=msg.text)
                if is_chat
                else tokenize_request(self.tokenizer, prompt=msg.text)
            )
            state = DecodeState(stop=msg.stop)
        except (TypeError, ValueError) as e:
            replies.append(UserReply(msg.uid, "", True, finish_reason="error", error=str(e)))
            return
        self._requests[msg.uid] = _Request(state, len(ids))
        to_backend.append(
            UserMsg(msg.uid, torch.tensor(ids, dtype=torch.int32), msg.sampling_params)
        )

    def _detokenize(
        self, msgs: List[DetokenizeMsg], to_backend: List[BaseBackendMsg], replies: List[UserReply]
    ) -> None:
        """The scheduler's tokens, one reply per request. A worker that fell behind may hold
        several steps of a request: they are detokenized step by step (each step one batched
        call over the requests), so that a stop string ends the reply at the token that
        completes it, whatever the timing. The reply's ``token_ids`` stop there too: the
        tokens up to and including the one whose text completed the stop string are the ones
        ``usage.completion_tokens`` counts; those the scheduler made past it are dropped."""
        queues: Dict[int, List[DetokenizeMsg]] = {}
        for msg in msgs:
            if msg.uid not in self._requests:
                continue  # aborted (or stopped by a stop string): its late tokens are dropped
            if msg.error:
                replies.append(UserReply(msg.uid, "", True, msg.finish_reason, error=msg.error))
                del self._requests[msg.uid]
            else:
                queues.setdefault(msg.uid, []).append(msg)
        out = {
            uid: UserReply(uid, "", False, num_prompt_tokens=self._requests[uid].num_prompt_tokens)
            for uid in queues
        }
        while queues:
            step = {uid: queue.pop(0) for uid, queue in queues.items()}
            states = [self._requests[uid].state for uid in step]
            # an EOS that ended the request stays in its token ids but not in its text
            ids = [[] if m.finish_reason == "stop" else [m.next_token] for m in step.values()]
            pieces = detokenize(self.tokenizer, states, ids, [m.finished for m in step.values()])
            for (uid, msg), piece, state in zip(step.items(), pieces, states):
                reply = out[uid]
                reply.incremental_output += piece
                reply.token_ids.append(msg.next_token)
                at_stop = state.finish_reason == "stop"  # the text reached a stop string
                if msg.finished or at_stop:
                    reply.finished = True
                    reply.finish_reason = "stop" if at_stop else msg.finish_reason
                    if not msg.finished:  # its pages back now, not at max_tokens
                        to_backend.append(AbortBackendMsg(uid))
                    del self._requests[uid]
                    queues[uid].clear()  # any later tokens are past the end
            queues = {uid: queue for uid, queue in queues.items() if queue}
        replies.extend(out.values())


def tokenizer_worker(
    model_path: str,
    inbox_addr: str,
    backend_addr: str,
    frontend_addr: str,
    ready: Callable[[], None] = lambda: None,
) -> None:
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
            msgs = [
                m
                for msg in msgs
                for m in (msg.data if isinstance(msg, BatchTokenizerMsg) else [msg])
            ]
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
