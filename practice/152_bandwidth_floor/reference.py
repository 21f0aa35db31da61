from __future__ import annotations


def decode_context_tokens(input_lens: list[int], output_lens: list[int]) -> int:
    """Cached tokens all decode steps read: step k = 1 .. o - 1 of a request reads i + k."""
    return sum((o - 1) * i + (o - 1) * o // 2 for i, o in zip(input_lens, output_lens))


def decode_floor(
    weight_bytes: int,
    kv_bytes_per_token: int,
    input_lens: list[int],
    output_lens: list[int],
    bytes_per_s: float,
) -> tuple[float, float]:
    """(the bandwidth floor of the workload's mean decode step in s, the output tokens/s it
    allows)."""
    steps = max(output_lens) - 1
    if steps == 0:
        return 0.0, 0.0
    context = decode_context_tokens(input_lens, output_lens) / steps
    floor_s = (weight_bytes + kv_bytes_per_token * context) / bytes_per_s
    tokens_per_step = (sum(output_lens) - len(output_lens)) / steps
    return floor_s, tokens_per_step / floor_s
