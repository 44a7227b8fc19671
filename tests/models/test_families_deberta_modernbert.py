"""Issue 34's DeBERTa-v2 and ModernBERT families through the front door: the masked LM and the sequence and token
classifiers, chosen by config.json's architectures[0]. Parameters, linears and buffers against the class transformers
5.24 builds on the meta device; saved bytes (the peak of live saved bytes under full checkpointing) against a real
CPU step's saved_tensors_hooks (tests/support/hf_measure.py), fp32, eager and sdpa, checkpointing none and full,
through `memfit check --format json`; the family against the `[trace]` fallback's fake-tensor step; what a family
does not compute goes to the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import needs
import pytest

from memfit.models import deberta, hf_config, modernbert

needs.module("torch")
transformers = needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes, check_all, fallback_disagreements  # noqa: E402

_TINY = {"hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
         "max_position_embeddings": 128}
DEBERTA_V2 = _TINY   # DebertaV2Config's defaults: absolute positions, no relative attention
DEBERTA_V3 = {**_TINY, "relative_attention": True, "position_buckets": 32, "norm_rel_ebd": "layer_norm", "share_att_key": True,
              "pos_att_type": "p2c|c2p", "position_biased_input": False, "type_vocab_size": 0}   # deberta-v3-base's switches
MODERNBERT = {**_TINY, "num_hidden_layers": 3, "global_attn_every_n_layers": 2, "local_attention": 16, "pad_token_id": 0,
              "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}
HEADS = {"deberta-v2": [("DebertaV2ForMaskedLM", 2), ("DebertaV2ForSequenceClassification", 3),
                        ("DebertaV2ForTokenClassification", 5), ("DebertaV2ForSequenceClassification", 1)],
         "modernbert": [("ModernBertForMaskedLM", 2), ("ModernBertForSequenceClassification", 3),
                        ("ModernBertForTokenClassification", 5), ("ModernBertForSequenceClassification", 1)]}
SETTINGS = [("eager", "none"), ("sdpa", "none"), ("eager", "full"), ("sdpa", "full")]


def _config(model_type: str, architecture: str, **given) -> dict:
    transformers.logging.set_verbosity_error()
    return json.loads(transformers.AutoConfig.for_model(model_type, architectures=[architecture], **given).to_json_string())


def _compare(tmp_path: Path, cases: dict, notes: dict | None = None) -> dict:
    """name -> (memfit's activations, the real step's) where they differ by more than the band; parameters exact."""
    files = check_all(tmp_path, cases)
    wrong = {}
    for name, (cfg, training) in cases.items():
        entry = files[name]
        assert [d["code"] for d in entry["diagnostics"]] == (notes or {}).get(name, []), (name, entry["diagnostics"])
        model = hm.build(cfg, training["attention"])
        assert entry["footprint"]["parameters"] == 4 * sum(p.numel() for p in model.parameters()) + buffer_bytes(model), name
        full = training["checkpointing"] == "full"
        measured = hm.measure(cfg, micro_batch=2, seq_len=training["seq_len"], attention=training["attention"],
                              checkpointing=training["checkpointing"], model=model)
        real = measured["peak" if full else "total"]
        if abs(entry["footprint"]["activations"] - real) > (0.10 if full else 0.05) * real:
            wrong[name] = (entry["footprint"]["activations"], real)
    return wrong


VARIANTS = [
    ("deberta-v2", "DebertaV2ForMaskedLM", DEBERTA_V3),
    ("deberta-v2", "DebertaV2ForMaskedLM", {**DEBERTA_V3, "tie_word_embeddings": False}),
    ("deberta-v2", "DebertaV2ForMaskedLM", {**DEBERTA_V2, "legacy": False, "relative_attention": True, "pos_att_type": ["c2p", "p2c"]}),
    ("deberta-v2", "DebertaV2ForSequenceClassification", {**DEBERTA_V2, "type_vocab_size": 2, "num_labels": 3}),
    ("deberta-v2", "DebertaV2ForTokenClassification", DEBERTA_V3),
    ("modernbert", "ModernBertForMaskedLM", MODERNBERT),
    ("modernbert", "ModernBertForSequenceClassification", {**MODERNBERT, "tie_word_embeddings": False, "norm_bias": True,
                                                           "attention_bias": True, "mlp_bias": True, "classifier_bias": True}),
    ("modernbert", "ModernBertForTokenClassification", {**MODERNBERT, "global_attn_every_n_layers": 1}),
]


@pytest.mark.parametrize("model_type, architecture, given", VARIANTS, ids=[f"{a}-{i}" for i, (_, a, _) in enumerate(VARIANTS)])
def test_parameters_linears_and_buffers_are_transformers(model_type, architecture, given):
    import torch

    config = transformers.AutoConfig.for_model(model_type, architectures=[architecture], **given)
    raw = json.loads(config.to_json_string())
    assert hf_config.validate(raw) == []
    cfg = hf_config.model_view(hf_config.normalize(raw))
    module = deberta if model_type == "deberta-v2" else modernbert
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config)
    assert [(p.name, p.shape) for p in module.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    linears = sorted((n, m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear))
    assert sorted(module.linears(cfg)) == linears
    assert [(n, s) for n, s, _ in module.buffers(cfg)] == [(n, tuple(b.shape)) for n, b in model.named_buffers()]


def test_deberta_heads_match_the_real_model(tmp_path):
    """Every head of a DeBERTa-v3-style config (relative attention over bucketed positions, shared keys, both
    position terms) eager with and without checkpointing; sdpa (which DeBERTa-v2 does not have: a note) once; and
    the switches one at a time: absolute positions and token types, dropout off with the pooler's on, the
    position-to-content term alone without the norm, content-to-position alone with its own projection and the
    non-legacy masked-LM head, an untied decoder."""
    cases = {}
    for architecture, labels in HEADS["deberta-v2"]:
        for attention, checkpointing in (("eager", "none"), ("eager", "full")):
            layers = {"num_hidden_layers": 4} if checkpointing == "full" else {}
            cases[f"v3-{architecture}-{labels}-{checkpointing}"] = (
                _config("deberta-v2", architecture, **{**DEBERTA_V3, **layers, "num_labels": labels}),
                {"micro_batch": 2, "seq_len": 16, "attention": attention, "checkpointing": checkpointing})
    training = {"micro_batch": 2, "seq_len": 16, "attention": "eager", "checkpointing": "none"}
    cases["v3-sdpa"] = (_config("deberta-v2", "DebertaV2ForMaskedLM", **DEBERTA_V3), {**training, "attention": "sdpa"})
    cases["v2-seq-full"] = (_config("deberta-v2", "DebertaV2ForSequenceClassification", **{**DEBERTA_V2, "type_vocab_size": 2,
                                                                                           "num_labels": 3}), {**training, "checkpointing": "full"})
    cases["v3-nodrop-pooler"] = (_config("deberta-v2", "DebertaV2ForSequenceClassification", **{
        **DEBERTA_V3, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pooler_dropout": 0.1, "num_labels": 3}), training)
    cases["p2c-buckets"] = (_config("deberta-v2", "DebertaV2ForTokenClassification", **{
        **DEBERTA_V2, "relative_attention": True, "pos_att_type": ["p2c"], "position_buckets": 8, "num_labels": 4}), {**training, "seq_len": 24})
    cases["c2p-own-key"] = (_config("deberta-v2", "DebertaV2ForMaskedLM", **{
        **DEBERTA_V2, "relative_attention": True, "pos_att_type": "c2p", "legacy": False, "max_relative_positions": 20}), training)
    cases["untied"] = (_config("deberta-v2", "DebertaV2ForMaskedLM", **{**DEBERTA_V3, "tie_word_embeddings": False}), training)
    assert _compare(tmp_path, cases, notes={"v3-sdpa": ["ignored-key"]}) == {}


def test_modernbert_heads_match_the_real_model(tmp_path):
    """Every head, eager and sdpa, with and without checkpointing (global and sliding layers, a window that masks);
    and dropout everywhere (eager), mean pooling, a window longer than the sequence with biases, untied and all
    global."""
    cases = {}
    for architecture, labels in HEADS["modernbert"]:
        for attention, checkpointing in SETTINGS:
            layers = {"num_hidden_layers": 5} if checkpointing == "full" else {}
            cases[f"{architecture}-{labels}-{attention}-{checkpointing}"] = (
                _config("modernbert", architecture, **{**MODERNBERT, **layers, "num_labels": labels}),
                {"micro_batch": 2, "seq_len": 24, "attention": attention, "checkpointing": checkpointing})
    training = {"micro_batch": 2, "seq_len": 24, "attention": "sdpa", "checkpointing": "none"}
    drops = {"attention_dropout": 0.1, "mlp_dropout": 0.1, "embedding_dropout": 0.1, "classifier_dropout": 0.1, "num_labels": 3}
    cases["dropout"] = (_config("modernbert", "ModernBertForTokenClassification", **{**MODERNBERT, **drops}), {**training, "attention": "eager"})
    cases["dropout-full"] = (_config("modernbert", "ModernBertForTokenClassification", **{**MODERNBERT, **drops, "num_hidden_layers": 5}),
                             {**training, "attention": "eager", "checkpointing": "full"})
    cases["mean"] = (_config("modernbert", "ModernBertForSequenceClassification", **{
        **MODERNBERT, "classifier_pooling": "mean", "classifier_dropout": 0.1, "num_labels": 3}), training)
    cases["wide-window"] = (_config("modernbert", "ModernBertForMaskedLM", **{
        **MODERNBERT, "local_attention": 64, "norm_bias": True, "attention_bias": True, "mlp_bias": True}), training)
    cases["global-untied"] = (_config("modernbert", "ModernBertForMaskedLM", **{
        **MODERNBERT, "global_attn_every_n_layers": 1, "tie_word_embeddings": False, "decoder_bias": False}), {**training, "checkpointing": "full"})
    assert _compare(tmp_path, cases) == {}


def test_families_and_the_fallback_agree(tmp_path):
    """The family's figure and the [trace] fallback's fake-tensor step (DeBERTa-v2's sequence classifier picks its
    labelled rows with nonzero, which no fake tensor runs: its masked LM and token classifier here)."""
    cases = {}
    for model_type, base, architectures, settings in (
            ("deberta-v2", DEBERTA_V3, ("DebertaV2ForMaskedLM", "DebertaV2ForTokenClassification"), (("eager", "none"), ("eager", "full"))),
            ("modernbert", MODERNBERT, ("ModernBertForMaskedLM", "ModernBertForSequenceClassification"), (("eager", "none"), ("sdpa", "full")))):
        for architecture in architectures:
            for attention, checkpointing in settings:
                cfg = _config(model_type, architecture, **{**base, "num_hidden_layers": 6, "num_labels": 3})
                cases[f"{architecture}-{attention}-{checkpointing}"] = (cfg, {"micro_batch": 2, "seq_len": 32, "attention": attention,
                                                                              "checkpointing": checkpointing})
    assert fallback_disagreements(tmp_path, cases) == {}


def test_what_the_families_do_not_compute_goes_to_the_fallback(tmp_path):
    training = {"micro_batch": 2, "seq_len": 16, "attention": "eager"}
    cases = {"bf16": (_config("modernbert", "ModernBertForMaskedLM", **MODERNBERT), training, {"precision": "bf16-true"}),
             "lora": (_config("deberta-v2", "DebertaV2ForTokenClassification", **DEBERTA_V3), training,
                      {"lora": {"r": 8, "alpha": 16, "target_modules": ["query_proj", "value_proj"]}}),
             "long": (_config("deberta-v2", "DebertaV2ForMaskedLM", **DEBERTA_V2), {**training, "seq_len": 129}),
             "tp": (_config("modernbert", "ModernBertForMaskedLM", **MODERNBERT), training, {"parallel": {"tensor": 2}})}
    files = check_all(tmp_path, cases)
    for name, words in (("bf16", "bf16-true"), ("lora", "LoRA")):
        diagnostics = files[name]["diagnostics"]
        assert [d["code"] for d in diagnostics] == ["measured-activations"], diagnostics
        assert words in diagnostics[0]["message"] and files[name]["footprint"]["activations"] > 0
    long = files["long"]["diagnostics"]
    assert [d["code"] for d in long] == ["schema"] and "max_position_embeddings 128" in long[0]["message"]
    assert "seq_len" in (tmp_path / "long.yaml").read_text().splitlines()[long[0]["range"]["start"]["line"]]
    tp = files["tp"]["diagnostics"]
    assert [d["code"] for d in tp] == ["bad-parallel"], tp
