"""Issue 34's encoder families through the front door: RoBERTa's masked LM, sequence and token classifiers, chosen by
config.json's architectures[0] as transformers chooses. Parameters against the class transformers 5.24 builds on
the meta device; saved bytes (the peak of live saved bytes under full checkpointing) against a real CPU step's
saved_tensors_hooks (tests/support/hf_measure.py), fp32, eager and sdpa, checkpointing none and full, all through
`memfit check --format json`; the family against the `[trace]` fallback's fake-tensor step; refusals at their key."""

from __future__ import annotations

import needs
import pytest

from memfit.models import hf, hf_config

needs.module("torch")
transformers = needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import buffer_bytes, check_all, fallback_disagreements  # noqa: E402

ROBERTA = [("RobertaForMaskedLM", 2), ("RobertaForSequenceClassification", 3), ("RobertaForTokenClassification", 5),
           ("RobertaForSequenceClassification", 1)]   # one label: a regression (MSE on the pooled score)
SETTINGS = [("eager", "none"), ("sdpa", "none"), ("eager", "full"), ("sdpa", "full")]


def _cfg(architecture: str, labels: int, attention: str, checkpointing: str, **given) -> dict:
    layers = {"num_hidden_layers": 4} if checkpointing == "full" else {}
    cfg = hm.tiny("roberta", architectures=[architecture], num_labels=labels, **layers, **given)
    return hm.without_attention_dropout(cfg) if attention == "sdpa" else cfg


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("architecture, labels", ROBERTA[:3], ids=[a for a, _ in ROBERTA[:3]])
def test_roberta_parameters_are_named_parameters(architecture, labels, tie):
    import torch

    transformers.logging.set_verbosity_error()
    given = {"hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 128, "max_position_embeddings": 130, "type_vocab_size": 1, "tie_word_embeddings": tie,
             "num_labels": labels}
    config = transformers.AutoConfig.for_model("roberta", architectures=[architecture], **given)
    raw = config.to_dict()
    assert hf_config.validate(raw) == []
    cfg = hf_config.normalize(raw)
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config)
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_roberta_heads_match_the_real_model(tmp_path):
    cases = {}
    for architecture, labels in ROBERTA:
        for attention, checkpointing in SETTINGS:
            cfg = _cfg(architecture, labels, attention, checkpointing)
            cases[f"{architecture}-{labels}-{attention}-{checkpointing}"] = (
                cfg, {"micro_batch": 2, "seq_len": 16, "attention": attention, "checkpointing": checkpointing})
    files = check_all(tmp_path, cases)
    wrong = {}
    for name, (cfg, training) in cases.items():
        entry = files[name]
        assert entry["diagnostics"] == [], entry["diagnostics"]
        model = hm.build(cfg, training["attention"])
        assert entry["footprint"]["parameters"] == 4 * sum(p.numel() for p in model.parameters()) + buffer_bytes(model)
        full = training["checkpointing"] == "full"
        measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=training["attention"],
                              checkpointing=training["checkpointing"], model=model)
        real = measured["peak" if full else "total"]
        if abs(entry["footprint"]["activations"] - real) > (0.10 if full else 0.05) * real:
            wrong[name] = (entry["footprint"]["activations"], real)
    assert wrong == {}


def test_roberta_classifier_without_dropout_and_with_lora(tmp_path):
    """classifier_dropout 0: the classifier's dense keeps the last hidden state's storage (a view of the first token);
    LoRA on every linear (the classifier's too: it is not the output embedding) and on the masked LM's q/v."""
    lora_all = {"r": 8, "alpha": 16, "target_modules": "all-linear"}
    cases = {
        "nodrop": (hm.tiny("roberta", architectures=["RobertaForSequenceClassification"], num_labels=3,
                           classifier_dropout=0.0), None),
        "lora-seq": (hm.tiny("roberta", architectures=["RobertaForSequenceClassification"], num_labels=3), lora_all),
        "lora-mlm": (hm.tiny("roberta", architectures=["RobertaForMaskedLM"]), lora_all),
    }
    training = {"micro_batch": 2, "seq_len": 16, "attention": "eager"}
    files = check_all(tmp_path, {name: (cfg, training, {"lora": lora} if lora else {}) for name, (cfg, lora) in cases.items()})
    for name, (cfg, lora) in cases.items():
        entry = files[name]
        assert entry["diagnostics"] == [], entry["diagnostics"]
        model = hm.build(cfg, "eager", lora=lora)
        assert entry["footprint"]["gradients"] == 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        real = hm.measure(cfg, micro_batch=2, seq_len=16, attention="eager", lora=lora, model=model)["total"]
        assert abs(entry["footprint"]["activations"] - real) <= 0.05 * real, (name, entry["footprint"]["activations"], real)


def test_roberta_family_and_the_fallback_agree(tmp_path):
    cases = {}
    for architecture, labels in ROBERTA[:3]:
        for attention, checkpointing in (("eager", "none"), ("sdpa", "full")):
            cfg = hm.tiny("roberta", architectures=[architecture], num_labels=labels, num_hidden_layers=6)
            if attention == "sdpa":
                cfg = hm.without_attention_dropout(cfg)
            cases[f"{architecture}-{attention}"] = (cfg, {"micro_batch": 2, "seq_len": 32, "attention": attention,
                                                          "checkpointing": checkpointing})
    assert fallback_disagreements(tmp_path, cases) == {}


def test_roberta_as_a_decoder_is_refused_at_its_key(tmp_path):
    dec = hm.tiny("roberta", is_decoder=True)
    causal = hm.tiny("roberta", architectures=["RobertaForCausalLM"])
    files = check_all(tmp_path, {"dec": (dec, {"micro_batch": 2, "seq_len": 16}),
                                  "causal": (causal, {"micro_batch": 2, "seq_len": 16})})
    for name, key, words in (("dec", '"is_decoder"', "is_decoder"), ("causal", '"RobertaForCausalLM"', "RobertaForMaskedLM")):
        diagnostics = files[name]["diagnostics"]
        assert [d["code"] for d in diagnostics] == ["unsupported-model"], diagnostics
        assert words in diagnostics[0]["message"] and diagnostics[0]["file"].endswith(f"{name}.json")
        lines = (tmp_path / f"{name}.json").read_text().splitlines()
        assert key in lines[diagnostics[0]["range"]["start"]["line"]]
