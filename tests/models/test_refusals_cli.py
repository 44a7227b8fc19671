"""Every architecture memfit refuses says why and what to do, at the key (issue 34): config.json files a user could
write, each with one thing memfit does not model, checked by one `memfit check --format json` run; each refusal is
`unsupported-model` in that config.json, on the line of the key that decides it, and its message names the way out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

_DENSE = {"hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
LLAMA = {"model_type": "llama", **_DENSE}
# name -> (config.json, micro_batch, the line's text the refusal sits on, what the message tells the user to do)
CASES = {
    "head-not-in-family": ({"model_type": "bert", **_DENSE, "architectures": ["BertForQuestionAnswering"]}, 2,
                           '"BertForQuestionAnswering"', "name one of them in architectures[0]"),
    "head-not-modeled": ({"model_type": "roberta", **_DENSE, "architectures": ["RobertaForCausalLM"]}, 2,
                         '"RobertaForCausalLM"', "name one of them in architectures[0]"),
    "encoder-as-decoder": ({"model_type": "roberta", **_DENSE, "is_decoder": True}, 2, '"is_decoder"',
                           "set is_decoder to false"),
    "cross-attention": ({**LLAMA, "add_cross_attention": True}, 2, '"add_cross_attention"',
                        "set add_cross_attention to false"),
    "activation": ({**LLAMA, "hidden_act": "swiglu-deluxe"}, 2, '"hidden_act"', "give one of these names"),
    "t5-activation": ({"model_type": "t5", "d_model": 64, "d_ff": 112, "num_layers": 2, "num_heads": 4,
                       "feed_forward_proj": "gated-swish2"}, 2, '"feed_forward_proj"', "gated-"),
    "gpt-oss-no-window": ({"model_type": "gpt_oss", **_DENSE, "num_key_value_heads": 2, "head_dim": 16,
                           "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
                           "layer_types": ["full_attention", "full_attention"]}, 2, '"sliding_window"',
                          "set sliding_window"),
    "falcon-layout": ({"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "vocab_size": 128, "new_decoder_architecture": True, "parallel_attn": False}, 2,
                      '"parallel_attn"', "set parallel_attn to true"),
    "reward-without-pad": ({**LLAMA, "architectures": ["LlamaForSequenceClassification"], "num_labels": 1}, 2,
                           '"LlamaForSequenceClassification"', "set pad_token_id"),
    "llava-text-model": ({"model_type": "llava", "text_config": {"model_type": "mistral", **_DENSE}}, 1,
                         '"model_type": "mistral"', "give a text_config"),
}


def test_each_refusal_says_why_and_what_to_do_at_its_key(tmp_path):
    paths = []
    for name, (cfg, micro_batch, _, _) in CASES.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg, indent=2))
        doc = {"memfit": 1, "device": {"memory": "80 GB"}, "optimizer": "adamw", "model": {"hf_config": f"{name}.json"},
               "training": {"micro_batch": micro_batch, "seq_len": 16}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(str(tmp_path / f"{name}.yaml"))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *paths], capture_output=True,
                          text=True, timeout=300, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout[-2000:]
    files = {Path(f["path"]).stem: f for f in json.loads(done.stdout)["files"]}
    wrong = {}
    for name, (_, _, line_text, remedy) in CASES.items():
        diagnostics = files[name]["diagnostics"]
        if [d["code"] for d in diagnostics] != ["unsupported-model"]:
            wrong[name] = [(d["code"], d["message"][:200]) for d in diagnostics]
            continue
        d = diagnostics[0]
        lines = (tmp_path / f"{name}.json").read_text().splitlines()
        at = lines[d["range"]["start"]["line"]] if d.get("file", "").endswith(f"{name}.json") else None
        if at is None or line_text not in at or remedy not in d["message"]:
            wrong[name] = (d.get("file"), at, d["message"][:400])
    assert wrong == {}


def test_a_precision_the_activation_rules_do_not_cover_is_an_error_at_its_key(tmp_path):
    """`precision: 64-true` on a transformer model (in a memfit config and in a LitGPT yaml): the per-tensor rules
    cover 32- and 16-bit models only (a tiny Llama in float64, 4 x 128 tokens, peaks at 14,313,692 B under
    MemTracker where the rules with float64 for their 32-bit dtype said 8,988,228), so the check fails at `precision` (unsupported-model) with no footprint,
    and neither `check` nor `convert` shows a traceback (it was an internal error)."""
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA, indent=2))
    doc = {"memfit": 1, "device": {"memory": "80 GB"}, "optimizer": "adamw", "precision": "64-true",
           "model": {"hf_config": "llama.json"}, "training": {"micro_batch": 2, "seq_len": 16}}
    text = yaml.safe_dump(doc, sort_keys=False)
    (tmp_path / "run.yaml").write_text(text)
    litgpt = Path(__file__).resolve().parents[1] / "support" / "litgpt-hub" / "tiny-llama-lora.yaml"
    native = "\n".join("precision: 64-true" if line.startswith("precision:") else line
                       for line in litgpt.read_text(encoding="utf-8").splitlines()) + "\n"
    (tmp_path / "lora.yaml").write_text(native)
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml"),
                           str(tmp_path / "lora.yaml")], capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout[-2000:]
    for entry, source in zip(json.loads(done.stdout)["files"], (text, native)):
        errors = [d for d in entry["diagnostics"] if d["severity"] == "error"]
        assert [d["code"] for d in errors] == ["unsupported-model"], errors
        assert entry.get("footprint") is None, entry["footprint"]   # no figure, not a zero one
        line = source.splitlines()[errors[0]["range"]["start"]["line"]]
        assert line.startswith("precision:") and "64-true" in errors[0]["message"], (line, errors[0]["message"])
    converted = subprocess.run([sys.executable, "-m", "memfit", "convert", str(tmp_path / "lora.yaml")],
                               capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in converted.stderr and converted.returncode in (0, 1), converted.stderr
