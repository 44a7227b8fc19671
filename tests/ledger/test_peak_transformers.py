"""memfit's peak of a training step of tiny transformers models against PyTorch's MemTracker around a real step on
the CPU (tests/support/peak_reference.py, tests/support/hf_measure.py's tiny configs), as test_peak.py does for the
Keras-form models: peak.bytes within 5%, the phase exactly, live.parameters and live.optimizer_state exactly; and
MemTracker's figure of every run docs/peak.md prints, to the byte (its memfit column: tests/project/test_docs.py).
"""

from __future__ import annotations

import contextlib

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")

import doc_tables  # noqa: E402
import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

from memfit.check.pipeline import check  # noqa: E402
from memfit.ledger.step import IMPLS  # noqa: E402
from memfit.models import hf_config  # noqa: E402

BAND = 0.05

STATES = {"sgd": 0, "adam": 2, "adamw": 2}
HF_RUNS = (
    [(f, "adamw", "foreach", c, 2, 64) for f in hf_measure.FAMILIES for c in ("none", "full")]
    + [(f, "sgd", "foreach", c, 2, 64) for f in ("llama", "gpt2") for c in ("none", "full")]
    + [(f, "adamw", i, c, 2, 64) for f in ("llama", "gpt2") for i in ("fused", "for_loop") for c in ("none", "full")]
    # one sequence of 8 tokens: the activations are small and the optimizer step is the peak
    + [(f, "adamw", i, "none", 1, 8) for f in ("llama", "gpt2") for i in IMPLS]
)
# bf16 parameters (model.to(bfloat16)): the loss upcasts the logits to fp32
HF_BF16 = [(f, "adamw", "foreach", c, b, s) for f in ("llama", "gpt2") for c in ("none", "full") for b, s in ((2, 64), (1, 8))]


def hf_tiny(family):
    return hf_measure.without_attention_dropout(hf_measure.tiny(family))


# issue 21: Gemma 2 (eager only) and Starcoder2 (its sliding window, 24 < 64 tokens, hands sdpa a mask) peak in the
# forward at the loss, with both layers' key/value cache copies alive and unsaved: repeat_kv copies k and v to every
# query head for the matmuls or the masked sdpa, which save those copies (a dispatch-mode trace at MemTracker's peak;
# models/held.repeated_cache_copies). With them memfit's forward is Gemma 2's 3,195,464 B (MemTracker 3,196,612) and
# Starcoder2's 1,896,644 B (MemTracker 1,897,844), in the forward as measured. A run whose phases are known to differ
# goes here (strict: when they agree, its entry must go)
EAGER_ONLY_PHASE: dict = {}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["32-true"])
@pytest.mark.parametrize("family,optimizer,impl,checkpointing,micro_batch,seq_len", HF_RUNS)
def test_transformers_peak_matches_memtracker(family, optimizer, impl, checkpointing, micro_batch, seq_len, precision, tmp_path):
    check_hf(family, optimizer, impl, checkpointing, micro_batch, seq_len, precision, tmp_path)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,optimizer,impl,checkpointing,micro_batch,seq_len", HF_BF16)
def test_transformers_peak_in_bf16_matches_memtracker(family, optimizer, impl, checkpointing, micro_batch, seq_len, tmp_path):
    check_hf(family, optimizer, impl, checkpointing, micro_batch, seq_len, "bf16-true", tmp_path)


def hf_run_peak(cfg: dict, tmp_path, **run) -> dict:
    """The peak `memfit check --format json` reports for the run, written as a user writes it:
    the model's config.json beside a memfit config that names it."""
    import json
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": run.pop("optimizer"), "model": {"hf_config": "config.json"}}
    if run.get("precision") is not None:
        doc["precision"] = run.pop("precision")
    for key in ("quantization", "lora"):
        if run.get(key) is not None:
            doc[key] = run.pop(key)
    run.pop("precision", None), run.pop("quantization", None), run.pop("lora", None)
    doc["training"] = {k: v for k, v in run.items() if v is not None}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


def documented_row(family, optimizer, impl, checkpointing, micro_batch, seq_len):
    """docs/peak.md's row of this run (tools/doc_tables.py), or None: the page prints the fp32 runs of ten families."""
    key = [family, optimizer, impl, checkpointing, f"{micro_batch}x{seq_len}"]
    rows = [r for r in doc_tables.documented("docs/peak.md", "peak-transformers") if r[:5] == key]
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


def check_hf(family, optimizer, impl, checkpointing, micro_batch, seq_len, precision, tmp_path):
    cfg = hf_tiny(family)
    theirs = ref.measure_hf(cfg, micro_batch=micro_batch, seq_len=seq_len, optimizer=optimizer, impl=impl, checkpointing=checkpointing, precision=precision)
    ours = hf_run_peak(cfg, tmp_path, optimizer=optimizer, precision=precision, micro_batch=micro_batch, seq_len=seq_len,
                       checkpointing=checkpointing, optimizer_impl=impl, attention="sdpa")["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["live"]["parameters"] == theirs["parameters"]
    assert ours["live"]["optimizer_state"] == theirs["optimizer_state"]
    row = documented_row(family, optimizer, impl, checkpointing, micro_batch, seq_len) if precision == "32-true" else None
    if row is not None:  # the page prints MemTracker's figure and phase to the byte
        assert (theirs["bytes"], theirs["phase"]) == (int(row[5].replace(",", "")), row[6]), row
    known = EAGER_ONLY_PHASE.get((family, checkpointing)) if precision == "32-true" else None
    if known:  # the one assertion known to fail; strict: when the phases agree, this entry must go
        assert ours["phase"] != theirs["phase"], f"the phases agree now: remove {(family, checkpointing)} from EAGER_ONLY_PHASE"
        pytest.xfail(known)
    assert ours["phase"] == theirs["phase"]


def test_every_run_the_page_prints_is_measured():
    """Each row of docs/peak.md's transformers table is one of the runs above (so its MemTracker figure is asserted)."""
    runs = {(f, o, i, c, f"{b}x{s}") for f, o, i, c, b, s in HF_RUNS}
    rows = doc_tables.documented("docs/peak.md", "peak-transformers")
    assert rows and all(tuple(r[:5]) in runs for r in rows), [r[:5] for r in rows if tuple(r[:5]) not in runs]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,checkpointing", [("llama", "none"), ("gpt2", "full")])
def test_a_transformer_run_through_check_matches_memtracker(family, checkpointing):
    """The whole pipeline on a transformer config (model.transformer inline, a training section)
    against a real step of the same tiny model."""
    cfg = hf_tiny(family)
    given = {k: v for k, v in cfg.items() if k in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                                     "num_key_value_heads", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions", "attn_pdrop", "bos_token_id", "eos_token_id")}
    doc = {
        "memfit": 1,
        "optimizer": "adamw",
        "device": {"memory": "1 GiB"},
        "model": {"transformer": given},
        "training": {"micro_batch": 2, "seq_len": 64, "checkpointing": checkpointing, "optimizer_impl": "for_loop"},
    }
    result = check(yaml.safe_dump(doc, sort_keys=False))
    assert not result.failed, result.diagnostics
    theirs = ref.measure_hf(cfg, micro_batch=2, seq_len=64, optimizer="adamw", impl="for_loop", checkpointing=checkpointing)
    ours = result.peak
    assert ours["phase"] == theirs["phase"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["live"]["parameters"] == theirs["parameters"] and ours["live"]["optimizer_state"] == theirs["optimizer_state"]


@pytest.mark.parametrize("family", hf_measure.FAMILIES)
def test_every_family_layer_splits_into_its_parts(family):
    """The layer parts are found by hf_activations' labels: a renamed op must not silently merge them."""
    from memfit.models import hf_activations
    from memfit.models.hf_parts import layer_parts

    kept = hf_activations.saved(hf_config.normalize(hf_tiny(family)), micro_batch=2, seq_len=64)[1].kept
    parts = dict(layer_parts(kept, hf_activations.FAMILIES[family]))
    assert parts["attention"] and parts["mlp"] and parts["down_proj"], {k: len(v) for k, v in parts.items()}
    assert sum(map(len, parts.values())) == len(kept)


# A sliding window shorter than the sequence in the families that read it as Starcoder2 does (transformers 5.24:
# MistralModel and MixtralModel build create_sliding_window_causal_mask when sliding_window is set, every layer
# attending through it; Qwen2's sliding layers, layer_types): sdpa is handed a mask, so k and v are repeated to every
# query head and the kernel keeps the mask as a float bias (models/hf_act_layers.py's window rows, hf_act_eval
# ._windowed). Before (memfit read no window for them), 2 x 64, window 24: Mistral 2,372,932 B against 2,505,148 B
# measured (0.947, in the backward against the forward), Mixtral 2,969,956 against 3,102,172 (0.957, the same
# phases), Qwen2 2,376,004 against 2,508,244 (0.947); now 2,504,004, 3,101,028 and 2,507,076, in the forward (1.000;
# at 8 x 128 Mistral was 0.882, Qwen2 0.882)
WINDOWED = {"mistral": {"sliding_window": 24}, "mixtral": {"sliding_window": 24},
            "qwen2": {"use_sliding_window": True, "sliding_window": 24, "max_window_layers": 0,
                      "layer_types": ["sliding_attention", "sliding_attention"]},
            # Qwen2-MoE slides in every other layer below max_window_layers (layer 0 of 2); Qwen3-MoE, Phi-3 and PhiMoE
            # in every layer when the window is set (their models pick create_sliding_window_causal_mask by
            # sliding_window alone); SmolLM3 in its NoPE layers (layer 1 of 2) with use_sliding_window
            "qwen2_moe": {"use_sliding_window": True, "sliding_window": 24, "max_window_layers": 2},
            "qwen3_moe": {"use_sliding_window": True, "sliding_window": 24},
            "smollm3": {"use_sliding_window": True, "sliding_window": 24},
            "phi3": {"sliding_window": 24}, "phimoe": {"sliding_window": 24}}
WINDOW_LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
# Before (memfit read no window for the five below), 2 x 64: Qwen2-MoE LoRA bf16-true 1,074,148 B in the backward
# against 1,108,000 B measured in the forward (0.969); Qwen3-MoE 32-true 2,531,428 B (backward) against 2,663,660 B
# (forward, 0.950); SmolLM3 LoRA bf16-true, window 64, 954,052 B (backward) against 987,904 B (forward, 0.966); Phi-3
# LoRA on qkv_proj and o_proj bf16-true 988,868 B against 1,071,880 B (0.923), 32-true, window 64, 2,438,468 B
# (backward) against 2,570,660 B (forward, 0.949); PhiMoE bf16-true 1,526,628 B (backward) against 1,586,672 B
# (forward, 0.962). Now 1,106,916, 2,662,500, 986,820, 1,070,788, 2,569,540 and 1,592,164 B, all in the forward
# (0.999 to 1.003)
WINDOW_RUNS = ([(f, 24, "32-true", None) for f in ("mistral", "mixtral", "qwen2", "qwen3_moe")] + [("mistral", 64, "32-true", None)]
               + [("qwen2_moe", 24, "bf16-true", WINDOW_LORA), ("smollm3", 64, "bf16-true", WINDOW_LORA),
                  ("phi3", 24, "bf16-true", {**WINDOW_LORA, "target_modules": ["qkv_proj", "o_proj"]}),
                  ("phi3", 64, "32-true", None), ("phimoe", 24, "bf16-true", None)])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family, window, precision, lora", WINDOW_RUNS)
def test_a_sliding_window_shorter_than_the_sequence_matches_memtracker(family, window, precision, lora, tmp_path):
    """A window as long as the sequence is a mask too (masking_utils._ignore_causal_mask_sdpa: kv_length >= the
    window); before, memfit read it as no window: Mistral 2 x 64, window 64, 2,372,932 B in the backward."""
    import torch

    # (the window given to the config class: its __post_init__ derives layer_types from it)
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny(family, **{**WINDOWED[family], "sliding_window": window}))
    assert "sliding_attention" in cfg.get("layer_types", ["sliding_attention"]), cfg
    model = hf_measure.build(cfg, precision=precision, lora=lora)
    batch = hf_measure.inputs(cfg, 2, 64)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    with hf_measure.cuda_dropout():
        theirs = ref.measure(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt)
    ours = hf_run_peak(cfg, tmp_path, optimizer="adamw", precision=precision, lora=lora, micro_batch=2, seq_len=64,
                       checkpointing="none", optimizer_impl="foreach", attention="sdpa")["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"], ours["bytes"] / theirs["bytes"])
    assert ours["phase"] == theirs["phase"], (ours, theirs)


# LoRA on o_proj alone: layer 0's attention (frozen, nothing trained before it) saves none of its inputs, so its
# key/value cache copies (DynamicLayer.update's `torch.cat`, (b, KV, s, d) each) are the cache's alone, alive and
# unsaved through the loss (models/held.frozen_cache; a dispatch-mode trace of the step finds them). Before, 8 x 128:
# Starcoder2 (window 24) 4,426,500 B against 4,549,480 B measured at bf16-true (0.973), 6,067,652 against 6,338,088
# at 32-true (0.957); Mistral (window 24, 32-true) 7,710,020 against 7,980,456 (0.966; 6,923,588, 0.868, before its
# window was read); Starcoder2 without a window 4,033,284 B in the backward against 4,025,176 B in the forward (memfit's
# forward 3.72 MiB). Now 4,557,572, 6,329,796, 4,033,284 (in the forward) and 7,972,164 B: 0.999 to 1.002, within half
# the band
FROZEN_FIRST = [("starcoder2", 24, "bf16-true"), ("starcoder2", 24, "32-true"), ("starcoder2", None, "bf16-true"),
                ("mistral", 24, "32-true")]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,window,precision", FROZEN_FIRST)
def test_lora_on_o_proj_alone_holds_layer_0s_cache(family, window, precision, tmp_path):
    import torch

    needs.module("peft")
    cfg = {**hf_tiny(family), "vocab_size": 128, "sliding_window": window}
    lora = {"r": 8, "alpha": 16, "target_modules": ["o_proj"]}
    model = hf_measure.build(cfg, precision=precision, lora=lora)
    batch = hf_measure.inputs(cfg, 8, 128)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    with hf_measure.cuda_dropout():
        theirs = ref.measure(model, (batch["input_ids"], batch["labels"]), lambda m, x, y: m(input_ids=x, labels=y).loss, opt)
    ours = hf_run_peak(cfg, tmp_path, optimizer="adamw", precision=precision, lora=lora, micro_batch=8, seq_len=128,
                       checkpointing="none", optimizer_impl="foreach", attention="sdpa")["peak"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"] / 2, (ours["bytes"], theirs["bytes"], ours["bytes"] / theirs["bytes"])
    assert ours["phase"] == theirs["phase"] == "forward", (ours, theirs)


# LoRA on q and v under full checkpointing, 2 x 64, against MemTracker (32-true Llama, Mistral 1,007,936 of 1,008,488 B,
# Qwen2-MoE 1,184,608 of 1,185,160 (0.9995; 0.995 before), Qwen3-MoE 1,081,952 of 1,082,504 (0.9995; 0.992), Gemma 3
# 1,136,388 of 1,132,076 (1.004), Gemma 2 0.958; bf16-true Llama, Mistral 630,464 of 631,016 (0.999), Qwen2-MoE 741,856
# of 742,408 (0.999; 721,104, 0.971, before), Qwen3-MoE 717,664 of 718,216 (0.999; 694,608, 0.967), Gemma 2
# 1,020,098 of 1,052,650 (0.969), Gemma 3 836,098 of 839,978 (0.995)). A checkpointed layer's recomputation
# takes its input (the checkpoint's boundary) off its parts' bytes only where the first kept tensor is the input itself
# (ledger/training._boundary_kept): a norm upcasting a 16-bit input keeps an fp32 copy beside it (a dispatch-mode
# allocation trace of layer 1's recomputation at MemTracker's peak, Llama bf16-true). Gemma 2 and 3 peak in the
# backward of the sandwich norm after the MLP, in PowBackward0: five fp32 (b, s, h) temporaries, before down_proj's
# weight gradient (models/hf_act_flights._sandwich_norm_flights; three before, after it), and Gemma 3's in layer 0,
# sliding, whose recomputation keeps input_layernorm's and k_norm's tensors (enable_input_require_grads:
# hf_act_eval._window_layers now knows it; before 0.907 and 0.889). gpt-oss peaks inside layer 1's recomputation, at the experts' down_proj bias gather, with the
# layer's unsaved locals and the experts' (S, h) output gradient alive (models/hf_act_flights._oss_recompute_tail):
# bf16-true 970,752 of 987,688 B (0.983; 894,960, 0.906, before), 32-true 1,644,448 of 1,677,768 (0.980; 0.910).
# Qwen2-MoE and Qwen3-MoE peak there too, at the experts' unsort (integrations/moe.py:528-529) in layer 1's
# recomputation, with the layer's and the experts' unsaved locals alive, and Qwen3-MoE's (S, h) output gradient
# (its experts' sum is the layer's last op; Qwen2-MoE's shared expert gate comes after it): models/hf_act_flights
# ._qwen_recompute_tail, a dispatch-mode trace at MemTracker's peak.
# OLMo 2 (its post norms the same backward): bf16-true 758,848 of 762,984 B (0.995; 693,312, 0.909, before), 32-true
# 1,058,880 of 1,050,728 (1.008). A run known low goes in CHECKPOINTED_LORA_LOW (strict: when it comes within the
# band, its entry must go)
# bf16-mixed (fp32 weights, the step under CPU autocast as the Trainer's bf16=True runs it): Gemma 3 1,027,332 of
# 1,032,236 B (0.995), OLMo 2 1,015,360 of 1,015,400 (1.000). Gemma 2 was 1,227,588 of 1,292,908 (0.949), and
# 1,020,098 of 1,052,650 at bf16-true (0.969), 0.958 at 32-true: a dispatch-mode allocation trace at MemTracker's
# peak (layer 1's post-feedforward norm backward) finds the model's two float masks alive, causal and sliding-window,
# (b, 1, s, s) in the embeddings' dtype (fp32 under autocast over fp32 weights): GradientCheckpointingLayer hands the
# checkpoint `partial(forward, self, **kwargs)`, whose closure holds the attention_mask keyword, unsaved
# (saved_tensors_hooks never see it), until that layer's backward (models/held.checkpoint_kwargs, Step.kwargs_held).
# Now 1,293,124 of 1,292,908 (1.000), bf16-true 1,052,866 of 1,052,650 (1.000); gpt-oss (eager too) peaks in layer
# 0's backward with its sliding mask alone, layer 1's causal mask gone with layer 1's backward; memfit's worst moment
# for it stays in layer 1's recomputation, both masks beside it: 0.983 -> 1,003,520 of 987,688 (1.016) at bf16-true,
# 0.980 -> 1,709,984 of 1,677,768 (1.019) at 32-true; Gemma 2 32-true 0.958 -> 1,369,412 of 1,361,004 (1.006)
CHECKPOINTED_LORA_LOW: set = set()
CHECKPOINTED_LORA = [(f, p) for f in ("llama", "mistral", "qwen2_moe", "qwen3_moe", "gemma2", "gemma3_text", "olmo2", "gpt_oss")
                     for p in ("bf16-true", "32-true")] + [(f, "bf16-mixed") for f in ("gemma2", "gemma3_text", "olmo2")]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,precision", CHECKPOINTED_LORA)
def test_lora_under_full_checkpointing_matches_memtracker(family, precision, tmp_path):
    import torch

    needs.module("peft")
    cfg = hf_tiny(family)
    model = hf_measure.build(cfg, precision=precision, lora=WINDOW_LORA)
    model.get_base_model().activation_checkpointing_enable()
    batch = hf_measure.inputs(cfg, 2, 64)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()

    def loss(m, x, y):
        with autocast:
            return m(input_ids=x, labels=y).loss

    with hf_measure.cuda_dropout():
        theirs = ref.measure(model, (batch["input_ids"], batch["labels"]), loss, opt)
    ours = hf_run_peak(cfg, tmp_path, optimizer="adamw", precision=precision, lora=WINDOW_LORA, micro_batch=2, seq_len=64,
                       checkpointing="full", optimizer_impl="foreach", attention="sdpa")["peak"]
    within = abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"]
    if (family, precision) in CHECKPOINTED_LORA_LOW:  # strict: when it comes within the band, its entry must go
        assert not within and ours["bytes"] < theirs["bytes"], f"within the band now: remove {(family, precision)} from CHECKPOINTED_LORA_LOW"
        pytest.xfail(f"{family} {precision}: {ours['bytes']:,} of {theirs['bytes']:,} B")
    assert within, (ours["bytes"], theirs["bytes"], ours["bytes"] / theirs["bytes"])
    assert ours["phase"] == theirs["phase"], (ours, theirs)
