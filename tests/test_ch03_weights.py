"""Chapter 3: checkpoints streamed from safetensors, merged into minisgl's layout, and greedy
generation by recomputation, equal to transformers."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import DENSE, encode, hf_greedy, hf_model, hf_to_minisgl_state
from safetensors import safe_open
from safetensors.torch import save_file

from minisgl.models import ModelConfig, generate_greedy_recompute, load_model
from minisgl.models.weight import load_weights

PROMPTS = [
    "hello world",
    "The quick brown fox",
    "Once upon a time there was a small robot",
    "def add(a, b):",
]


def _checkpoint(path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _config(path) -> ModelConfig:
    return ModelConfig.from_dict(json.loads((path / "config.json").read_text()))


def _copy(tiny_models, name, tmp_path, drop=(), add=None):
    """A copy of a tiny model whose checkpoint lacks the tensors ``drop`` and has ``add``."""
    out = tmp_path / name
    shutil.copytree(tiny_models[name], out)
    tensors = {k: v for k, v in _checkpoint(out).items() if k not in drop}
    save_file({**tensors, **(add or {})}, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("family", DENSE)
def test_loaded_weights_equal_the_checkpoint_slice_by_slice(tiny_models, family):
    path = tiny_models[family]
    config, ckpt = _config(path), _checkpoint(path)
    ours = load_model(path).state_dict()
    q, kv = config.num_qo_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    slices = {
        "q_proj": ("qkv_proj", 0, q),
        "k_proj": ("qkv_proj", q, q + kv),
        "v_proj": ("qkv_proj", q + kv, q + 2 * kv),
        "gate_proj": ("gate_up_proj", 0, inter),
        "up_proj": ("gate_up_proj", inter, 2 * inter),
    }
    used = set()
    for name, tensor in ckpt.items():
        part = name.split(".")[-2]
        if part in slices:
            merged, start, end = slices[part]
            target = name.replace(part, merged)
            assert torch.equal(ours[target][start:end], tensor), name
            used.add(target)
        else:
            assert torch.equal(ours[name], tensor), name
            used.add(name)
    if config.tie_word_embeddings:
        assert "lm_head.weight" not in ckpt
        used.add("lm_head.weight")
    assert used == set(ours)  # nothing in the model that the checkpoint did not fill


@pytest.mark.parametrize("family", DENSE)
def test_loaded_weights_equal_transformers(tiny_models, family):
    path = tiny_models[family]
    ours = load_model(path).state_dict()
    ref = hf_to_minisgl_state(hf_model(path).state_dict())
    assert set(ours) == set(ref)
    assert all(torch.equal(ours[k], ref[k]) for k in ref)


def test_tied_embeddings_fill_the_lm_head(tiny_models):
    path = tiny_models["qwen2"]
    assert "lm_head.weight" not in _checkpoint(path)
    model = load_model(path)
    emb = _checkpoint(path)["model.embed_tokens.weight"]
    assert torch.equal(model.lm_head.weight, emb)  # type: ignore[attr-defined]
    names = dict(load_weights(path, _config(path)))
    assert names["lm_head.weight"] is names["model.embed_tokens.weight"]


def test_moe_experts_are_packed(tiny_models):
    """Qwen3-MoE: experts.{e}.{gate,up,down}_proj -> experts.gate_up_proj [E, 2I, H] (each
    expert's gate rows, then its up rows) and experts.down_proj [E, H, I]; the router stays."""
    path = tiny_models["qwen3moe"]
    config, ckpt = _config(path), _checkpoint(path)
    weights = dict(load_weights(path, config))
    hf = hf_model(path).state_dict()  # transformers 5 packs the experts the same way
    inter = config.moe_intermediate_size
    for layer in range(config.num_layers):
        pre = f"model.layers.{layer}.mlp"
        gate_up, down = weights[f"{pre}.experts.gate_up_proj"], weights[f"{pre}.experts.down_proj"]
        assert gate_up.shape == (8, 2 * inter, 64) and down.shape == (8, 64, inter)
        for e in range(8):
            assert torch.equal(gate_up[e, :inter], ckpt[f"{pre}.experts.{e}.gate_proj.weight"])
            assert torch.equal(gate_up[e, inter:], ckpt[f"{pre}.experts.{e}.up_proj.weight"])
            assert torch.equal(down[e], ckpt[f"{pre}.experts.{e}.down_proj.weight"])
        assert torch.equal(gate_up, hf[f"{pre}.experts.gate_up_proj"])
        assert torch.equal(down, hf[f"{pre}.experts.down_proj"])
        assert torch.equal(weights[f"{pre}.gate.weight"], ckpt[f"{pre}.gate.weight"])
    assert not [k for k in weights if ".experts.0." in k or "q_proj" in k]
    assert set(weights) == set(hf_to_minisgl_state(hf))


def test_a_checkpoint_in_several_shards(tiny_models, tmp_path):
    """Parts of a merged tensor may sit in different files."""
    out = tmp_path / "sharded"
    shutil.copytree(tiny_models["llama3"], out)
    tensors = _checkpoint(out)
    (out / "model.safetensors").unlink()
    first = {k: v for k, v in tensors.items() if "k_proj" in k or "up_proj" in k}
    save_file(first, str(out / "model-00001-of-00002.safetensors"))
    rest = {k: v for k, v in tensors.items() if k not in first}
    save_file(rest, str(out / "model-00002-of-00002.safetensors"))
    a, b = load_model(out).state_dict(), load_model(tiny_models["llama3"]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_load_model_takes_a_dtype(tiny_models):
    old = torch.get_default_dtype()
    model = load_model(tiny_models["mistral"], dtype=torch.bfloat16)
    assert torch.get_default_dtype() == old  # restored
    assert {t.dtype for t in model.state_dict().values()} == {torch.bfloat16}
    default = load_model(tiny_models["mistral"]).state_dict()
    assert default["model.norm.weight"].dtype == torch.float32  # the checkpoint's dtype


@pytest.mark.parametrize("family", DENSE)
def test_greedy_recompute_equals_transformers_generate(tiny_models, family):
    path = tiny_models[family]
    model = load_model(path)
    ours = [generate_greedy_recompute(model, encode(path, p), 24) for p in PROMPTS]
    assert ours == hf_greedy(path, PROMPTS, 24)


# ---- bad input ------------------------------------------------------------------------------


def test_missing_path_or_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'.*nowhere' does not exist"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"'.*empty' has no config\.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        load_model(tmp_path / "file")


def test_generation_config_read_when_there_is_one(tiny_models, tmp_path):
    """The scheduler takes EOS ids from generation_config.json (chapter 7); a directory may have
    none, which is not an error."""
    from minisgl.utils.hf import read_generation_config

    out = tmp_path / "copy"
    shutil.copytree(tiny_models["qwen3"], out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert read_generation_config(out) == {"eos_token_id": [7, 9]}
    (out / "generation_config.json").unlink()
    assert read_generation_config(out) == {}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_generation_config(tmp_path / "nowhere")


def test_no_safetensors(tiny_models, tmp_path):
    out = tmp_path / "bare"
    out.mkdir()
    shutil.copy(tiny_models["llama3"] / "config.json", out)
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        load_model(out)


def test_unknown_architecture(tiny_models, tmp_path):
    out = tmp_path / "unknown"
    shutil.copytree(tiny_models["llama3"], out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'FalconForCausalLM'; known: .*MistralForCausalLM"):
        load_model(out)


@pytest.mark.parametrize(
    "dropped",
    [
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.norm.weight",
    ],
)
def test_missing_tensor_is_named(tiny_models, tmp_path, dropped):
    out = _copy(tiny_models, "llama3", tmp_path, drop=[dropped])
    with pytest.raises(ValueError, match=f"'{dropped}'"):
        load_model(out)


def test_missing_expert_and_unexpected_tensor_are_named(tiny_models, tmp_path):
    dropped = "model.layers.1.mlp.experts.5.up_proj.weight"
    out = _copy(tiny_models, "qwen3moe", tmp_path, drop=[dropped])
    with pytest.raises(ValueError, match=f"no tensor '{dropped}'"):
        dict(load_weights(out, _config(out)))
    extra = "model.layers.0.self_attn.rotary_emb.inv_freq"
    out = _copy(tiny_models, "qwen3", tmp_path, add={extra: torch.zeros(8)})
    with pytest.raises(ValueError, match=f"unexpected weights.*'{extra}'"):
        load_model(out)


def test_an_untied_checkpoint_without_its_lm_head_is_refused(tiny_models, tmp_path):
    """Only a model that ties its embeddings takes them for a missing lm_head: an untied one
    missing its lm_head is an incomplete checkpoint, named as any other missing tensor."""
    assert not _config(tiny_models["llama3"]).tie_word_embeddings
    out = _copy(tiny_models, "llama3", tmp_path, drop=["lm_head.weight"])
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_model(out)
