"""Issue 21, expert parallelism (parallel.expert) through the CLI: Megatron's expert-parallel placement (each rank holds
num_experts / expert routed experts; the distributed optimizer shards their state over the data / expert ranks that
hold the same experts), compared with closed forms from the model's dimensions (tests/support/moe_cli.py)."""

from __future__ import annotations

import needs
import pytest
from moe_cli import QWEN3, TINY, check


def expert_elements(model: dict) -> int:
    """Routed expert parameters of the whole model (gate_up and down of every expert of every layer)."""
    h, ie = model["hidden_size"], model["moe_intermediate_size"]
    return model["num_hidden_layers"] * model["num_experts"] * 3 * h * ie


def total_elements(model: dict) -> int:
    import transformers
    import torch

    config = transformers.AutoConfig.for_model(model["model_type"], **{k: v for k, v in model.items() if k != "model_type"})
    with torch.device("meta"):
        return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())


def buffer_bytes(model: dict, dtype: str) -> int:
    """The registered buffers transformers builds in `dtype` as from_pretrained does (the rotary inv_freq pair): every rank keeps them."""
    import transformers
    import torch

    config = transformers.AutoConfig.for_model(model["model_type"], **{k: v for k, v in model.items() if k != "model_type"})
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return sum(b.numel() * b.element_size() for b in built.buffers())


@pytest.mark.parametrize("expert", [1, 2, 4, 8])
def test_expert_parallel_ranks_hold_their_share_of_the_experts(tmp_path, expert):
    """Megatron's placement on 8 data ranks with ZeRO-1 (its distributed optimizer): a rank holds the non-expert
    parameters and num_experts / expert of the routed experts (bf16 weights, their fp32 gradients as memfit's
    bf16-mixed recipe keeps them); the optimizer state (fp32 master + Adam's two moments, 12 bytes) of the
    non-expert parameters is sharded over the 8 data ranks and of the routed experts over the 8 / expert ranks
    that hold the same experts: per rank 12 · (dense / 8 + experts / expert / (8 / expert)), the same for every
    `expert`. Megatron's theoretical_memory_usage.py leaves expert parallelism out (it divides by tensor and
    pipeline only): with expert = 1 the parameter bytes are its 2 bytes per parameter of the most-loaded shard."""
    needs.module("transformers")  # a skip without it, a failure under CI (tests/support/needs.py)
    total = total_elements(QWEN3)
    routed = expert_elements(QWEN3)
    entry = check(tmp_path, QWEN3, "micro_batch: 1, seq_len: 4096, checkpointing: full",
                  f"parallel: {{data: 8, zero: 1, expert: {expert}}}\n", precision="bf16-mixed")
    assert not [d for d in entry["diagnostics"] if d["code"] not in ("budget-exceeded", "near-budget")], entry["diagnostics"]
    fp = entry["footprint"]
    local = total - routed + routed // expert
    assert fp["parameters"] == 2 * local + buffer_bytes(QWEN3, "bfloat16")
    state = 12 * ((total - routed) / 8 + routed / 8)
    assert abs(fp["optimizer_state"] - state) <= 12 * 2 * 8 * 64   # ZeRO's flat-buffer alignment padding


@pytest.mark.parametrize(("parallel", "message"), [
    ("parallel: {data: 4, expert: 3}\n", "does not divide data = 4"),
    ("parallel: {data: 8, expert: 8}\n", "does not divide the model's 4 routed experts"),
])
def test_a_bad_expert_layout_is_a_positioned_bad_parallel(tmp_path, parallel, message):
    entry = check(tmp_path, TINY, "micro_batch: 2, seq_len: 16", parallel)
    assert any(d["code"] == "bad-parallel" and message in d["message"] for d in entry["diagnostics"]), entry["diagnostics"]


def test_a_dense_model_has_no_experts_to_shard(tmp_path):
    llama = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
             "num_attention_heads": 4}
    entry = check(tmp_path, llama, "micro_batch: 2, seq_len: 16", "parallel: {data: 2, expert: 2}\n")
    assert any(d["code"] == "bad-parallel" and "has none" in d["message"] for d in entry["diagnostics"])
