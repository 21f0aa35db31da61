"""Incremental detokenization: a request's text streamed piece by piece as its token ids arrive,
in SGLang's offsets scheme, with stop strings matched on the text and cut from it.

A piece is sent only when it is final: never half a UTF-8 character (a byte-level token may hold
part of one, and a window that decodes to the replacement character U+FFFD at its end waits for
the rest), never the start of what may become a stop string. The pieces of a request joined are
``tokenizer.decode(ids, clean_up_tokenization_spaces=False)`` of all its ids, cut before the
first stop string: windows are decoded without the clean-up, which would drop the space before
``.`` or ``'s`` at a window's start and not in its context, and lose the punctuation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

from transformers import PreTrainedTokenizerBase

from minisgl.tokenizer.tokenize import check_token_ids

REPLACEMENT = "\ufffd"  # what decoding puts for bytes that are not (yet) a whole character


@dataclass
class DecodeState:
    """One request's detokenization; the ids are the generated ones, in order.

    ids[:surr_offset]               final, in ``text``, never decoded again
    ids[surr_offset:read_offset]    in ``text`` too, decoded again as the next window's context
    ids[read_offset:]               decoded, not final yet: they may end inside a character
    sent_offset                     characters of the request's text already returned
    """

    stop: Sequence[str] = ()  # a str or a list of str; kept as a tuple
    skip_special_tokens: bool = True
    ids: List[int] = field(default_factory=list)
    text: str = ""  # the decoding of ids[:read_offset]
    surr_offset: int = 0
    read_offset: int = 0
    sent_offset: int = 0
    finished: bool = False  # no more ids will come
    finish_reason: str | None = None  # "stop" once a stop string ended the text

    def __post_init__(self) -> None:
        self.stop = check_stop(self.stop)


def check_stop(stop: str | Sequence[str] | None) -> Tuple[str, ...]:
    """Stop strings as a tuple; a ValueError for an empty one or one that is not a str."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    for i, s in enumerate(stops):
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop[{i}] is {s!r}: a stop string is a non-empty str")
    return stops


def detokenize(
    tokenizer: PreTrainedTokenizerBase,
    states: Sequence[DecodeState],
    new_ids: Sequence[Sequence[int]],
    finished: Sequence[bool] | None = None,
) -> List[str]:
    """Give each request its new ids (often one, maybe none) and return, per request, the text
    it may send now ("" when nothing is final yet). ``finished[i]`` says request i ends with
    these ids: what was held back is sent then. Leave out an EOS that ended a request, as
    ``LLM`` leaves it out of the text. After a stop string the request sends nothing more:
    its ``finish_reason`` is "stop" and its ids are ignored.

    Every request's windows are decoded in two ``batch_decode`` calls per setting of
    ``skip_special_tokens``, as a detokenizer worker serves a batch of requests at once.
    """
    finished = [False] * len(states) if finished is None else list(finished)
    if not len(states) == len(new_ids) == len(finished):
        raise ValueError(
            f"{len(states)} states, {len(new_ids)} lists of new ids and "
            f"{len(finished)} finished flags: one each per request"
        )
    for i, (state, ids) in enumerate(zip(states, new_ids)):
        if state.finished:
            raise ValueError(f"request {i} has finished: it takes no more ids")
        if state.finish_reason is None:
            state.ids.extend(_token_ids(ids, i))
    live = [i for i, s in enumerate(states) if s.finish_reason is None]
    reads = _decode(tokenizer, [states[i] for i in live], surrounding=False)
    surrs = _decode(tokenizer, [states[i] for i in live], surrounding=True)
    pieces = [""] * len(states)
    for i, read_text, surr_text in zip(live, reads, surrs):
        pieces[i] = _advance(states[i], read_text, surr_text, finished[i])
    for state, done in zip(states, finished):
        state.finished = state.finished or done
    return pieces


def _token_ids(ids: Sequence[int], request: int) -> List[int]:
    try:
        return check_token_ids(ids)
    except (TypeError, ValueError) as e:
        raise type(e)(f"request {request}: new {e}") from None


def _decode(
    tokenizer: PreTrainedTokenizerBase, states: Sequence[DecodeState], surrounding: bool
) -> List[str]:
    """Each state's window ids[surr_offset:] (or only its context, ids[surr_offset:read_offset]),
    decoded in one batch per setting of skip_special_tokens."""
    texts = [""] * len(states)
    for skip in (True, False):
        rows = [i for i, s in enumerate(states) if s.skip_special_tokens == skip]
        if not rows:
            continue
        windows = [_window(states[i], surrounding) for i in rows]
        decoded = tokenizer.batch_decode(
            windows, skip_special_tokens=skip, clean_up_tokenization_spaces=False
        )  # see the top
        for i, text in zip(rows, decoded):
            texts[i] = text
    return texts


def _window(state: DecodeState, context_only: bool) -> List[int]:
    end = state.read_offset if context_only else len(state.ids)
    return state.ids[state.surr_offset : end]


def _advance(state: DecodeState, read_text: str, surr_text: str, finished: bool) -> str:
    """Move the offsets past what is final and return the piece that may be sent."""
    new_text = read_text[len(surr_text) :]  # what ids[read_offset:] add to the text
    if finished or (new_text and not new_text.endswith(REPLACEMENT)):
        state.text += new_text  # ends on a whole character: final
        state.surr_offset, state.read_offset = state.read_offset, len(state.ids)
        visible = state.text
    else:  # ends inside a character: the characters before it are final, the offsets stay
        visible = state.text + new_text.rstrip(REPLACEMENT)
    return _send(state, visible, finished)


def _send(state: DecodeState, visible: str, finished: bool) -> str:
    """visible[sent_offset:], cut before a stop string, holding back a tail that may still
    become one (unless the request has finished)."""
    start = state.sent_offset
    hit = find_stop(visible, state.stop, start)
    if hit is not None:
        end = hit
        state.finish_reason = "stop"
    elif finished:
        end = len(visible)
    else:
        end = max(start, len(visible) - partial_stop_length(visible, state.stop))
    state.sent_offset = end
    return visible[start:end]


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the first stop string in text[start:] begins, or None. Nothing before ``start`` was
    held back, so no stop string begins there."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits, default=None)


def partial_stop_length(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of ``text`` that is the start of a stop string (and not the
    whole of it): those characters wait, since the next ones may complete the stop."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
