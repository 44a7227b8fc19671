"""LoRA with the output head in modules_to_save on a model whose head is tied to the embedding (Llama-3.2-1B):
transformers builds an lm_head module there too, and peft wraps it, training a copy of the tied weight. Issue 33:
memfit refused it (lora-no-match); now `memfit check` gives peft's own parameter and gradient bytes."""

import json
import subprocess
import sys

from needs import module


def test_a_tied_head_in_modules_to_save_is_peft_s_trainable_copy(tmp_path):
    torch, transformers, peft = module("torch"), module("transformers"), module("peft")
    raw = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True, max_position_embeddings=256, torch_dtype="bfloat16")
    (tmp_path / "tiny.json").write_text(json.dumps(raw))
    model = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**raw), dtype=torch.bfloat16)  # (as from_pretrained loads it)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]))
    names = [n for n, _ in wrapped.named_parameters()]
    assert "base_model.model.lm_head.modules_to_save.default.weight" in names
    trainable = sum(t.numel() * t.element_size() for t in wrapped.parameters() if t.requires_grad)
    every = sum(t.numel() * t.element_size() for t in [*wrapped.parameters(), *wrapped.buffers()])  # buffers: on the device too
    config = tmp_path / "c.yaml"
    config.write_text(
        "memfit: 1\ndevice: {memory: 80 GB}\nprecision: bf16-true\noptimizer: adamw\nmodel: {hf_config: tiny.json}\n"
        "training: {micro_batch: 1, seq_len: 16}\nlora: {r: 4, target_modules: [q_proj, v_proj], modules_to_save: [lm_head]}\n"
    )
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(config)], capture_output=True, text=True, timeout=120)
    entry = json.loads(out.stdout)["files"][0]
    assert not entry["diagnostics"], entry["diagnostics"]
    assert entry["footprint"]["parameters"] == every and entry["footprint"]["gradients"] == trainable
