"""Hugging Face model directories on the local disk (this book never downloads anything)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List


def resolve_model_dir(path: str | Path) -> Path:
    """The model directory ``path``, checked: it exists and holds a config.json."""
    model_dir = Path(path).expanduser()
    if not model_dir.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if not model_dir.is_dir():
        raise NotADirectoryError(f"model path {str(path)!r} is not a directory")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no config.json: not a Hugging Face model directory"
        )
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
    files = sorted(resolve_model_dir(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model directory {str(path)!r} has no *.safetensors files")
    return files
