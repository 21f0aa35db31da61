from __future__ import annotations


def decode_floor(
    weight_bytes: int,
    kv_bytes_per_token: int,
    input_lens: list[int],
    output_lens: list[int],
    bytes_per_s: float,
) -> tuple[float, float]:
    """(the bandwidth floor of the workload's mean decode step in s, the output tokens/s it
    allows)."""
    raise NotImplementedError
