"""A reply cut inside a character, streamed through upstream mini-sglang's detokenizer and ours
(chapter 11).

    PYTHONPATH=python python benchmark/upstream_detokenize.py --upstream CLONE/python

CLONE is a clone of upstream at the commit the book pins:

    git clone https://github.com/sgl-project/mini-sglang && git -C mini-sglang checkout 20fcd7f

``--upstream`` takes the clone, as ``bench_moe_upstream.py`` does, or its ``python/`` or
``python/minisgl``. Nothing of upstream is
copied into this repository: the script loads one file from there at run time,
``minisgl/tokenizer/detokenize.py``, as a module file of its own (upstream's package is also
named ``minisgl``, and importing it whole would need its GPU packages). That file imports one
name, ``DetokenizeMsg`` from ``minisgl.message``, which it uses only to read a message's
``uid``, ``next_token`` and ``finished``; a dataclass with those three fields (upstream's, in
``minisgl/message/tokenizer.py``) stands in for it while the file loads. The rest is
upstream's code as it is: ``DetokenizeManager.detokenize`` and ``find_printable_text``.

The tokenizer is the tiny byte-level one of ``examples/tiny_models.py``, where 很 is three
tokens (its bytes e5 be 88). The reply is ``'Hi 很'`` without its last token, as a reply cut
by ``max_tokens`` inside a character ends. Both detokenizers get one id per call, the last one
marked finished; the script prints each one's pieces, their join, and ``tokenizer.decode`` of
the ids, and the git blob id of the upstream file it loaded (compare it with ``git -C
mini-sglang rev-parse 20fcd7f:python/minisgl/tokenizer/detokenize.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib.util
import platform
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, List

import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from tiny_models import make_tiny_model  # noqa: E402

from minisgl.tokenizer import DecodeState, detokenize  # noqa: E402

TEXT = "Hi 很"


@dataclasses.dataclass
class DetokenizeMsg:
    """The fields of upstream's ``DetokenizeMsg`` that its detokenizer reads."""

    uid: int
    next_token: int
    finished: bool


def upstream_file(directory: Path) -> Path:
    for candidate in (
        directory / "python" / "minisgl" / "tokenizer" / "detokenize.py",
        directory / "minisgl" / "tokenizer" / "detokenize.py",
        directory / "tokenizer" / "detokenize.py",
    ):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"no minisgl/tokenizer/detokenize.py under {directory}")


def load_upstream(path: Path) -> types.ModuleType:
    """Upstream's detokenize.py as the module ``upstream_detokenize``, with ``minisgl.message``
    stood in for while it loads (ours is put back after)."""
    stub = types.ModuleType("minisgl.message")
    stub.DetokenizeMsg = DetokenizeMsg  # type: ignore[attr-defined]
    saved = sys.modules.get("minisgl.message")
    sys.modules["minisgl.message"] = stub
    try:
        spec = importlib.util.spec_from_file_location("upstream_detokenize", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["minisgl.message"]
        else:
            sys.modules["minisgl.message"] = saved
    return module


def git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def stream_upstream(module: types.ModuleType, tokenizer: Any, ids: List[int]) -> List[str]:
    manager = module.DetokenizeManager(tokenizer)
    return [
        manager.detokenize([DetokenizeMsg(uid=0, next_token=t, finished=i == len(ids) - 1)])[0]
        for i, t in enumerate(ids)
    ]


def stream_ours(tokenizer: Any, ids: List[int]) -> List[str]:
    state = DecodeState()
    return [
        detokenize(tokenizer, [state], [[t]], [i == len(ids) - 1])[0] for i, t in enumerate(ids)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream", type=Path, required=True, help="a clone of upstream, or its python/"
    )
    args = parser.parse_args()
    path = upstream_file(args.upstream)
    module = load_upstream(path)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(make_tiny_model("qwen2bytes", Path(tmp) / "qwen2bytes"))
        )
    full = tokenizer.encode(TEXT)
    ids = full[:-1]
    print(
        f"date {datetime.date.today()}, python {platform.python_version()}, "
        f"transformers {transformers.__version__}"
    )
    print(f"upstream file: minisgl/tokenizer/detokenize.py, git blob {git_blob_id(path)}")
    print(f"text {TEXT!r}: ids {full}, pieces {[tokenizer.decode([t]) for t in full]}")
    print(f"streamed: ids {ids} (the last token left out), one id per call, the last finished")
    print(f"  tokenizer.decode(ids): {tokenizer.decode(ids)!r}")
    for name, pieces in (
        ("upstream", stream_upstream(module, tokenizer, ids)),
        ("ours", stream_ours(tokenizer, ids)),
    ):
        print(f"  {name:<9} pieces {pieces}, joined {''.join(pieces)!r}")


if __name__ == "__main__":
    main()
