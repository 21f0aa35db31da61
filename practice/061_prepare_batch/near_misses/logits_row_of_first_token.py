"""Breaks: logits_rows holds the index of each request's last token."""

from __future__ import annotations

from itertools import accumulate


def prepare_batch(reqs: list[dict], page_table: list[list[int]]) -> dict:
    """The flat input_ids, positions, table_rows, out_loc and logits_rows of a batch."""
    ids = [
        t
        for r in reqs
        for t in (r["input_ids"] + r["output_ids"])[r["cached_len"] : r["device_len"]]
    ]
    positions = [p for r in reqs for p in range(r["cached_len"], r["device_len"])]
    rows = [r["table_idx"] for r in reqs for _ in range(r["device_len"] - r["cached_len"])]
    out_loc = [page_table[row][pos] for row, pos in zip(rows, positions)]
    last = [n for n in accumulate([0] + [r["device_len"] - r["cached_len"] for r in reqs])][:-1]
    return {
        "input_ids": ids,
        "positions": positions,
        "table_rows": rows,
        "out_loc": out_loc,
        "logits_rows": last,
    }
