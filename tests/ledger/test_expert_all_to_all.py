"""Issue 21, expert parallelism in the step's timeline: a MoE layer's all-to-all buffers (tests/support/moe_cli.py)."""

from __future__ import annotations

from moe_cli import TINY, check


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
