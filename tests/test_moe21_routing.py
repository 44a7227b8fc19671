"""Issue 21, mixtures of experts: the routing assumption (training.moe) and expert parallelism (parallel.expert),
through the CLI (`memfit check --format json` on a config a user could write).

The figures are compared with closed forms written here from the model's dimensions, not with memfit's own
functions: bytes per routed row (what transformers' grouped experts keep for each (token, expert) pair, as
tests/test_transformers_activations.py measures them), and Megatron's expert-parallel placement (each rank holds
num_experts / expert routed experts; the distributed optimizer shards their state over the data / expert ranks
that hold the same experts).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QWEN3 = json.loads((ROOT / "examples" / "models" / "qwen3-30b-a3b.json").read_text())
TINY = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 24, "num_experts": 4,
        "num_experts_per_tok": 2}


def check(tmp_path, model: dict, training: str, parallel: str = "", precision: str = "32-true") -> dict:
    (tmp_path / "config.json").write_text(json.dumps(model))
    (tmp_path / "run.yaml").write_text(
        f"memfit: 1\ndevice: {{memory: 10 TiB}}\nprecision: {precision}\noptimizer: adamw\nmodel: {{hf_config: config.json}}\n"
        f"training: {{{training}}}\n{parallel}")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout, out.stderr
    return json.loads(out.stdout)["files"][0]


def row_bytes(model: dict, width: int = 4) -> int:
    """What one routed (token, expert) row keeps in a Qwen3-MoE layer at fp32: the gathered token (h), gate_up
    (2·ie), act (ie), the down input (ie), the expert output (h), its routing weight, and three int64 indices
    (gather, permutation, inverse permutation)."""
    h, ie = model["hidden_size"], model["moe_intermediate_size"]
    return width * (h + 2 * ie + ie + ie + h + 1) + 3 * 8


def activations(entry: dict) -> int:
    assert not entry["diagnostics"], entry["diagnostics"]
    return entry["footprint"]["activations"]


def test_uniform_is_the_default_and_worst_case_is_dropless_on_one_device(tmp_path):
    base = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16"))
    assert activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {routing: uniform}")) == base
    # one device, transformers' dropless experts: T·k rows whatever the routing
    assert activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {routing: worst_case}")) == base


@pytest.mark.parametrize("factor", [1, 1.25, 2, 0.5])
def test_a_capacity_factor_pads_or_cuts_each_experts_rows(tmp_path, factor):
    tokens, k, experts, layers = 2 * 16, TINY["num_experts_per_tok"], TINY["num_experts"], TINY["num_hidden_layers"]
    base = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16"))
    ours = activations(check(tmp_path, TINY, f"micro_batch: 2, seq_len: 16, moe: {{capacity_factor: {factor}}}"))
    rows = experts * math.ceil(factor * tokens * k / experts)
    assert ours - base == layers * (rows - tokens * k) * row_bytes(TINY)
    assert (ours > base) == (factor > 1) and (ours < base) == (factor < 1)


def test_explain_states_the_routing_assumption(tmp_path):
    check(tmp_path, TINY, "micro_batch: 2, seq_len: 16")
    out = subprocess.run([sys.executable, "-m", "memfit", "explain", str(tmp_path / "run.yaml")], capture_output=True,
                         text=True, timeout=120, check=False).stdout
    assert "routed rows per MoE layer: 64 (training.moe changes it)" in out
    assert "uniform routing assumed: 16.0 rows per expert, dropless" in out


def test_a_bad_moe_key_is_a_positioned_schema_error(tmp_path):
    entry = check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {capacity_factor: 0}")
    [problem] = entry["diagnostics"]
    assert problem["code"] == "schema" and "capacity_factor" in problem["message"]
    assert problem["range"]["start"]["line"] == 5   # the training line (0-based), at the value


# ---------------------------------------------------------------------------------------------- parallel.expert

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


@pytest.mark.parametrize("expert", [1, 2, 4, 8])
def test_expert_parallel_ranks_hold_their_share_of_the_experts(tmp_path, expert):
    """Megatron's placement on 8 data ranks with ZeRO-1 (its distributed optimizer): a rank holds the non-expert
    parameters and num_experts / expert of the routed experts (bf16 weights, their fp32 gradients as memfit's
    bf16-mixed recipe keeps them); the optimizer state (fp32 master + Adam's two moments, 12 bytes) of the
    non-expert parameters is sharded over the 8 data ranks and of the routed experts over the 8 / expert ranks
    that hold the same experts: per rank 12 · (dense / 8 + experts / expert / (8 / expert)), the same for every
    `expert`. Megatron's theoretical_memory_usage.py leaves expert parallelism out (it divides by tensor and
    pipeline only): with expert = 1 the parameter bytes are its 2 bytes per parameter of the most-loaded shard."""
    pytest.importorskip("transformers")
    total = total_elements(QWEN3)
    routed = expert_elements(QWEN3)
    entry = check(tmp_path, QWEN3, "micro_batch: 1, seq_len: 4096, checkpointing: full",
                  f"parallel: {{data: 8, zero: 1, expert: {expert}}}\n", precision="bf16-mixed")
    assert not [d for d in entry["diagnostics"] if d["code"] not in ("budget-exceeded", "near-budget")], entry["diagnostics"]
    fp = entry["footprint"]
    local = total - routed + routed // expert
    assert fp["parameters"] == 2 * local
    state = 12 * ((total - routed) / 8 + routed / 8)
    assert abs(fp["optimizer_state"] - state) <= 12 * 2 * 8 * 64   # ZeRO's flat-buffer alignment padding


def test_worst_case_routing_sizes_the_expert_groups_tokens(tmp_path):
    tokens, k, experts, layers = 2 * 16, TINY["num_experts_per_tok"], TINY["num_experts"], TINY["num_hidden_layers"]
    parallel = "parallel: {data: 4, expert: 4}\n"
    uniform = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16", parallel))
    worst = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {routing: worst_case}", parallel))
    # every token of the 4 ranks sends its k choices to this rank's experts: 4 · T · min(k, E / 4) rows
    rows = 4 * tokens * min(k, experts // 4)
    assert worst - uniform == layers * (rows - tokens * k) * row_bytes(TINY)


def test_the_all_to_all_buffers_are_transient_bytes_of_the_moe_layer(tmp_path):
    """With expert parallelism each MoE layer's step row carries, while it runs (forward and backward), the
    all-to-all buffers: its T·k routed rows sent and the S rows its experts receive, at the hidden width."""
    import yaml

    from memfit.check.pipeline import check_file
    from memfit.ledger.training import build

    def mlp_flights(parallel: str) -> dict:
        check(tmp_path, TINY, "micro_batch: 2, seq_len: 16", parallel)
        path = tmp_path / "run.yaml"
        result = check_file(str(path))
        step = build(result.config, yaml.safe_load(path.read_text()), "adamw", "foreach")
        return {r.name: (r.forward_flight, r.backward_flight) for r in step.rows if r.name.endswith(" mlp")}

    without, with_ep = mlp_flights("parallel: {data: 4}\n"), mlp_flights("parallel: {data: 4, expert: 2}\n")
    tokens, k, h = 2 * 16, TINY["num_experts_per_tok"], TINY["hidden_size"]
    buffers = (tokens * k + tokens * k) * h * 4
    assert set(with_ep) == set(without) == {f"layer {i} mlp" for i in range(TINY["num_hidden_layers"])}
    for name, (forward, backward) in with_ep.items():
        assert (forward - without[name][0], backward - without[name][1]) == (buffers, buffers)


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
