"""The tokenizer/detokenizer worker process: prompts from the frontend become token ids for the
scheduler, and the tokens the scheduler sends back become text for the frontend, piece by piece
(detokenize.py's incremental detokenization). Stop strings are found here, on the text; the request
is then aborted in the scheduler so that its pages go back at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.core import Logprobs
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
from minisgl.message.frontend import TextLogprobs
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, parent_sentinel

from .detokenize import DecodeState, detokenize
from .token_bytes import TokenBytes
from .tokenize import tokenize_request

Choice = Tuple[int, int]  # a request's uid, and which of its n choices


@dataclass
class _Request:
    state: DecodeState  # its detokenization so far
    num_prompt_tokens: int
    prompt_text: str | None = None  # for the first reply, where the request echoes its prompt


class TokenizerServer:
    """What the worker does with a batch of messages, without the sockets: ``handle`` returns
    the messages for the scheduler and the replies for the frontend."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.token_bytes = TokenBytes(tokenizer)
        self._requests: Dict[Choice, _Request] = {}  # until the choice's reply finishes

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
            if isinstance(msg, AbortMsg) and self._forget(msg.uid):
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
            DecodeState(stop=msg.stop)  # checks the stop strings
        except (TypeError, ValueError) as e:
            replies.append(UserReply(msg.uid, "", True, finish_reason="error", error=str(e)))
            return
        echo = self._prompt_text(msg, ids) if msg.echo else None
        for i in range(msg.sampling_params.n):
            self._requests[msg.uid, i] = _Request(DecodeState(stop=msg.stop), len(ids), echo)
        to_backend.append(
            UserMsg(msg.uid, torch.tensor(ids, dtype=torch.int32), msg.sampling_params)
        )

    def _prompt_text(self, msg: TokenizeMsg, ids: List[int]) -> str:
        """The prompt as the reply echoes it: as it was given, or its ids decoded."""
        return msg.text if isinstance(msg.text, str) else self.tokenizer.decode(ids)

    def _forget(self, uid: int) -> bool:
        """Drop every choice of the request; whether it had any still running."""
        choices = [c for c in self._requests if c[0] == uid]
        for choice in choices:
            del self._requests[choice]
        return bool(choices)

    def _detokenize(
        self, msgs: List[DetokenizeMsg], to_backend: List[BaseBackendMsg], replies: List[UserReply]
    ) -> None:
        """The scheduler's tokens, one reply per request. A worker that fell behind may hold
        several steps of a request: they are detokenized step by step (each step one batched
        call over the requests), so that a stop string ends the reply at the token that
        completes it, whatever the timing. The reply's ``token_ids`` stop there too: the
        tokens up to and including the one whose text completed the stop string are the ones
        ``usage.completion_tokens`` counts; those the scheduler made past it are dropped."""
        queues: Dict[Choice, List[DetokenizeMsg]] = {}
        for msg in msgs:
            if msg.error and self._forget(msg.uid):  # refused: every choice at once
                replies.append(UserReply(msg.uid, "", True, msg.finish_reason, error=msg.error))
            elif (msg.uid, msg.index) in self._requests:  # else aborted or stopped: dropped
                queues.setdefault((msg.uid, msg.index), []).append(msg)
        out = {choice: self._reply(choice) for choice in queues}
        while queues:
            step = {choice: queue.pop(0) for choice, queue in queues.items()}
            states = [self._requests[choice].state for choice in step]
            # an EOS that ended the request stays in its token ids but not in its text
            ids = [[] if m.finish_reason == "stop" else [m.next_token] for m in step.values()]
            pieces = detokenize(self.tokenizer, states, ids, [m.finished for m in step.values()])
            for (choice, msg), piece, state in zip(step.items(), pieces, states):
                reply = out[choice]
                reply.incremental_output += piece
                reply.token_ids.append(msg.next_token)
                self._add_logprobs(reply, msg)
                at_stop = state.finish_reason == "stop"  # the text reached a stop string
                if msg.finished or at_stop:
                    reply.finished = True
                    reply.finish_reason = "stop" if at_stop else msg.finish_reason
                    if not msg.finished:  # its pages back now, not at max_tokens
                        to_backend.append(AbortBackendMsg(*choice))
                    del self._requests[choice]
                    queues[choice].clear()  # any later tokens are past the end
            queues = {choice: queue for choice, queue in queues.items() if queue}
        replies.extend(out.values())

    def _reply(self, choice: Choice) -> UserReply:
        """The choice's next reply, empty; its first carries the echoed prompt, once."""
        request = self._requests[choice]
        reply = UserReply(choice[0], "", False, num_prompt_tokens=request.num_prompt_tokens)
        reply.index, reply.prompt_text, request.prompt_text = choice[1], request.prompt_text, None
        return reply

    def _add_logprobs(self, reply: UserReply, msg: DetokenizeMsg) -> None:
        """The token's log-probabilities (and with a first token the prompt's), with the bytes
        of every token they name."""
        if msg.prompt_logprobs is not None:
            reply.prompt_logprobs = self._with_bytes(msg.prompt_logprobs)
        if msg.logprobs is not None:
            if reply.logprobs is None:
                reply.logprobs = TextLogprobs()
            reply.logprobs.extend(self._with_bytes(msg.logprobs))

    def _with_bytes(self, lp: Logprobs) -> TextLogprobs:
        return TextLogprobs(
            lp.token_ids,
            lp.logprobs,
            lp.top_ids,
            lp.top_logprobs,
            self.token_bytes(lp.token_ids),
            [self.token_bytes(ids) for ids in lp.top_ids],
        )


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
