"""Hugging Face model directories on the local disk (this book never downloads anything).

An error about a model directory is one line that names the path and the command that fixes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Collection, Dict, List

MAKE_MODEL = "python examples/real_model.py"  # + a directory: writes SmolLM2-135M-Instruct there
PICKLES = "pytorch_model*.bin"  # transformers' files in torch.save's format, not read here


def resolve_model_dir(path: str | Path) -> Path:
    """The model directory ``path``, checked: it exists and holds a config.json."""
    model_dir = Path(path).expanduser()
    make = f"to make a model there: {MAKE_MODEL} {model_dir}"
    if not model_dir.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist; {make}")
    if not model_dir.is_dir():
        raise NotADirectoryError(
            f"model path {str(path)!r} is not a directory; to make one: {MAKE_MODEL} DIR"
        )
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no config.json: not a Hugging Face model "
            f"directory; {make}"
        )
    return model_dir


def check_model_dir(path: str | Path, architectures: Collection[str], weights: bool = True) -> Path:
    """Everything loading ``path`` needs, checked before anything is loaded: the directory and
    its config.json, an architecture among ``architectures`` (those the engine serves), and, with
    ``weights``, safetensors files."""
    model_dir = resolve_model_dir(path)
    architecture = (read_hf_config(model_dir).get("architectures") or [None])[0]
    if architecture not in architectures:
        raise ValueError(
            f"model directory {str(path)!r}: unknown model architecture {architecture!r}; "
            f"known: {', '.join(sorted(architectures))}; to make a model of one: {MAKE_MODEL} DIR"
        )
    if weights:
        safetensors_files(model_dir)
    return model_dir


def read_hf_config(path: str | Path) -> Dict[str, Any]:
    """The dict of the directory's config.json."""
    return json.loads((resolve_model_dir(path) / "config.json").read_text())


def read_generation_config(path: str | Path) -> Dict[str, Any]:
    """The dict of the directory's generation_config.json; empty if it has none."""
    file = resolve_model_dir(path) / "generation_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def safetensors_files(path: str | Path) -> List[Path]:
    """The checkpoint's shards (``model-00001-of-00004.safetensors`` ...), in order."""
    model_dir = resolve_model_dir(path)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no *.safetensors files: {_instead(model_dir)}"
        )
    return files


def _instead(model_dir: Path) -> str:
    """What a directory without safetensors holds instead, and the command that fixes it."""
    pickles = sorted(model_dir.glob(PICKLES))
    if not pickles:
        return f"no weights; to make a model there: {MAKE_MODEL} {model_dir}"
    convert = (
        "from transformers import AutoModelForCausalLM as M; "
        f"M.from_pretrained({str(model_dir)!r}).save_pretrained({str(model_dir)!r})"
    )
    return (
        f"{pickles[0].name} is in torch.save's format, which minisgl does not read; to convert "
        f'it to safetensors: python -c "{convert}"'
    )
