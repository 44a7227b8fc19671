"""Issue 34's Whisper family through the front door: WhisperForConditionalGeneration, its encoder over
max_source_positions positions (two convolutions over 2 x max_source_positions log-mel frames), its decoder over
training.seq_len tokens. Parameters against the class transformers 5.24 builds on the meta device; saved bytes (the
peak of live saved bytes under full checkpointing) against a real CPU step's saved_tensors_hooks
(tests/support/hf_measure.py), fp32, eager and sdpa, checkpointing none and full, through `memfit check --format
json`; the family against the `[trace]` fallback's fake-tensor step; what the family does not compute goes to the
fallback; a decoder longer than its positions refused at training.seq_len."""

from __future__ import annotations

import needs
import pytest

from memfit.models import hf, hf_config

needs.module("torch")
transformers = needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import check_all, fallback_disagreements  # noqa: E402

SETTINGS = [("eager", "none"), ("sdpa", "none"), ("eager", "full"), ("sdpa", "full")]


# measured on the CPU: CPU autocast's policy (device.type cpu; tests/models/test_autocast_devices.py prices CUDA's)
CPU = {"memory": "1 TiB", "type": "cpu"}


def _whisper(**given) -> dict:
    base = {"vocab_size": 128, "d_model": 64, "decoder_layers": 2, "encoder_layers": 3, "decoder_attention_heads": 4,
            "encoder_attention_heads": 2, "decoder_ffn_dim": 112, "encoder_ffn_dim": 96, "max_target_positions": 64,
            "max_source_positions": 40, "num_mel_bins": 16, "decoder_start_token_id": 1, "pad_token_id": 0,
            "bos_token_id": 1, "eos_token_id": 2}
    transformers.logging.set_verbosity_error()
    return transformers.AutoConfig.for_model("whisper", **{**base, **given}).to_dict()


@pytest.mark.parametrize("tie", [True, False])
def test_whisper_parameters_are_named_parameters(tie):
    import torch

    raw = _whisper(tie_word_embeddings=tie)
    assert hf_config.validate(raw) == []
    cfg = hf_config.normalize(raw)
    with torch.device("meta"):
        model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**{**raw, "tie_word_embeddings": tie}))
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == {"model.encoder.embed_positions.weight"}


def test_whisper_matches_the_real_model(tmp_path):
    cases = {}
    for attention, checkpointing in SETTINGS:
        cases[f"{attention}-{checkpointing}"] = (_whisper(), {"micro_batch": 2, "seq_len": 16, "attention": attention,
                                                             "checkpointing": checkpointing})
    cases["longer-decoder"] = (_whisper(decoder_layers=3, encoder_layers=1), {"micro_batch": 1, "seq_len": 24,
                                                                            "attention": "sdpa", "checkpointing": "full"})
    files = check_all(tmp_path, cases, CPU)
    wrong = {}
    for name, (cfg, training) in cases.items():
        entry = files[name]
        assert entry["diagnostics"] == [], entry["diagnostics"]
        model = hm.build(cfg, training["attention"])
        assert entry["footprint"]["parameters"] == 4 * sum(p.numel() for p in model.parameters())
        # the encoder's sinusoidal positions are frozen: no gradient, no optimizer state
        assert entry["footprint"]["gradients"] == 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        full = training["checkpointing"] == "full"
        measured = hm.measure(cfg, micro_batch=training["micro_batch"], seq_len=training["seq_len"],
                              attention=training["attention"], checkpointing=training["checkpointing"], model=model)
        real = measured["peak" if full else "total"]
        if abs(entry["footprint"]["activations"] - real) > (0.10 if full else 0.05) * real:
            wrong[name] = (entry["footprint"]["activations"], real)
    assert wrong == {}


QV = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}   # the usual Whisper LoRA (peft 0.21 has no default)


def test_whisper_in_bf16_and_with_lora_matches_the_real_model(tmp_path):
    """bf16-true (the log-mel frames in bf16 too), bf16-mixed (CPU autocast: each projection's and convolution's
    input and weight copies, LayerNorm in fp32, the decoder's eager softmax promoted to fp32 by its causal mask) and LoRA on q_proj and v_proj with the base frozen (a stack's first
    layer keeps no LayerNorm input, eager no q there; the convolutions and embeddings nothing), each in eager and sdpa
    with and without full checkpointing, through memfit check against a real CPU step."""
    cases = {}
    for attention, checkpointing in SETTINGS:
        training = {"micro_batch": 2, "seq_len": 16, "attention": attention, "checkpointing": checkpointing}
        cases[f"bf16-{attention}-{checkpointing}"] = (_whisper(), training, {"precision": "bf16-true"})
        cases[f"mixed-{attention}-{checkpointing}"] = (_whisper(), training, {"precision": "bf16-mixed"})
        cases[f"lora-{attention}-{checkpointing}"] = (_whisper(), training, {"lora": QV})
    files = check_all(tmp_path, cases, CPU)
    wrong = {}
    for name, (cfg, training, extra) in cases.items():
        entry = files[name]
        assert entry["diagnostics"] == [], (name, entry["diagnostics"])
        precision, lora = extra.get("precision", "32-true"), extra.get("lora")
        model = hm.build(cfg, training["attention"], precision, lora)
        width = 2 if precision == "bf16-true" else 4
        assert entry["footprint"]["gradients"] == width * sum(p.numel() for p in model.parameters() if p.requires_grad)
        full = training["checkpointing"] == "full"
        measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=training["attention"], checkpointing=training["checkpointing"],
                              precision=precision, lora=lora, model=model)
        real = measured["peak" if full else "total"]
        if abs(entry["footprint"]["activations"] - real) > (0.10 if full else 0.05) * real:
            wrong[name] = (entry["footprint"]["activations"], real)
    assert wrong == {}


def test_whisper_family_and_the_fallback_agree(tmp_path):
    cases = {f"{a}-{c}": (_whisper(encoder_layers=4, decoder_layers=3), {"micro_batch": 2, "seq_len": 32, "attention": a,
                                                                        "checkpointing": c}) for a, c in SETTINGS}
    assert fallback_disagreements(tmp_path, cases, CPU) == {}


def test_whisper_outside_the_family_goes_to_the_fallback_and_a_long_decoder_is_refused(tmp_path):
    # and tensor parallelism, as for T5: the two stacks are not split across ranks
    cases = {"bf16": (_whisper(), {"micro_batch": 2, "seq_len": 16, "attention": "sdpa"},
                      {"lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj"]}}),
             "long": (_whisper(), {"micro_batch": 2, "seq_len": 65}),
             "tp": (_whisper(), {"micro_batch": 2, "seq_len": 16}, {"parallel": {"tensor": 2}})}
    files = check_all(tmp_path, cases, CPU)
    bf16 = files["bf16"]
    assert [d["code"] for d in bf16["diagnostics"]] == ["measured-activations"], bf16["diagnostics"]
    assert "LoRA other than" in bf16["diagnostics"][0]["message"] and bf16["footprint"]["activations"] > 0
    long = files["long"]["diagnostics"]
    assert [d["code"] for d in long] == ["schema"] and "max_target_positions 64" in long[0]["message"]
    lines = (tmp_path / "long.yaml").read_text().splitlines()
    assert "seq_len" in lines[long[0]["range"]["start"]["line"]]
    tp = files["tp"]["diagnostics"]
    assert [d["code"] for d in tp] == ["bad-parallel"] and "encoder and decoder" in tp[0]["message"]
