"""A checkpoint folder of a named shape, with random weights: what a server or upstream's bench.py
loads where no model hub can be reached.

    PYTHONPATH=python python benchmark/make_checkpoint.py --shape qwen3-0.6b DIR [--device cuda]

It writes DIR/config.json (the shape of ``examples/ch15_measure.py``), DIR/model.safetensors
and a tokenizer. The weights are transformers' own initialisation of the architecture (norms at
1, linear layers N(0, initializer_range^2)), made on ``--device`` in the shape's dtype. The
tokenizer is a word-level one with one token per id, ``t0`` .. ``t{vocab_size - 1}``, so that every
id the model can sample decodes to text and every prompt of ids round-trips; the benchmarks send
token ids, so what the words are does not matter. EOS is the config's ``eos_token_id`` (the last
id where that lies outside the vocabulary, as in the ``tiny`` shape).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from ch15_measure import SHAPES  # noqa: E402


def word_level_tokenizer(vocab_size: int, eos_id: int):
    """A fast tokenizer with token ``t{i}`` for id i, split on whitespace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    eos = f"t{eos_id}"
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=eos, pad_token=eos, unk_token="t0"
    )


def eos_in_vocab(config: dict) -> int:
    eos = config["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    return eos if eos < config["vocab_size"] else config["vocab_size"] - 1


def make_checkpoint(shape: str, directory: Path, device: str) -> Path:
    """Write the checkpoint of ``shape`` into ``directory`` and return it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = SHAPES[shape]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(spec, indent=2))
    config = AutoConfig.from_pretrained(directory)
    dtype = getattr(torch, spec.get("torch_dtype", "bfloat16"))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(directory)  # rewrites config.json as transformers writes it
    word_level_tokenizer(spec["vocab_size"], eos_in_vocab(spec)).save_pretrained(directory)
    return directory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--device", default="cpu", help="where the weights are initialised")
    p.add_argument("directory", type=Path)
    args = p.parse_args()
    path = make_checkpoint(args.shape, args.directory, args.device)
    print(f"wrote {args.shape} to {path}")


if __name__ == "__main__":
    main()
