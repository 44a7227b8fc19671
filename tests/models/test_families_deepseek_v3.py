"""Issue 21, DeepSeek-V3 (transformers 5.24's models/deepseek_v3/modeling_deepseek_v3.py) through the front door.

Its tiny config (hf_measure.TINY["deepseek_v3"]) is kept out of hf_measure.FAMILIES, the list the covering design of
tests/ledger/test_combinations.py draws from, so the shared activation cross-checks do not see it: they are here.
Parameters against named_parameters() on the meta device (tests/models/test_transformers_params.py covers CONFIGS;
here the published DeepSeek-V3 config). Saved bytes against autograd's saved tensors in a real CPU step: latent
attention through q_lora_rank or a plain q_proj, q/k head dims wider than v's (SDPA's math kernel on CPU) or equal
(its fused kernel), interleaved rotary or not, dense first layers beside MoE layers, one or two shared experts; eager
and sdpa, with and without full checkpointing, fp32, bf16-true, bf16-mixed and LoRA on the attention. What memfit
leaves out, measured: the router's group selection (top-k over groups, masked_fill, top-k) saves indices and a mask
that reach no loss; autograd frees them with the router's forward, so they are in the measured total (every storage
ever saved) but never in the peak: T·(2·n_group·8 + topk_group·8 + n_routed_experts) bytes per MoE layer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import needs
import pytest

from memfit.models import hf, hf_activations as ha, hf_config

ROOT = Path(__file__).resolve().parents[2]

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes  # noqa: E402
from family_check import run_check  # noqa: E402

VARIANTS = {  # over hf_measure.TINY["deepseek_v3"] (q/k 16 + 8 wide, v 12; one dense layer, then MoE)
    "q_lora": {},
    "q_proj": {"q_lora_rank": None},
    "same_head_dims": {"qk_nope_head_dim": 4, "v_head_dim": 12},   # q/k 4 + 8 = v 12: SDPA's fused kernel on CPU
    "plain_rotary_two_shared": {"rope_interleave": False, "num_hidden_layers": 3, "first_k_dense_replace": 2,
                                "n_shared_experts": 2},
}
SHAPES = ((2, 16), (1, 40))


def dead_router_bytes(cfg: dict, tokens: int) -> int:
    """What the group selection saves and autograd frees with the router's forward (reaching no loss), per MoE layer."""
    return tokens * (2 * cfg["n_group"] * 8 + cfg["topk_group"] * 8 + cfg["n_routed_experts"])


def moe_layers(cfg: dict) -> int:
    return cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_saved_bytes_match_a_real_step(variant, attention, checkpointing):
    cfg = hm.tiny("deepseek_v3", **VARIANTS[variant])
    kinds = ha.layer_kinds(cfg)
    assert kinds == ["dense"] * cfg["first_k_dense_replace"] + ["moe"] * moe_layers(cfg)
    model = None if checkpointing == "full" else hm.build(cfg, attention)
    for micro_batch, seq_len in SHAPES:
        measured = hm.measure(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention,
                              checkpointing=checkpointing, model=model)
        if checkpointing == "full":
            ours = ha.peak_saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, checkpointing="full")
            assert ours == measured["peak"], (variant, micro_batch, seq_len)
        else:
            ours = ha.total(ha.saved(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention))
            # exact but for the router's freed group selection, which the measured total counts (less where a later
            # tensor of the same size reuses a freed storage's address: the measurement keys storages by address)
            dead = moe_layers(cfg) * dead_router_bytes(cfg, micro_batch * seq_len)
            assert 0 <= measured["total"] - ours <= dead, (variant, micro_batch, seq_len, ours, measured["total"], dead)
            assert abs(ours - measured["total"]) <= 0.01 * measured["total"]


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_sixteen_bit_recipes_match_a_real_step(precision, attention):
    """bf16: kv_a_layernorm upcasts the latent to an fp32 copy; the router copies its input and weight to fp32; SDPA's
    CPU math kernel computes a 16-bit q, k, v in fp32 (its copies and its softmax are fp32)."""
    cfg = hm.tiny("deepseek_v3")
    measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=attention, precision=precision)
    ours = ha.total(ha.saved(cfg, micro_batch=2, seq_len=16, attention=attention, precision=precision))
    assert abs(ours - measured["total"]) <= 0.01 * measured["total"], (ours, measured["total"])
    peak = hm.measure(cfg, micro_batch=2, seq_len=16, attention=attention, precision=precision, checkpointing="full")["peak"]
    assert ha.peak_saved(cfg, micro_batch=2, seq_len=16, attention=attention, precision=precision, checkpointing="full") == peak


LATENT = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("targets", [LATENT, ["kv_b_proj", "o_proj"]], ids=["latent", "kv_b-o"])
def test_lora_on_the_latent_attention_matches_peft(targets, checkpointing):
    needs.module("peft")
    cfg = hm.tiny("deepseek_v3")
    lora = {"r": 4, "target_modules": targets}
    for attention in ("eager", "sdpa"):
        measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=attention, precision="bf16-true", lora=lora,
                              checkpointing=checkpointing)
        common = dict(micro_batch=2, seq_len=16, attention=attention, precision="bf16-true", lora=lora)
        if checkpointing == "full":
            assert ha.peak_saved(cfg, checkpointing="full", **common) == measured["peak"]
        else:
            ours = ha.total(ha.saved(cfg, **common))
            assert 0 <= measured["total"] - ours <= moe_layers(cfg) * dead_router_bytes(cfg, 32)


def test_the_layers_and_their_rows():
    """The dense layers keep Llama's gated MLP; the MoE layers the sigmoid router (scores, the gathered indices, the
    renormalization), the grouped experts' routed rows and the shared experts; the latent attention's rows follow the
    kernel: eager keeps the fp32 softmax, SDPA's math kernel (q/k wider than v) its own, the fused kernel none."""
    cfg = hm.tiny("deepseek_v3", num_hidden_layers=3)
    blocks = ha.saved(cfg, micro_batch=2, seq_len=16, attention="sdpa")
    assert [(b.name, b.count) for b in blocks[1:-2]] == [("dense layer", 1), ("layer", 2)]
    dense, moe = blocks[1].kept, blocks[2].kept
    assert not any("router" in k.label or "shared expert" in k.label for k in dense)
    labels = [k.label for k in moe]
    assert "router sigmoid: scores (fp32)" in labels and "scores.gather: top-k indices" in labels
    assert sum("shared experts" in label for label in labels) >= 3
    assert any(k.label.startswith("softmax (math kernel)") and k.shape == (2, 4, 16, 16) for k in moe)
    fused = ha.saved(hm.tiny("deepseek_v3", qk_nope_head_dim=4), micro_batch=2, seq_len=16, attention="sdpa")[2].kept
    assert not any(len(k.shape) == 4 and k.shape[-2:] == (16, 16) for k in fused)
    assert any(k.label == "attention: log-sum-exp (fp32)" for k in fused)
    # parameters: each kind's block covers its own layers
    assert {name: count for name, count, _ in hf.blocks(cfg)} == {"embeddings": 1, "dense layer": 1, "layer": 2, "head": 1}



def meta_model(raw: dict):
    import torch
    import transformers

    config = transformers.AutoConfig.for_model("deepseek_v3", **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_check_matches_the_real_model(attention, checkpointing, tmp_path):
    """`memfit check --format json` on the tiny config.json: fp32 AdamW bytes of the meta-built model's parameters,
    the activations figure within 1% of the real step's saved bytes (its peak under full checkpointing)."""
    cfg = hm.tiny("deepseek_v3", num_hidden_layers=3)
    result = run_check(tmp_path, cfg, attention=attention, checkpointing=checkpointing)
    built = meta_model(cfg)
    elements = sum(p.numel() for p in built.parameters())
    footprint = result["footprint"]
    assert footprint["parameters"] == 4 * elements + buffer_bytes(built)  # (the buffers are parameters too)
    assert footprint["gradients"] == 4 * elements and footprint["optimizer_state"] == 8 * elements
    measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=attention, checkpointing=checkpointing)
    real = measured["peak"] if checkpointing == "full" else measured["total"]
    assert abs(footprint["activations"] - real) <= 0.01 * real, (footprint["activations"], real)


PUBLISHED = ROOT / "examples" / "models" / "deepseek-v3.json"
# transformers builds the 61 decoder layers; the published 671B excludes the multi-token-prediction module
# (num_nextn_predict_layers: layer 61, another ~14B in the checkpoint, 685B in all), which DeepseekV3ForCausalLM does not
# build (_keys_to_ignore_on_load_unexpected skips model.layers.61 when loading)
DEEPSEEK_V3_PARAMETERS = 671_026_404_352


def test_the_published_config_is_the_real_model():
    import torch.nn as nn

    raw = json.loads(PUBLISHED.read_text())
    assert hf_config.validate(raw) == []
    cfg = hf_config.normalize(raw)
    model = meta_model(raw)
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    real = sum(p.numel() for p in model.parameters())
    assert real == hf.parameter_count(cfg) == DEEPSEEK_V3_PARAMETERS
    assert len(model.model.layers) == raw["num_hidden_layers"] == 61 and raw["num_nextn_predict_layers"] == 1
    linears = [(n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert hf.linear_modules(cfg) == linears


def test_the_published_config_checks_through_the_cli(tmp_path):
    """Full fine-tuning DeepSeek-V3 in fp32 (no device holds it: a 64 TiB budget), and the bundled LoRA example."""
    raw = json.loads(PUBLISHED.read_text())
    result = run_check(tmp_path, raw, memory="64 TiB", micro_batch=1, seq_len=8)
    assert result["footprint"]["parameters"] == 4 * DEEPSEEK_V3_PARAMETERS + buffer_bytes(meta_model(raw))
    assert result["footprint"]["gradients"] == 4 * DEEPSEEK_V3_PARAMETERS
    example = ROOT / "examples" / "families" / "deepseek-v3-lora.yaml"
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(example)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads(done.stdout)["files"][0]
    assert entry["diagnostics"] == []


@pytest.mark.parametrize("change, key", [({"num_key_value_heads": 2}, "num_key_value_heads"), ({"n_group": 3}, "n_group"),
                                         ({"topk_group": 3}, "topk_group")])
def test_configs_transformers_cannot_run_are_refused_at_their_key(change, key):
    import torch

    raw = {"model_type": "deepseek_v3", **hm.TINY["deepseek_v3"], "vocab_size": 128, **change}
    [problem] = hf_config.validate(raw)
    assert problem.path == (key,) and problem.code == "shape-mismatch"
    # what transformers does with it: the forward fails (key/value heads repeated again; groups that do not divide the
    # experts; more groups chosen than there are)
    cfg = hm.tiny("deepseek_v3", **change)
    model = hm.build(cfg, "eager")
    with pytest.raises(RuntimeError), torch.no_grad():
        model(**hm.inputs(cfg, 2, 16))


def test_all_linear_lora_is_resolved_as_peft_retargets_the_experts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", **hm.TINY["deepseek_v3"], "vocab_size": 128}))
    (tmp_path / "run.yaml").write_text("memfit: 1\ndevice: {memory: 1 TiB}\noptimizer: adamw\nmodel: {hf_config: config.json}\n"
                                       "training: {micro_batch: 2, seq_len: 16}\nlora: {r: 4, target_modules: all-linear}\n")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                         capture_output=True, text=True, timeout=120, check=False)
    entry = json.loads(out.stdout)["files"][0]
    # peft's bytes for it are measured in tests/recipe/test_lora_moe_all_linear.py
    assert not entry["diagnostics"] and entry["footprint"]["gradients"] > 0, entry["diagnostics"]


def test_the_docs_print_the_layer_table_as_the_rules_make_it():
    """docs/transformer-activations.md's deepseek_v3 table (tests/models/test_transformers_activations.py checks the
    families of hf_measure.FAMILIES; this one is kept out of it)."""
    doc = (ROOT / "docs" / "transformer-activations.md").read_text(encoding="utf-8")
    assert f"#### deepseek_v3\n\n{ha.markdown_table(hm.tiny('deepseek_v3'))}\n" in doc, "deepseek_v3: regenerate the table"
    text = (ROOT / "docs" / "transformers.md").read_text(encoding="utf-8")
    assert f"{DEEPSEEK_V3_PARAMETERS:,}" in text and "multi-token-prediction" in text


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_the_step_peak_matches_memtracker(checkpointing, tmp_path):
    """The whole step (parameters, AdamW state, gradients, the saved tensors, the backward's transients) through the
    CLI against PyTorch's MemTracker around a real warm step (tests/support/peak_reference.py)."""
    import peak_reference as ref

    cfg = hm.tiny("deepseek_v3", num_hidden_layers=3)
    theirs = ref.measure_hf(cfg, micro_batch=2, seq_len=64, optimizer="adamw", impl="foreach", checkpointing=checkpointing)
    ours = run_check(tmp_path, cfg, micro_batch=2, seq_len=64, checkpointing=checkpointing, attention="sdpa",
                     optimizer_impl="foreach")["peak"]
    assert ours["phase"] == theirs["phase"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= 0.05 * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["live"]["parameters"] == theirs["parameters"]
