"""Breaks: The logit is divided by r when it is positive, and multiplied by r when not."""

from __future__ import annotations


def apply_penalties(
    logits: list[float],
    counts: list[int],
    in_prompt: list[bool],
    presence_penalty: float,
    frequency_penalty: float,
    repetition_penalty: float,
    logit_bias: dict[int, float],
) -> list[float]:
    """A new row: the bias added, then the repetition penalty on the tokens the prompt or the
    output holds, then the frequency and presence penalties on the output's tokens."""
    # the bias first: the penalties work on the logits the client asked for
    row = [x + logit_bias.get(t, 0.0) for t, x in enumerate(logits)]
    for t, count in enumerate(counts):
        if in_prompt[t] or count > 0:
            row[t] = repeated(row[t], repetition_penalty)
        # after the repetition penalty, so that it does not scale these two
        row[t] -= frequency_penalty * count
        row[t] -= presence_penalty * (count > 0)
    return row


def repeated(logit: float, r: float) -> float:
    """A seen token's logit: divided by r when positive, multiplied when not, so that r > 1
    always lowers it."""
    return logit * r if logit > 0 else logit / r
