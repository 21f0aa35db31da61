from __future__ import annotations


def prepare_batch(reqs: list[dict], page_table: list[list[int]]) -> dict:
    """The flat input_ids, positions, table_rows, out_loc and logits_rows of a batch."""
    raise NotImplementedError
