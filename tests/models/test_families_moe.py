"""Issue 21, mixtures of experts: Qwen2-MoE and Qwen3-MoE through the front door.

The shared cross-checks (tests/models/test_transformers_params.py, tests/models/test_transformers_activations.py) cover
these families from hf_measure.TINY and their CONFIGS; here: layers that differ (mlp_only_layers,
decoder_sparse_step: dense and sparse layers in one model) against a real step, eager and sdpa, with and
without full checkpointing; the published configs through `memfit check --format json` against the real
class built on the meta device; and the docs' MoE table in step with the code.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import needs
import pytest

from memfit.models import hf, hf_activations as ha, hf_config
from memfit.models.families import EXPERTS_KEY

ROOT = Path(__file__).resolve().parents[2]

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes  # noqa: E402

MIXED = {  # layers that differ: dense (mlp_only_layers, decoder_sparse_step) beside sparse ones
    "qwen2_moe": {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": True},
    "qwen3_moe": {"num_hidden_layers": 3, "mlp_only_layers": [0]},
}


def band(measured: int, ours: int, what: str, width: float = 0.05):
    assert abs(ours - measured) <= width * measured, f"{what}: memfit {ours} B vs measured {measured} B ({ours / measured:.4f}x)"


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("family", sorted(MIXED))
def test_dense_and_sparse_layers_match_a_real_step(family, attention):
    cfg = hm.tiny(family, **MIXED[family])
    if attention == "sdpa":
        cfg = hm.without_attention_dropout(cfg)
    kinds = ha.layer_kinds(cfg)
    assert "dense" in kinds and "moe" in kinds
    model = hm.build(cfg, attention)
    for micro_batch, seq_len in ((2, 16), (1, 40)):
        measured = hm.measure(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, model=model)["total"]
        ours = ha.total(ha.saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention))
        band(measured, ours, f"{family} {attention} b={micro_batch} s={seq_len}")
        peak = hm.measure(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing="full")["peak"]
        ours = ha.peak_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing="full")
        band(peak, ours, f"{family} {attention} checkpointed b={micro_batch} s={seq_len}")


MIXED_PARAMS = [  # models whose layers differ, against named_parameters() and the nn.Linear modules on the meta device
    {"model_type": "qwen2_moe", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 4,
     "num_attention_heads": 4, "num_key_value_heads": 4, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
     "num_experts": 3, "num_experts_per_tok": 1, "decoder_sparse_step": 2, "mlp_only_layers": [3], "qkv_bias": False,
     "tie_word_embeddings": True},
    {"model_type": "qwen3_moe", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 3,
     "num_attention_heads": 4, "num_key_value_heads": 4, "num_local_experts": 5, "num_experts_per_tok": 3,
     "mlp_only_layers": [0], "attention_bias": True, "norm_topk_prob": True},
    {"model_type": "qwen2_moe", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 0},   # no experts: every layer dense
]


@pytest.mark.parametrize("raw", MIXED_PARAMS, ids=lambda r: r["model_type"])
def test_layers_that_differ_match_named_parameters(raw):
    import torch
    import torch.nn as nn
    import transformers

    assert hf_config.validate(raw) == []
    cfg = hf_config.normalize(raw)
    config = transformers.AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    linears = [(n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert hf.linear_modules(cfg) == linears


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_phimoe_input_jitter_keeps_its_noise(attention):
    """Phi-3.5-MoE's config sets input_jitter_noise 0.01: the block and the router each multiply their input in
    place by a noise tensor and keep it."""
    cfg = hm.tiny("phimoe", input_jitter_noise=0.01)
    if attention == "sdpa":
        cfg = hm.without_attention_dropout(cfg)
    for micro_batch, seq_len in ((2, 16), (1, 40)):
        measured = hm.measure(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention)["total"]
        band(measured, ha.total(ha.saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention)),
             f"phimoe jitter {attention} b={micro_batch} s={seq_len}")
    plain = ha.total(ha.saved(hm.tiny("phimoe"), micro_batch=2, seq_len=16, attention=attention))
    assert ha.total(ha.saved(cfg, micro_batch=2, seq_len=16, attention=attention)) == plain + 2 * 2 * 2 * 16 * 64 * 4


def test_peft_cannot_wrap_the_phimoe_router_and_memfit_says_so(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phimoe", **hm.TINY["phimoe"], "vocab_size": 128}))
    (tmp_path / "run.yaml").write_text("memfit: 1\ndevice: {memory: 1 TiB}\noptimizer: adamw\nmodel: {hf_config: config.json}\n"
                                       "training: {micro_batch: 2, seq_len: 16}\nlora: {r: 4, target_modules: all-linear}\n")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                         capture_output=True, text=True, timeout=120, check=False)
    [problem] = json.loads(out.stdout)["files"][0]["diagnostics"]
    assert problem["code"] == "bad-lora" and "router" in problem["message"]
    peft = needs.module("peft")
    cfg = hm.tiny("phimoe")
    model = hm.build(cfg, lora={"r": 4, "target_modules": "all-linear"})   # what memfit refuses: the real failure
    with pytest.raises(AttributeError):
        model(**hm.inputs(cfg, 2, 16))
    assert peft


def test_the_blocks_follow_the_layer_kinds():
    cfg = hm.tiny("qwen2_moe", **MIXED["qwen2_moe"])   # dense, moe, dense, dense (layer 3 is in mlp_only_layers)
    assert ha.layer_kinds(cfg) == ["dense", "moe", "dense", "dense"]
    blocks = ha.saved(cfg, micro_batch=2, seq_len=16)
    assert [(b.name, b.count) for b in blocks[1:-2]] == [("dense layer", 1), ("layer", 1), ("dense layer", 2)]
    assert not any("router" in k.label for k in blocks[1].kept)
    assert any("router" in k.label for k in blocks[2].kept)
    assert any("shared_expert" in k.label for k in blocks[2].kept)
    names = {name: count for name, count, _ in hf.blocks(cfg)}
    assert names == {"embeddings": 1, "dense layer": 3, "layer": 1, "head": 1}


def test_without_norm_topk_prob_qwen_keeps_no_renormalization():
    plain = ha.saved(hm.tiny("qwen3_moe"), micro_batch=2, seq_len=16)[1].kept
    normalized = ha.saved(hm.tiny("qwen3_moe", norm_topk_prob=True), micro_batch=2, seq_len=16)[1].kept
    assert not any(k.label.startswith("routing weights / sum") for k in plain)
    assert sum(k.label.startswith("routing weights / sum") for k in normalized) == 2


PUBLISHED = {  # examples/models: the config.json Qwen publishes for each
    "qwen1.5-moe-a2.7b.json": ("examples/moe/qwen1.5-moe-a2.7b-lora.yaml", 14_315_784_192),
    "qwen3-30b-a3b.json": (None, 30_532_122_624),   # a full fine-tune on one H200, written below
    "phi-3.5-moe.json": ("examples/moe/phi-3.5-moe-lora.yaml", 41_873_153_344),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_check_through_the_cli(name, tmp_path):
    """`memfit check --format json` on the example: its parameter bytes are the real class's parameters (built on
    the meta device from the same config.json) at the example's dtype."""
    import torch
    import transformers

    example, published = PUBLISHED[name]
    raw = json.loads((ROOT / "examples" / "models" / name).read_text())
    config = transformers.AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    real = sum(p.numel() for p in model.parameters())
    assert real == published == hf.parameter_count(hf_config.normalize(raw))
    if example is None:
        example = str(tmp_path / "full.yaml")
        Path(example).write_text(f"memfit: 1\ndevice: {{preset: H200}}\nprecision: bf16-mixed\noptimizer: adamw\n"
                                 f"model: {{hf_config: {ROOT / 'examples' / 'models' / name}}}\n"
                                 "training: {micro_batch: 1, seq_len: 4096, attention: sdpa, checkpointing: full}\n")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", example], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode in (0, 1), out.stderr
    entry = json.loads(out.stdout)["files"][0]
    assert not [d for d in entry["diagnostics"] if d["code"] != "budget-exceeded"], entry["diagnostics"]
    text = Path(example).read_text() if Path(example).is_absolute() else (ROOT / example).read_text()
    if "lora:" in text:   # the frozen bf16 base plus fp32 adapters
        assert entry["footprint"]["parameters"] > 2 * real
        assert entry["footprint"]["parameters"] < 2 * real + 4 * 10**8
    else:                 # bf16-mixed: fp32 weights
        assert entry["footprint"]["parameters"] == 4 * real + buffer_bytes(model)  # (its buffers are parameters too)
        assert entry["footprint"]["gradients"] == 4 * real


def test_the_docs_table_lists_every_mixture_of_experts_family():
    text = (ROOT / "docs" / "transformers.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- moe-families -->"):]
    table = table[: table.index("\n\n")]
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \| `([^`]+)` \|$", table, re.MULTILINE)
    assert sorted(name for name, _, _ in rows) == sorted(EXPERTS_KEY)
    site = Path(__import__("transformers").__file__).parent
    for name, _, source in rows:
        assert (site / source).is_file(), source
        assert name in (site / source).read_text()
