"""`parallel:` through the whole pipeline: memfit check / explain / json on configs."""

import json
import subprocess
import sys
import textwrap

import pytest

from memfit.check.pipeline import check
from memfit.report.explain import render


def run(source: str):
    return check(textwrap.dedent(source).lstrip())


def codes_at(result):
    return [(d.code, d.severity, d.range.start_line + 1) for d in result.diagnostics]


ZERO = """
memfit: 1
device: {{memory: 80 GB}}
optimizer: adam
dtypes: {{parameters: float16, gradients: float16, optimizer_state: float32}}
parameters:
  - {{name: layers.0.w, shape: [7500000000]}}
parallel: {{data: 64, zero: {stage}}}
"""


@pytest.mark.parametrize("stage, per_gpu", [(0, 90_000_000_000), (1, 30_937_500_000), (2, 16_171_875_000), (3, 1_406_250_000)])
def test_zero_stages_per_gpu_in_check(stage, per_gpu):
    """7.5B fp16 parameters and gradients, Adam in fp32 (K = 8: no master copy in this recipe), 64 GPUs."""
    result = run(ZERO.format(stage=stage))
    fp = result.footprint
    assert fp["total"] == per_gpu and fp["ranks"] == 64 and fp["rank"] == 0
    peak = result.parallel_peak
    gathered = 15_000_000_000 if stage == 3 else 0
    assert peak["bytes"] == per_gpu + 2 * gathered  # ZeRO-3 gathers the one 7.5B module: weights and gradients
    if stage == 3:
        assert [d.code for d in result.diagnostics] == []  # 31.4 GB < 80 GB
    else:
        assert result.failed == (per_gpu > 80_000_000_000)



ZERO_PAPER = """
memfit: 1
device: {{memory: 200 GB}}
precision: 16-true
master_weights: float32
optimizer: adam
parameters:
  - {{name: w, shape: [7500000000]}}
parallel: {{data: 64, zero: {stage}}}
"""


@pytest.mark.parametrize("stage, per_gpu", [(0, 120_000_000_000), (1, 31_406_250_000), (2, 16_640_625_000), (3, 1_875_000_000)])
def test_zero_paper_figure_1_through_the_pipeline(stage, per_gpu):
    """The ZeRO paper's Figure 1 (7.5B parameters, 64 GPUs, fp16 + fp32 master + Adam: K = 12) as a
    user writes it: the recipe keys (precision, master_weights) and parallel.zero, to the byte."""
    result = run(ZERO_PAPER.format(stage=stage))
    fp = result.footprint
    assert fp["total"] == per_gpu and fp["ranks"] == 64
    # the peak object keeps issue 13's shape under a parallel layout: bytes = sum of live, a phase
    peak = result.parallel_peak
    assert peak["phase"] == "backward" and peak["bytes"] == sum(peak["live"].values())


def test_bad_layouts_are_positioned():
    result = run("""
        memfit: 1
        device: {memory: 80 GB}
        optimizer: adam
        parameters:
          - {name: model.layers.0.w, shape: [64, 64]}
          - {name: model.layers.1.w, shape: [64, 64]}
        parallel:
          data: 12
          pipeline: 4
          sequence_parallel: true
          zero: 2
          fsdp: full_shard
    """)
    assert codes_at(result) == [("bad-parallel", "error", 9), ("bad-parallel", "error", 10), ("bad-parallel", "error", 12)]
    assert result.footprint is None
    hybrid = run("""
        memfit: 1
        device: {memory: 80 GB}
        optimizer: adam
        parameters: [[64, 64]]
        parallel: {data: 12, fsdp: hybrid_shard, gpus_per_node: 8}
    """)
    assert [d.code for d in hybrid.diagnostics] == ["bad-parallel"] and "gpus_per_node" in hybrid.diagnostics[0].message


def test_offload_host_budget_and_note():
    source = """
        memfit: 1
        device: {memory: 80 GB}
        optimizer: adam
        dtypes: {parameters: bfloat16, gradients: bfloat16}
        parameters:
          - {name: model.layers.0.w, shape: [1000000000]}
          - {name: model.layers.1.w, shape: [1000000000]}
        parallel: {data: 16, zero: 3, gpus_per_node: 8, offload: {optimizer: cpu, parameters: cpu}}
    """
    noted = run(source)
    assert codes_at(noted) == [("no-host-budget", "information", 8)]
    assert noted.footprint["total"] == 0
    # per rank: 2e9/16 elements x (2 bf16 weights + 2 bf16 gradients + 8 Adam) = 1.5 GB; 8 ranks a node
    assert noted.host["total"] == 8 * 1_500_000_000
    assert not noted.failed
    over = run(source.rstrip() + "\n        host: {memory: 10 GB}\n")
    assert codes_at(over) == [("host-budget-exceeded", "error", 9)]
    assert "12,000,000,000 B" in over.diagnostics[0].message
    fits = run(source.rstrip() + "\n        host: {memory: 16 GB}\n")
    assert fits.diagnostics == []


def test_pipeline_first_stage_holds_its_micro_batches():
    source = """
        memfit: 1
        device: {memory: 80 GB}
        optimizer: sgd
        parameters:
          - {name: h.0.w, shape: [100]}
          - {name: h.1.w, shape: [100]}
          - {name: h.2.w, shape: [100]}
          - {name: h.3.w, shape: [100]}
        activations:
          - {name: h.0.out, shape: [1000]}
          - {name: h.3.out, shape: [1000]}
        parallel: {pipeline: 4}
        training: {gradient_accumulation: 8}
    """
    result = run(source)
    stages = result.config.placement.devices
    assert [s["activations"] for s in stages] == [4 * 4000, 0, 0, 1 * 4000]
    assert result.footprint["rank"] == 0 and result.footprint["activations"] == 16000


def test_json_and_explain_show_the_rank(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text(textwrap.dedent("""
        memfit: 1
        device: {memory: 80 GB}
        optimizer: adamw
        parameters:
          - {name: model.embed_tokens.weight, shape: [1000, 64]}
          - {name: model.layers.0.mlp.up_proj.weight, shape: [256, 64]}
          - {name: model.layers.1.mlp.up_proj.weight, shape: [256, 64]}
        parallel: {data: 8, fsdp: full_shard}
    """).lstrip())
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=60)
    entry = json.loads(out.stdout)["files"][0]
    assert entry["footprint"]["ranks"] == 8 and entry["footprint"]["rank"] == 0
    # the root unit (the embedding, kept gathered) + the largest layer, fp32 weights and gradients
    assert entry["peak"]["gathered"] == {"gathered parameters": 4 * (1000 * 64 + 256 * 64), "unit gradients": 4 * (1000 * 64 + 256 * 64)}
    assert "host" not in entry
    text = render(check(path.read_text(), str(path)))
    assert "parallel   8 GPUs = data 8 x tensor 1 x pipeline 1; FSDP full_shard" in text
    assert "GPU rank 0 of 8 (the most loaded)" in text


def test_layer_tensors_written_once_with_a_count_are_one_per_layer():
    """models.hf writes a layer's tensors once ("model.layers.*.…", count = layers) and its saved
    activations as "layer: …" rows: the pipeline splits them, FSDP gathers one layer."""
    per_layer = run("""
        memfit: 1
        device: {memory: 80 GB}
        optimizer: sgd
        parameters:
          - {name: model.embed_tokens.weight, shape: [100, 8]}
          - {name: model.layers.*.mlp.up_proj.weight, shape: [32, 8], count: 4}
          - {name: model.layers.*.mlp.down_proj.weight, shape: [8, 32], count: 4}
          - {name: lm_head.weight, shape: [100, 8]}
        activations:
          - {name: "embeddings: dropout mask", shape: [10], dtype: bool}
          - {name: "layer: mlp input", shape: [100], count: 4}
          - {name: "loss: log-softmax", shape: [1000]}
        parallel: {pipeline: 2, data: 2, fsdp: full_shard}
        training: {gradient_accumulation: 4}
    """)
    assert per_layer.diagnostics == []
    first, last = per_layer.config.placement.devices
    assert first["activations"] == 2 * (10 + 2 * 400) and last["activations"] == 2 * 400 + 4000
    assert first["parameters"] == 4 * (50 * 8 + 2 * (16 * 8 + 4 * 32))
    gathered = per_layer.config.placement.transients[0]["gathered parameters"]
    assert gathered == 4 * (100 * 8 + 32 * 8 + 8 * 32)  # the root unit (embedding) + one layer
    too_many = run("""
        memfit: 1
        device: {memory: 80 GB}
        optimizer: sgd
        parameters:
          - {name: model.layers.*.w, shape: [8], count: 4}
        parallel: {pipeline: 8}
    """)
    assert [d.code for d in too_many.diagnostics] == ["bad-parallel"]


def test_tensor_parallel_must_divide_the_transformers_heads():
    base = """
        memfit: 1
        device: {memory: 80 GB}
        optimizer: sgd
        parameters: [[8]]
        model:
          transformer: {model_type: llama, num_attention_heads: 32, num_key_value_heads: 8, num_hidden_layers: 4}
        parallel: {tensor: %d, pipeline: %d}
    """
    from memfit.models.dispatch import layout_dims as _dims, transformer_config as _transformer_config

    def _transformer_dims(data, path):
        return _dims(_transformer_config(data, path))

    import yaml

    data = yaml.safe_load(textwrap.dedent(base % (16, 1)))
    assert _transformer_dims(data, "<text>") == {"heads": 32, "kv_heads": 8, "layers": 4}
    from memfit.check.pipeline import _layout_problems
    from memfit.check.configure import configure as build  # the config stage and its layout

    config, _ = build(data)
    assert [m for _, _, m in [(p.path, p.code, p.message) for p in _layout_problems(config, _transformer_dims(data, "<text>"))]] == [
        "tensor = 16 does not divide the 8 key/value heads"
    ]
    data = yaml.safe_load(textwrap.dedent(base % (3, 8)))
    config, _ = build(data)
    found = [(p.path, p.message) for p in _layout_problems(config, _transformer_dims(data, "<text>"))]
    assert found == [(("parallel", "tensor"), "tensor = 3 does not divide the 32 attention heads"),
                     (("parallel", "tensor"), "tensor = 3 does not divide the 8 key/value heads"),
                     (("parallel", "pipeline"), "pipeline = 8 stages but the model has 4 layers")]
