"""The timeline's module boundaries against MemTracker's module-state snapshots of a real step (CPU).

For tiny models, `memfit explain --format json` on a config file gives the warm step's events
(step 2); tests/support/timeline_measure.py runs the same step in PyTorch under MemTracker and reads the
live bytes it recorded at each module's pre-forward, post-forward, pre-backward and
post-backward. Every boundary of every decoder layer (of each Keras-form layer) and of the head
must agree within BAND. docs/report.md lists what was measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import needs

needs.module("torch")
needs.module("transformers")

import hf_measure  # noqa: E402
import keras_reference as tf  # noqa: E402
import timeline_measure as tm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BAND = 0.05
FAMILIES = ("llama", "gpt2", "mixtral")
ATS = ("pre-forward", "post-forward", "pre-backward", "post-backward")


def warm_events(tmp_path, doc: dict) -> list[dict]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", "--format", "json", str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["diagnostics"] == []
    return [e for e in entry["timeline"] if e["step"] == 2]


def compare(ours: list[dict], theirs: dict, modules) -> list[str]:
    """The boundaries of `modules` off by more than BAND (each missing one is a failure too)."""
    bad, seen = [], 0
    for e in ours:
        if e["at"] is None or e["module"] not in modules:
            continue
        seen += 1
        measured = theirs.get((e["module"], e["at"]))
        if measured is None or abs(e["bytes"] - measured) > BAND * measured:
            bad.append(f"{e['module']} {e['at']}: memfit {e['bytes']:,} B, MemTracker {measured if measured is None else f'{measured:,} B'}")
    expected = {m for m in modules}
    assert seen >= 2 * len(expected), (seen, expected)  # each module has at least its forward edges
    return bad


def largest(ours: list[dict], theirs: dict, modules) -> str:
    """The largest difference at any boundary of `modules`, signed, as docs/report.md prints it (+2.0%, −3.3%)."""
    diffs = [(e["bytes"] - theirs[(e["module"], e["at"])]) / theirs[(e["module"], e["at"])] for e in ours
             if e["at"] is not None and e["module"] in modules and (e["module"], e["at"]) in theirs]
    worst = max(diffs, key=abs)
    return f"{'+' if worst >= 0 else '−'}{abs(worst) * 100:.1f}%"


def documented(model: str, checkpointing: str, column: int) -> str:
    """docs/report.md's "Measured against PyTorch" table: the cell of the row whose model cell starts with `model`
    (a row that repeats the model above names it alone) and checkpointing; column 2 decoder layers, 3 head."""
    text = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    section = text[text.index("### Measured against PyTorch"):]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines() if line.startswith("| ")][1:]
    found = [r for r in rows if r[0].split(" (")[0].split(",")[0] == model and r[1] == checkpointing]
    assert len(found) == 1, (model, checkpointing, rows)
    return found[0][column].strip("*")


DOC_MODEL = {"llama": "Llama", "gpt2": "GPT-2", "mixtral": "Mixtral", "mlp": "Keras-form MLP", "encoder": "Keras-form encoder",
             "seed-cnn": "Keras-form seed CNN"}


def hf_run(tmp_path, family: str, checkpointing: str):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny(family))
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # transformers' own config.json of the model measured
    doc = {"memfit": 1, "optimizer": "adamw", "device": {"memory": "1 GiB"}, "model": {"hf_config": "config.json"},
           "training": {"micro_batch": 2, "seq_len": 64, "attention": "sdpa", "checkpointing": checkpointing, "optimizer_impl": "foreach"}}
    ours = warm_events(tmp_path, doc)
    theirs = tm.hf_boundaries(cfg, micro_batch=2, seq_len=64, optimizer="adamw", impl="foreach", checkpointing=checkpointing)
    return ours, theirs


def _layers(events) -> set:
    return {e["module"] for e in events if e["module"].rsplit(".", 1)[-1].isdigit()}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_layer_boundaries_match_memtracker(tmp_path, family, checkpointing):
    ours, theirs = hf_run(tmp_path, family, checkpointing)
    layers = _layers(ours)
    assert len(layers) == 2  # the tiny models' two layers
    for m in layers:
        assert {e["at"] for e in ours if e["module"] == m} >= set(ATS)
    assert compare(ours, theirs, layers) == []
    assert largest(ours, theirs, layers) == documented(DOC_MODEL[family], checkpointing, 2)  # the page, at its 0.1%


# The head: the ledger's head row keeps the loss's log-softmax output from its own forward on
# (ledger.step.hf_step appends the loss's kept tensors to the head's), which autograd creates only
# after lm_head has returned; on tiny Llama with full checkpointing that is 5.3% of lm_head's
# post-forward and pre-backward (memfit 1,318,212 B, MemTracker 1,252,244 B).
HEAD_KNOWN: dict = {}  # (family, checkpointing) -> why a head boundary is off; none now


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family,checkpointing", [pytest.param(f, c, marks=[pytest.mark.xfail(strict=True, reason=HEAD_KNOWN[f, c])] if (f, c) in HEAD_KNOWN else []) for f in FAMILIES for c in ("none", "full")])
def test_head_boundaries_match_memtracker(tmp_path, family, checkpointing):
    ours, theirs = hf_run(tmp_path, family, checkpointing)
    head = {e["module"] for e in ours if e["module"] == "lm_head" or "norm" in e["module"] or e["module"].endswith("ln_f")}
    assert "lm_head" in head and len(head) == 2  # the output layer and the final norm the head row begins with
    assert compare(ours, theirs, head) == []
    assert largest(ours, theirs, head) == documented(DOC_MODEL[family], checkpointing, 3)  # the page, at its 0.1%


KERAS = {"mlp": 8, "encoder": 8, "seed-cnn": 32}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", KERAS)
def test_keras_form_layer_boundaries_match_memtracker(tmp_path, case):
    input_shape, layers = tf.CASES[case]
    doc = {"memfit": 1, "optimizer": "adamw", "device": {"memory": "1 GiB"}, "training": {"optimizer_impl": "foreach"},
           "model": {"input_shape": input_shape, "batch_size": KERAS[case], "layers": layers}}
    ours = warm_events(tmp_path, doc)
    names = list(dict.fromkeys(e["module"] for e in ours if e["at"] == "post-forward"))
    assert len(names) == len(layers)
    theirs = tm.keras_boundaries(input_shape, layers, KERAS[case], "adamw", "foreach", names)
    assert compare(ours, theirs, set(names)) == []
    assert largest(ours, theirs, set(names)) == documented(DOC_MODEL[case], "—", 2)  # the page, at its 0.1%
