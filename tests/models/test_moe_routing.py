"""Issue 21, mixtures of experts: the routing assumption (training.moe: routing, capacity_factor) through the CLI
(`memfit check --format json` on a config a user could write).

The figures are compared with closed forms written from the model's dimensions (tests/support/moe_cli.py), not with
memfit's own functions: bytes per routed row (what transformers' grouped experts keep for each (token, expert) pair,
as tests/models/test_transformers_activations.py measures them).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from moe_cli import TINY, activations, check, row_bytes


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


def test_worst_case_routing_sizes_the_expert_groups_tokens(tmp_path):
    tokens, k, experts, layers = 2 * 16, TINY["num_experts_per_tok"], TINY["num_experts"], TINY["num_hidden_layers"]
    parallel = "parallel: {data: 4, expert: 4}\n"
    uniform = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16", parallel))
    worst = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {routing: worst_case}", parallel))
    # every token of the 4 ranks sends its k choices to this rank's experts: 4 · T · min(k, E / 4) rows
    rows = 4 * tokens * min(k, experts // 4)
    assert worst - uniform == layers * (rows - tokens * k) * row_bytes(TINY)


@pytest.mark.parametrize("parallel", ["parallel: {tensor: 2}\n", "parallel: {pipeline: 2}\n"])
def test_the_routing_assumption_holds_under_tensor_and_pipeline_parallelism(tmp_path, parallel):
    # the per-rank path (Megatron's split) sizes the routed rows as one device does: a capacity factor adds
    # (rows - T·k) routed rows per MoE layer on the rank that holds the layers (tensor: every layer; pipeline:
    # the first stage's, with the micro-batches 1F1B keeps there)
    tokens, k, experts = 2 * 16, TINY["num_experts_per_tok"], TINY["num_experts"]
    base = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16", parallel))
    padded = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {capacity_factor: 2}", parallel))
    cut = activations(check(tmp_path, TINY, "micro_batch: 2, seq_len: 16, moe: {capacity_factor: 0.5}", parallel))
    rows = experts * math.ceil(2 * tokens * k / experts)
    assert padded > base > cut
    assert (padded - base) % ((rows - tokens * k) * row_bytes(TINY)) == 0
