"""Issue 21: Llama 4 text (llama4_text, Llama4ForCausalLM) through the front door.

The family is kept out of hf_measure.TINY (tests/ledger/test_combinations.py draws its covering design from it), so
its cross-checks live here: parameters against named_parameters() on the meta device (names, shapes, the nn.Linear
modules, the config class's __post_init__), `memfit check --format json` against a real CPU step (autograd's saved
bytes; eager and sdpa; with and without full checkpointing; 32-true, bf16-true, bf16-mixed; dense and MoE layers,
rope and NoPE layers, chunked attention below, at and above a chunk), the step's peak against MemTracker, the
published Scout and Maverick text configs, and the multimodal wrapper's diagnostic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

from memfit.models import families, hf, hf_activations as ha, hf_config

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# 4 layers: dense / MoE interleaved (interleave_moe_layer_step 2), rope / NoPE interleaved (no_rope_layer_interval 2),
# chunks of 8 tokens on the rope layers (sequences of 7, 8 and 16 fall below, at and above a chunk)
TINY = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 24, "intermediate_size_mlp": 112,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "no_rope_layer_interval": 2,
        "attention_chunk_size": 8, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0}
VARIANTS = {
    "interleaved": {},
    # every layer MoE, top-2 scores, no qk_norm (Maverick's switch)
    "all-moe": {"interleave_moe_layer_step": 1, "num_experts_per_tok": 2, "use_qk_norm": False},
    # no chunking, no temperature tuning, biased attention, tied embeddings
    "plain": {"attn_temperature_tuning": False, "attention_bias": True, "attention_chunk_size": None,
              "tie_word_embeddings": True},
    # explicit moe_layers, every key/value head its own, one NoPE layer in four
    "explicit": {"no_rope_layer_interval": 4, "num_key_value_heads": 4, "moe_layers": [0, 2]},
}


def config(variant: str = "interleaved", **changes) -> dict:
    """The config.json transformers writes for the tiny model (its to_dict: every __post_init__ list filled in)."""
    import transformers

    return transformers.AutoConfig.for_model("llama4_text", **{**TINY, **VARIANTS[variant], **changes}).to_dict()


def check_json(tmp_path: Path, cfg: dict, **training) -> dict:
    precision = training.pop("precision", "32-true")
    extra = training.pop("extra", {})
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "precision": precision, "optimizer": "adamw",
           "model": {"hf_config": "config.json"}, "training": training, **extra}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)["files"][0]


def meta_model(raw: dict):
    import torch
    import transformers

    config = transformers.AutoConfig.for_model("llama4_text", **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


# --- parameters --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parameters_match_named_parameters(variant):
    import torch.nn as nn

    raw = {"model_type": "llama4_text", **TINY, **VARIANTS[variant]}
    assert hf_config.validate(raw) == []
    cfg = hf_config.normalize(raw)
    model = meta_model(raw)
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    linears = [(n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules()
               if isinstance(m, nn.Linear)]   # the router is an nn.Linear subclass
    assert hf.linear_modules(cfg) == linears
    # Llama4TextConfig.__post_init__ (no_rope_layers, moe_layers, layer_types) as transformers applies it
    expected = model.config.to_dict()
    assert {k: v for k, v in cfg.items() if k in expected and expected[k] != v} == {}


def test_layer_kinds_follow_moe_layers_no_rope_layers_and_layer_types():
    cfg = hf_config.normalize({"model_type": "llama4_text", **TINY})
    assert ha.layer_kinds(cfg) == ["dense chunked", "moe nope", "dense chunked", "moe nope"]
    assert hf.layer_kinds(cfg) == ["dense", "moe", "dense", "moe"]   # the parameters differ by the MLP only
    names = {name: count for name, count, _ in hf.blocks(cfg)}
    assert names == {"embeddings": 1, "dense layer": 2, "layer": 2, "head": 1}


# --- saved activations against a real step, through `memfit check` ----------------------------------------------


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_check_matches_a_real_step(variant, attention, checkpointing, tmp_path):
    cfg = config(variant)
    model = hm.build(cfg, attention)
    for micro_batch, seq_len in ((2, 16), (1, 40), (2, 7)):
        measured = hm.measure(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention,
                              checkpointing=checkpointing, model=model if checkpointing == "none" else None)
        result = check_json(tmp_path, cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention,
                            checkpointing=checkpointing)
        assert result["diagnostics"] == []
        ours = result["footprint"]["activations"]
        theirs = measured["total"] if checkpointing == "none" else measured["peak"]
        assert ours == theirs, f"{variant} {attention} {checkpointing} b={micro_batch} s={seq_len}: {ours} vs {theirs}"


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", ["interleaved", "all-moe"])
def test_sixteen_bit_recipes_match_a_real_step(variant, attention, precision):
    """bf16-true: the rotary's fp32 round trip (xq.float(), type_as) and qk_norm's fp32 upcast; bf16-mixed: autocast's
    copies for the experts' torch.bmm (input and the stacked weights), the router's fp32 sigmoid, the fp32 residual."""
    cfg = config(variant)
    ncfg = hf_config.normalize(cfg)
    for micro_batch, seq_len in ((2, 16), (1, 40)):
        measured = hm.measure(cfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, precision=precision)
        ours = ha.total(ha.saved(ncfg, micro_batch=micro_batch, seq_len=seq_len, attention=attention, precision=precision))
        assert ours == measured["total"], (variant, attention, precision, micro_batch, seq_len)


def test_every_token_goes_through_every_expert():
    """Llama4TextMoe repeats the input once per expert whatever the router picks: the MoE layer's saved bytes grow with
    num_local_experts, not with num_experts_per_tok. Per expert and token (fp32, sdpa): the repeated input and the
    scaled one (h each), the score column (1), gate_up (2·ie), act_fn(gate) and the down input (ie each), and one more
    router sigmoid column (1); written here from the dimensions."""
    h, ie, T = TINY["hidden_size"], TINY["intermediate_size"], 2 * 16
    per_expert_token = 4 * (2 * h + 1 + 2 * ie + ie + ie + 1)
    moe_layers = 2
    totals = {}
    for experts, k in ((4, 1), (8, 1), (8, 2)):
        cfg = config(num_local_experts=experts, num_experts_per_tok=k)
        measured = hm.measure(cfg, micro_batch=2, seq_len=16)["total"]
        ours = ha.total(ha.saved(hf_config.normalize(cfg), micro_batch=2, seq_len=16))
        assert ours == measured
        totals[experts, k] = measured
    assert totals[8, 1] - totals[4, 1] == moe_layers * 4 * T * per_expert_token
    # top-2: only topk's (T, k) int64 indices grow
    assert totals[8, 2] - totals[8, 1] == moe_layers * T * 8


def test_chunked_layers_mask_sdpa_from_one_chunk_on():
    """create_chunked_causal_mask skips the mask only while the sequence is shorter than attention_chunk_size: from one
    chunk on, each chunked (rope) layer's sdpa keeps the mask as a float bias, and k and v repeated to every query
    head (transformers stops grouped-query sdpa once there is a mask)."""
    b, H, KV, d = 2, TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["head_dim"]
    chunked = 2

    def extra(s):   # the chunked layers' mask and the repeats beyond the grouped k and v, in fp32
        return chunked * 4 * (b * s * s + 2 * b * (H - KV) * s * d)

    for seq_len, masked in ((7, False), (8, True), (16, True)):
        cfg = config()
        plain = config(attention_chunk_size=None)   # the same layers, no chunks (the rope layers attend fully)
        measured = hm.measure(cfg, micro_batch=b, seq_len=seq_len)["total"]
        unchunked = hm.measure(plain, micro_batch=b, seq_len=seq_len)["total"]
        assert measured - unchunked == (extra(seq_len) if masked else 0), seq_len
        ours = ha.total(ha.saved(hf_config.normalize(cfg), micro_batch=b, seq_len=seq_len))
        assert ours == measured


# --- the step's peak against MemTracker ---------------------------------------------------------------------------

# measured (adamw foreach, sdpa, b=2, s=64): 32-true none 1.0049 -> 0.998, full 0.9879 -> 0.969; bf16-true none 0.9996,
# full 0.9668 -> 0.949 (below; a dense part's flight before its weight gradients, 2026-12-07). The phase differs without checkpointing: MemTracker's peak is the end of the forward, memfit's the
# backward (0.5% above)
# bf16-true full, 1,703,232 -> 1,672,000 / 1,761,788 = 0.967 -> 0.949: memfit's worst moment was layer 1's MLP flight
# with gate_proj's and up_proj's gradients counted (202,368 B of gradients); a dense part's flight comes before them
# (ledger/training FLIGHT_BEFORE_WEIGHTS, traced on Qwen2), which drops it. Traced 2026-12-07 (a dispatch-mode trace at
# MemTracker's peak): the real peak is elsewhere, layer 1's recomputation in the backward at the shared expert's
# act * up (aten.mul, forward order) with 155,776 B of gradients: the recomputed experts' bmm outputs (4, 128, 64) and
# (4, 128, 48), the routed rows' repeat and weighted copies (512, 64) and the shared expert's tensors, 571,144 B of
# ACT and 98,304 B of TEMP; the ledger's recompute moments of a MoE layer do not have them: open
PEAK_GAPS: dict = {}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_peak_is_within_five_percent_of_memtracker(precision, checkpointing, tmp_path, request):
    import peak_reference as ref

    if (precision, checkpointing) in PEAK_GAPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=PEAK_GAPS[(precision, checkpointing)]))

    cfg = hm.without_attention_dropout(config())
    theirs = ref.measure_hf(cfg, micro_batch=2, seq_len=64, optimizer="adamw", impl="foreach",
                            checkpointing=checkpointing, precision=precision)
    result = check_json(tmp_path, cfg, micro_batch=2, seq_len=64, checkpointing=checkpointing, optimizer_impl="foreach",
                        attention="sdpa", precision=precision)
    ours = result["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= 0.05 * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["live"]["parameters"] == theirs["parameters"]
    assert ours["live"]["optimizer_state"] == theirs["optimizer_state"]


# --- published configs -----------------------------------------------------------------------------------------

PUBLISHED = {   # examples/models: the text_config of each published config.json (model_type llama4_text)
    "llama-4-scout-17b-16e-text.json": 107_769_861_120,
    "llama-4-maverick-17b-128e-text.json": 400_711_848_960,
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_check_through_the_cli(name, tmp_path):
    raw = json.loads((ROOT / "examples" / "models" / name).read_text())
    model = meta_model(raw)
    real = sum(p.numel() for p in model.parameters())
    assert real == PUBLISHED[name]
    cfg = hf_config.normalize(raw)
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    (tmp_path / "train.yaml").write_text(
        f"memfit: 1\ndevice: {{memory: 100 TiB}}\nprecision: bf16-mixed\noptimizer: adamw\n"
        f"model: {{hf_config: {ROOT / 'examples' / 'models' / name}}}\n"
        "training: {micro_batch: 1, seq_len: 8192, attention: sdpa, checkpointing: full}\n")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "train.yaml")],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads(done.stdout)["files"][0]
    assert entry["diagnostics"] == []
    assert entry["footprint"]["parameters"] == 4 * real + buffer_bytes(model)   # bf16-mixed: fp32 weights, gradients and two AdamW states
    assert entry["footprint"]["gradients"] == 4 * real
    assert entry["footprint"]["optimizer_state"] == 8 * real


def test_the_example_checks(tmp_path):
    example = ROOT / "examples" / "moe" / "llama-4-scout-text-lora.yaml"
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(example)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode in (0, 1), done.stderr
    entry = json.loads(done.stdout)["files"][0]
    assert not [d for d in entry["diagnostics"] if d["code"] != "budget-exceeded"], entry["diagnostics"]
    # FSDP full_shard over 4 ranks: a quarter of the frozen bf16 base on a rank, and its share of the fp32 adapters
    # (r 16 on q, k, v, o: 16 · (h + q) + 2 · 16 · (h + kv) + 16 · (q + h) elements per layer)
    h, q, kv, r = 5120, 40 * 128, 8 * 128, 16
    adapters = 48 * r * ((h + q) + 2 * (h + kv) + (q + h))
    assert entry["footprint"]["parameters"] >= 2 * PUBLISHED["llama-4-scout-17b-16e-text.json"] // 4
    assert entry["footprint"]["parameters"] <= 2 * PUBLISHED["llama-4-scout-17b-16e-text.json"] // 4 + 4 * adapters


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj"], ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_lora_matches_a_real_step(targets, checkpointing):
    """peft has no default targets for llama4_text (its table names llama4): they are given; gate/up/down_proj adapt
    the dense MLP's and the shared expert's projections alike."""
    needs.module("peft")
    cfg = config()
    lora = {"r": 4, "target_modules": targets}
    for precision in ("32-true", "bf16-true"):
        measured = hm.measure(cfg, micro_batch=2, seq_len=16, precision=precision, lora=lora, checkpointing=checkpointing)
        run = dict(micro_batch=2, seq_len=16, precision=precision, lora=lora, checkpointing=checkpointing)
        ncfg = hf_config.normalize(cfg)
        ours = ha.peak_saved(ncfg, **run) if checkpointing == "full" else ha.total(ha.saved(ncfg, **run))
        assert ours == (measured["peak"] if checkpointing == "full" else measured["total"]), (targets, precision)


def test_all_linear_lora_is_refused_as_peft_fails_on_the_router(tmp_path):
    result = check_json(tmp_path, config(), micro_batch=2, seq_len=16, extra={"lora": {"r": 4, "target_modules": "all-linear"}})
    [problem] = result["diagnostics"]
    assert problem["code"] == "bad-lora" and "router" in problem["message"]
    needs.module("peft")
    model = hm.build(config(), lora={"r": 4, "target_modules": "all-linear"})   # what memfit refuses: the real failure
    with pytest.raises(AttributeError):
        model(**hm.inputs(config(), 2, 16))


# --- what memfit refuses or ignores, with its reason ------------------------------------------------------------


def test_the_multimodal_config_is_read_through_its_text_config_or_refused(tmp_path):
    """model_type llama4 (Llama4Config: text_config and vision_config): AutoModelForCausalLM builds Llama4ForCausalLM
    over the text_config alone, and memfit reads it so; a config naming Llama4ForConditionalGeneration (the vision
    tower and projector too, as the published ones do) is refused at that name, with the advice to give the
    text_config."""
    import torch
    import transformers

    raw = {"model_type": "llama4", "text_config": {"model_type": "llama4_text", **TINY},
           "vision_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96}}
    config = transformers.AutoConfig.for_model("llama4", **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == "Llama4ForCausalLM"
    real = sum(p.numel() for p in model.parameters())
    yaml_text = ("memfit: 1\ndevice: {memory: 1 TiB}\noptimizer: adamw\nmodel: {hf_config: config.json}\n"
                 "training: {micro_batch: 1, seq_len: 16}\n")
    (tmp_path / "train.yaml").write_text(yaml_text)

    def check(doc):
        (tmp_path / "config.json").write_text(json.dumps(doc, indent=2))
        done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "train.yaml")],
                              capture_output=True, text=True, timeout=180, check=False)
        return json.loads(done.stdout)["files"][0]

    entry = check(raw)
    assert entry["diagnostics"] == []
    assert entry["footprint"]["parameters"] == 4 * real + buffer_bytes(model)
    entry = check({**raw, "architectures": ["Llama4ForConditionalGeneration"]})
    [problem] = entry["diagnostics"]
    assert problem["code"] == "unsupported-model"
    assert "text_config" in problem["message"] and "llama4_text" in problem["message"]
    line = (tmp_path / "config.json").read_text().splitlines()[problem["range"]["start"]["line"]]
    assert "Llama4ForConditionalGeneration" in line
    # a bad key inside text_config is placed there
    entry = check({**raw, "text_config": {**raw["text_config"], "num_key_value_heads": 3}})
    [problem] = entry["diagnostics"]
    assert problem["code"] == "shape-mismatch"
    line = (tmp_path / "config.json").read_text().splitlines()[problem["range"]["start"]["line"]]
    assert '"num_key_value_heads": 3' in line


def test_expert_parallelism_is_refused_and_moe_routing_ignored(tmp_path):
    cfg = config()
    refused = check_json(tmp_path, cfg, micro_batch=2, seq_len=16, extra={"parallel": {"expert": 2, "data": 2}})
    assert [d["code"] for d in refused["diagnostics"]] == ["bad-parallel"]
    assert "every token through every expert" in refused["diagnostics"][0]["message"]
    plain = check_json(tmp_path, cfg, micro_batch=2, seq_len=16)
    routed = check_json(tmp_path, cfg, micro_batch=2, seq_len=16, moe={"routing": "worst_case"})
    assert [d["code"] for d in routed["diagnostics"]] == ["ignored-key"]
    assert routed["footprint"]["activations"] == plain["footprint"]["activations"]


def test_bad_per_layer_lists_are_placed():
    [problem] = hf_config.validate({"model_type": "llama4_text", **TINY, "no_rope_layers": [1, 0]})
    assert (problem.path, problem.code) == (("no_rope_layers",), "shape-mismatch")


# --- docs ----------------------------------------------------------------------------------------------------------


def test_the_docs_state_the_family_and_print_its_table():
    text = (ROOT / "docs" / "transformers.md").read_text(encoding="utf-8")
    body = text.split("<!-- family-table:begin -->")[1].split("<!-- family-table:end -->")[0]
    [row] = [line for line in body.splitlines() if line.startswith("| `llama4_text` |")]
    source = row.strip("|").split("|")[-1].strip().strip("`")
    path = Path(__import__("transformers").__file__).parent / source
    assert f"class {families.FAMILIES['llama4_text'].default_architecture}(" in path.read_text(encoding="utf-8")
    assert "**llama4_text**" in text
    doc = (ROOT / "docs" / "transformer-activations.md").read_text(encoding="utf-8")
    cfg = hf_config.normalize({"model_type": "llama4_text", **TINY})
    assert f"#### llama4_text\n\n{ha.markdown_table(cfg)}\n" in doc, "regenerate the llama4_text table"


def test_explain_states_that_every_token_goes_through_every_expert(tmp_path):
    cfg = config()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "train.yaml").write_text("memfit: 1\ndevice: {memory: 1 TiB}\noptimizer: adamw\n"
                                         "model: {hf_config: config.json}\ntraining: {micro_batch: 2, seq_len: 16}\n")
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", str(tmp_path / "train.yaml")], capture_output=True,
                          text=True, timeout=180, check=False, env={**__import__("os").environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    rows = TINY["num_local_experts"] * 2 * 16
    assert f"routed rows per MoE layer: {rows:,} (every token through each of {TINY['num_local_experts']} experts)" in done.stdout
    assert "uniform routing" not in done.stdout
