"""`memfit check --suggest` on a memfit config written as JSON: every edit it offers keeps the file JSON (YAML reads
a superset, so an edit that YAML accepts may be no JSON: `{"a": 1, b: 2}`): inserted keys quoted, values as JSON.
Before, a JSON config got YAML-only edits, or none with a reason naming an alias the file did not have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lsp_edits import apply_edits

ROOT = Path(__file__).resolve().parents[2]

CONFIG = {
    "memfit": 1,
    "device": {"memory": "14 GiB"},
    "model": {"transformer": {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8,
                              "num_attention_heads": 16, "vocab_size": 32000}},
    "optimizer": "adamw",
    "training": {"micro_batch": 16, "seq_len": 1024, "checkpointing": "none"},
}


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_every_edit_of_a_json_config_keeps_it_json(tmp_path):
    seen = 0
    for indent in (None, 2):
        path = tmp_path / f"run-{indent}.json"
        text = json.dumps(CONFIG, indent=indent) + "\n"
        path.write_text(text, encoding="utf-8")
        done = memfit("check", "--suggest", "--format", "json", str(path))
        assert done.returncode == 1, done.stderr
        fixes = json.loads(done.stdout)["files"][0]["fixes"]
        assert fixes, done.stdout
        for fix in fixes:
            assert fix["edits"], fix  # a JSON file's keys are all written in it: every change has its edit
            edited = json.loads(apply_edits(text, fix["edits"]))  # raises if the edit broke the JSON
            for change in fix["changes"]:
                node = edited
                for part in change["key"].split("."):
                    node = node[part]
                assert node == change["to"], (fix["title"], change)
            seen += 1
        assert any("gradient_accumulation" in json.dumps(fix["edits"]) for fix in fixes)  # an inserted key, quoted
    assert seen >= 2

