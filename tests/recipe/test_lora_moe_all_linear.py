"""`all-linear` on Mixtral and DeepSeek-V3 as peft 0.21 computes it (tuners_utils._maybe_include_all_linear_layers,
then utils/transformers_weight_conversion._convert_peft_config_moe): the nn.Linear modules but the head, with the
experts' names moved to target_parameters (the router, the fused gate_up_proj at rank 2r per expert, down_proj), so a
dense layer's or a shared expert's MLP gets no adapter. Issue 33: memfit refused these configs (bad-lora); now
`memfit check` gives peft's own parameter and gradient bytes, on tiny models built here."""

import json
import subprocess
import sys

import pytest
from needs import module

TINY = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2),
    "deepseek_v3": dict(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, moe_intermediate_size=32,
                        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1,
                        num_key_value_heads=4),  # latent attention: a key and value per head
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_all_linear_on_a_mixture_of_experts_is_what_peft_builds(tmp_path, model_type):
    torch, transformers, peft = module("torch"), module("transformers"), module("peft")
    config = transformers.AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                               vocab_size=100, max_position_embeddings=128, **TINY[model_type])
    raw = {**config.to_dict(), "torch_dtype": "bfloat16"}
    (tmp_path / "tiny.json").write_text(json.dumps(raw))
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    with torch.device("meta"):  # the buffers in the dtypes from_pretrained(dtype=bfloat16) keeps them in (inv_freq fp32)
        loaded = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    trainable = sum(t.numel() * t.element_size() for t in wrapped.parameters() if t.requires_grad)
    every = sum(t.numel() * t.element_size() for t in [*wrapped.parameters(), *loaded.buffers()])  # buffers: on the device too
    path = tmp_path / "c.yaml"
    path.write_text(
        "memfit: 1\ndevice: {memory: 80 GB}\nprecision: bf16-true\noptimizer: adamw\nmodel: {hf_config: tiny.json}\n"
        "training: {micro_batch: 1, seq_len: 16}\nlora: {r: 4, target_modules: all-linear}\n"
    )
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120)
    entry = json.loads(out.stdout)["files"][0]
    assert not [d for d in entry["diagnostics"] if d["severity"] == "error"], entry["diagnostics"]
    assert (entry["footprint"]["parameters"], entry["footprint"]["gradients"]) == (every, trainable)
