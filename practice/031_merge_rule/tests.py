def _check(solution, names, num_experts, want):
    for name in names:
        got = solution.merge_rule(name, num_experts)
        got = None if got is None else (got[0], list(got[1]))
        assert got == want, f"merge_rule({name!r}, {num_experts}): got {got!r}, expected {want!r}"


def test_qkv_weight(solution):
    p = "model.layers.0.self_attn"
    parts = [f"{p}.q_proj.weight", f"{p}.k_proj.weight", f"{p}.v_proj.weight"]
    _check(solution, parts, 0, (f"{p}.qkv_proj.weight", parts))


def test_qkv_bias(solution):
    p = "model.layers.17.self_attn"
    parts = [f"{p}.q_proj.bias", f"{p}.k_proj.bias", f"{p}.v_proj.bias"]
    _check(solution, parts, 4, (f"{p}.qkv_proj.bias", parts))


def test_gate_up(solution):
    p = "model.layers.5.mlp"
    parts = [f"{p}.gate_proj.weight", f"{p}.up_proj.weight"]
    _check(solution, parts, 0, (f"{p}.gate_up_proj.weight", parts))


def test_experts_gate_up_interleaved(solution):
    p = "model.layers.2.mlp.experts"
    parts = []
    for e in range(3):
        parts += [f"{p}.{e}.gate_proj.weight", f"{p}.{e}.up_proj.weight"]
    _check(solution, parts, 3, (f"{p}.gate_up_proj", parts))


def test_experts_down(solution):
    p = "model.layers.9.mlp.experts"
    parts = [f"{p}.{e}.down_proj.weight" for e in range(12)]
    _check(solution, parts[:1] + parts[-1:], 12, (f"{p}.down_proj", parts))


def test_expert_count_from_argument(solution):
    p = "model.layers.0.mlp.experts"
    got = solution.merge_rule(f"{p}.1.down_proj.weight", 2)
    assert got is not None and len(got[1]) == 2, (
        f"with num_experts=2 the down group has 2 parts, got {got!r}"
    )


def test_kept_as_they_are(solution):
    for name in [
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.mlp.gate.weight",
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.o_proj.bias",
        "model.layers.0.mlp.up_proj.bias",
        "model.layers.0.self_attn.q_proj.weight.x",
        "model.layers.0.mlp.experts.x.gate_proj.weight",
        # almost right: another attention, a vision tower's, no prefix, a shared
        # expert's MLP, an expert's bias
        "model.layers.0.cross_attn.q_proj.weight",
        "visual.blocks.0.attn.k_proj.weight",
        "model.layers.0.self_attention.v_proj.weight",
        "self_attn.q_proj.weight",
        "model.layers.0.mlp.shared_expert.gate_proj.weight",
        "model.layers.0.mlp.experts.0.gate_proj.bias",
        "model.layers.0.mlp.experts.1.down_proj.bias",
    ]:
        got = solution.merge_rule(name, 4)
        assert got is None, f"merge_rule({name!r}, 4) should be None (kept as it is), got {got!r}"
