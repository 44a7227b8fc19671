"""Issue 34's classification heads through the front door: a config.json whose architectures[0] names a sequence or
token classifier (BERT's classifier, TRL's reward models, NER), checked by `memfit check --format json` against the
real transformers class (parameters on the meta device, saved bytes in a real CPU step), and the refusals positioned
at the key."""

from __future__ import annotations

import json
import subprocess
import sys

import needs
import pytest
import yaml

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import meta_buffer_bytes, meta_elements, run_check  # noqa: E402

# (architecture, model_type, num_labels): a BERT classifier and tagger, reward models (one label: MSE on the pooled
# score), a decoder tagger, and the families whose heads are spelled differently (GPT-2, Falcon: `classifier`)
HEADS = [
    ("BertForSequenceClassification", "bert", 3),
    ("BertForTokenClassification", "bert", 5),
    ("LlamaForSequenceClassification", "llama", 1),
    ("Qwen3ForSequenceClassification", "qwen3", 1),
    ("LlamaForTokenClassification", "llama", 3),
    ("GPT2ForTokenClassification", "gpt2", 3),
    ("FalconForSequenceClassification", "falcon", 2),
    ("MixtralForSequenceClassification", "mixtral", 2),
]


@pytest.mark.parametrize("attention, checkpointing", [("eager", "none"), ("sdpa", "full")])
@pytest.mark.parametrize("architecture, model_type, labels", HEADS, ids=[h[0] for h in HEADS])
def test_a_classifier_matches_the_real_model(architecture, model_type, labels, attention, checkpointing, tmp_path):
    layers = {"num_hidden_layers": 4} if checkpointing == "full" else {}
    if model_type == "gpt2" and layers:
        layers = {"n_layer": 4}
    cfg = hm.tiny(model_type, architectures=[architecture], num_labels=labels, pad_token_id=0, **layers)
    if attention == "sdpa":
        cfg = hm.without_attention_dropout(cfg)
    result = run_check(tmp_path, cfg, attention=attention, checkpointing=checkpointing)
    elements = meta_elements(cfg)
    assert result["footprint"]["parameters"] == 4 * elements + meta_buffer_bytes(cfg)
    measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=attention, checkpointing=checkpointing)
    real = measured["peak"] if checkpointing == "full" else measured["total"]
    band = 0.10 if checkpointing == "full" else 0.05
    assert abs(result["footprint"]["activations"] - real) <= band * real, (result["footprint"]["activations"], real)


def test_a_reward_model_in_bf16_mixed_matches_the_real_model(tmp_path):
    cfg = hm.tiny("qwen3", architectures=["Qwen3ForSequenceClassification"], num_labels=1, pad_token_id=0)
    result = run_check(tmp_path, cfg, precision="bf16-mixed")
    real = hm.measure(cfg, micro_batch=2, seq_len=16, precision="bf16-mixed")["total"]
    assert abs(result["footprint"]["activations"] - real) <= 0.05 * real, (result["footprint"]["activations"], real)


def _check(tmp_path, cfg: dict, micro_batch: int = 2) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    doc = {"memfit": 1, "device": {"memory": "80 GB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "training": {"micro_batch": micro_batch, "seq_len": 16}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "train.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout)["files"][0]


def test_a_decoder_classifier_without_a_pad_token_is_refused_above_one_sequence_at_architectures(tmp_path):
    cfg = hm.tiny("llama", architectures=["LlamaForSequenceClassification"], num_labels=1)
    assert cfg.get("pad_token_id") is None
    refused = _check(tmp_path, cfg)["diagnostics"]
    assert [d["code"] for d in refused] == ["unsupported-model"]
    assert "pad_token_id" in refused[0]["message"] and refused[0]["file"].endswith("config.json")
    lines = (tmp_path / "config.json").read_text().splitlines()
    assert '"LlamaForSequenceClassification"' in lines[refused[0]["range"]["start"]["line"]]   # architectures[0]
    assert _check(tmp_path, cfg, micro_batch=1)["diagnostics"] == []   # one sequence: its last token


def test_a_head_memfit_does_not_model_names_the_ones_it_does(tmp_path):
    cfg = hm.tiny("bert", architectures=["BertLMHeadModel"])
    refused = _check(tmp_path, cfg)["diagnostics"]
    assert [d["code"] for d in refused] == ["unsupported-model"]
    assert "BertForSequenceClassification" in refused[0]["message"] and "BertForTokenClassification" in refused[0]["message"]


@pytest.mark.parametrize("architecture, model_type, labels", [("LlamaForSequenceClassification", "llama", 1),
                                                              ("BertForSequenceClassification", "bert", 3),
                                                              ("LlamaForTokenClassification", "llama", 3)])
def test_lora_on_a_classifier_matches_the_real_model(architecture, model_type, labels, tmp_path):
    # peft's all-linear adapts the classifier (and BERT's pooler) too: it is not the output embedding
    lora = {"r": 8, "alpha": 16, "target_modules": "all-linear"}
    cfg = hm.tiny(model_type, architectures=[architecture], num_labels=labels, pad_token_id=0)
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "optimizer": "adamw", "lora": lora,
           "model": {"hf_config": "config.json"}, "training": {"micro_batch": 2, "seq_len": 16, "attention": "eager"}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "train.yaml")],
                          capture_output=True, text=True, timeout=300, check=False)
    entry = json.loads(done.stdout)["files"][0]
    assert entry["diagnostics"] == []
    model = hm.build(cfg, "eager", lora=lora)
    assert entry["footprint"]["gradients"] == 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    real = hm.measure(cfg, micro_batch=2, seq_len=16, attention="eager", lora=lora, model=model)["total"]
    assert abs(entry["footprint"]["activations"] - real) <= 0.05 * real, (entry["footprint"]["activations"], real)
