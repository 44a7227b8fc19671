"""memfit's side of the LitGPT measurements (tests/support/litgpt_port.py's step, LitGPT's own source through
litgpt_source_measure.py): the config a user would write for LitGPT's LoRA step on a Llama, through `memfit check`
(family_check.run_check)."""

from __future__ import annotations

from pathlib import Path

from family_check import run_check

# finetune/lora.py's adapters as the measurements build them: r 8, alpha 16, no dropout, on q and v, in the model's dtype
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "dtype": "model", "target_modules": ["q_proj", "v_proj"]}


def llama(width: int, heads: int, layers: int, vocab: int, intermediate: int, positions: int, kv_heads: int | None = None) -> dict:
    """LitGPT's Llama layout as a transformers config.json: RMSNorm (eps 1e-5), SiLU gated MLP, no biases, an untied
    head; `positions`: its block size."""
    return {"model_type": "llama", "hidden_size": width, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads or heads, "num_hidden_layers": layers, "vocab_size": vocab,
            "intermediate_size": intermediate, "tie_word_embeddings": False, "max_position_embeddings": positions,
            "hidden_act": "silu", "rms_norm_eps": 1e-5}


def lora_step_peak(folder: Path, cfg: dict, micro_batch: int, seq_len: int, sections: dict | None = None, **training) -> dict:
    """The peak ({"bytes", "phase", ...}) `memfit check` gives LitGPT's LoRA step on the CPU: bf16-true, AdamW foreach
    on the adapters (LORA), sdpa, no checkpointing, `model(idx, lm_head_chunk_size=128)` and its chunked loss, LitGPT's
    fused qkv (training.litgpt_qkv), `training`'s keys added; `sections`: further document keys (quantization). The
    config.json and train.yaml are written into `folder`."""
    return run_check(folder, cfg, precision="bf16-true", sections={"lora": dict(LORA), **(sections or {})},
                     micro_batch=micro_batch, seq_len=seq_len, attention="sdpa", checkpointing="none",
                     optimizer_impl="foreach", loss={"kind": "chunked_head", "chunk_size": 128}, litgpt_qkv=True,
                     **training)["peak"]
