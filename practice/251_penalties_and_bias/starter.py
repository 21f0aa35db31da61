"""Exercise 251: one row's logits after its logit bias and its penalties, in the engine's order."""

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
    """A new row: logit_bias added, then the repetition penalty on the tokens the prompt or the
    output holds (a positive logit divided by it, any other multiplied), then the frequency
    penalty times each token's count and the presence penalty once for each token the output
    holds."""
    raise NotImplementedError
