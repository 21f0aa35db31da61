"""Triton kernels: storing K and V into the paged cache, and paged attention for decode and
extend. On a CPU they run in Triton's interpreter (TRITON_INTERPRET=1, set before importing
triton)."""

from .attention import decode_attention, extend_attention
from .store import store_kv

__all__ = ["store_kv", "decode_attention", "extend_attention"]
