"""models/family_keys.py is what every family's keys give, and a check loads only the family it names (issue 21:
a family added costs nothing at start-up for configs that do not use it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_key_sets_are_every_familys_keys():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "family_keys.py"), "--check"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_of_a_config_imports_its_family_only(tmp_path):
    # the inline form, where a likely typo of a key gets a note (hf.derive)
    transformer = {"model_type": "mistral", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layer": 2}
    doc = {"memfit": 1, "device": {"memory": "80 GB"}, "optimizer": "adamw", "model": {"transformer": transformer},
           "training": {"micro_batch": 1, "seq_len": 16}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    probe = ("import runpy, sys\nsys.argv = ['memfit', 'check', '--format', 'json', sys.argv[1]]\n"
             "try:\n    runpy.run_module('memfit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('memfit.models.families.')), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run.yaml")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stderr.strip().splitlines()[-1] == "['memfit.models.families.mistral']", done.stderr
    result = json.loads(done.stdout)["files"][0]
    # the typo note still names the near key (read from the generated set, not from every family's module)
    [note] = result["diagnostics"]
    assert note["code"] == "ignored-key" and "num_hidden_layers" in note["message"]


def test_the_check_of_a_decoder_loads_no_other_familys_step(tmp_path):
    """The families with a step of their own (models/dispatch.TAILS: Whisper, DeBERTa-v2, ModernBERT) and Qwen2-VL's
    vision tower are loaded by a config of theirs only."""
    transformer = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    doc = {"memfit": 1, "device": {"memory": "80 GB"}, "optimizer": "adamw", "model": {"transformer": transformer},
           "training": {"micro_batch": 1, "seq_len": 16}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    others = ["memfit.models.whisper", "memfit.models.deberta", "memfit.models.modernbert", "memfit.models.encoders",
              "memfit.models.qwen_vl", "memfit.models.mllama"]
    probe = ("import runpy, sys\nsys.argv = ['memfit', 'check', '--format', 'json', sys.argv[1]]\n"
             "try:\n    runpy.run_module('memfit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in sys.modules if m in {others!r} or m.startswith('memfit.models.families.')), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run.yaml")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stderr.strip().splitlines()[-1] == "['memfit.models.families.llama']", done.stderr
    assert json.loads(done.stdout)["files"][0]["peak"]["bytes"] > 0


def test_every_family_is_listed_and_loads():
    from memfit.models.families import FAMILIES, SUPPORTED

    assert list(FAMILIES) == list(SUPPORTED) and len(set(SUPPORTED)) == len(SUPPORTED)
    assert [FAMILIES[name].model_type for name in SUPPORTED] == list(SUPPORTED)
    modules = sorted(p.stem for p in (ROOT / "src" / "memfit" / "models" / "families").glob("*.py") if p.stem != "__init__")
    assert modules == sorted(name.replace("-", "_") for name in SUPPORTED)   # deberta-v2: deberta_v2.py
    assert "llama4_text" in SUPPORTED  # once missing from the list error messages and the schema printed
    assert FAMILIES.get("not_a_family") is None and ["x"] not in FAMILIES
