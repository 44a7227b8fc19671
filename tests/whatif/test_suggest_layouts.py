"""`--suggest` and the editor's quick fixes never offer an edit that breaks the YAML (issue 23):
across generated layouts of one over-budget config (block or flow mappings, trailing commas,
multi-line flow mappings with comments, merge keys, anchors), every offered edit is applied to
the text, the result re-parsed, and it must be exactly the config with the fix's changes made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.check.pipeline import check
from memfit.read import source
from memfit.whatif.fixes import apply, apply_edits, fixes

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "gpt2.json"
DTYPES = {"parameters": "bfloat16", "gradients": "bfloat16", "activations": "bfloat16", "optimizer_state": "float32"}
TRAINING = {"micro_batch": 8, "seq_len": 1024, "attention": "eager"}


def mapping(key: str, items: dict, style: str, anchor: str = "") -> str:
    """`key:` and its items in one of the layouts users write."""
    head = f"{key}: {anchor + ' ' if anchor else ''}"
    pairs = [f"{k}: {v}" for k, v in items.items()]
    if style == "block":
        return head.rstrip() + "\n" + "".join(f"  {p}\n" for p in pairs)
    if style == "flow":
        return head + "{" + ", ".join(pairs) + "}\n"
    if style == "flow-trailing-comma":
        return head + "{" + ", ".join(pairs) + ", }\n"
    if style == "flow-multiline":
        return head + "{\n" + "".join(f"  {p},  # {k}\n" for p, k in zip(pairs, items)) + "}\n"
    raise AssertionError(style)


STYLES = st.sampled_from(["block", "flow", "flow-trailing-comma", "flow-multiline"])


@st.composite
def layouts(draw) -> tuple[str, bool]:
    """(the config's text, whether the training keys are reached through a merge key)."""
    dtypes_style, training_style = draw(STYLES), draw(STYLES)
    merge = draw(st.sampled_from(["none", "flow-merge", "block-merge"]))
    order = draw(st.permutations(["dtypes", "training", "model"]))
    parts = {
        "dtypes": mapping("dtypes", DTYPES, dtypes_style, "&dt" if draw(st.booleans()) else ""),
        "model": f"model: {{hf_config: {json.dumps(str(MODEL))}}}\n",
    }
    if merge == "none":
        parts["training"] = mapping("training", TRAINING, training_style, "&tr" if draw(st.booleans()) else "")
    elif merge == "flow-merge":
        parts["training"] = "training: {<<: {micro_batch: 8, seq_len: 1024}, attention: eager}\n"
    else:
        parts["training"] = "training:\n  <<: {micro_batch: 8, seq_len: 1024}\n  attention: eager\n"
    optimizer = draw(st.sampled_from(["optimizer: adamw\n", "optimizer: &opt adamw\n", "optimizer: 'adamw'\n"]))
    text = "memfit: 1\ndevice: {memory: 12 GiB}\n" + optimizer + "".join(parts[k] for k in order)
    return text, merge != "none"


def _assert_edits_keep_the_yaml(text: str, path: str, through_merge: bool) -> int:
    result = check(text, path)
    if result.data is None or result.config is None:
        return 0  # a layout memfit refuses (e.g. an unknown top-level key): nothing to edit
    offered = fixes(result, text)
    assert offered, [d.code for d in result.diagnostics]
    for fix in offered:
        if not fix.edits:
            assert through_merge, (fix.title, text)  # only a value reached through an alias may go without an edit
            continue
        edited = apply_edits(text, fix.edits)
        loaded = source.load(edited)
        assert loaded.diagnostics == [] and loaded.data == apply(result.data, fix.changes), (fix.title, text, edited)
        again = check(edited, path)
        assert not [d for d in again.diagnostics if d.code in ("yaml-syntax", "duplicate-key", "schema", "internal")], (edited, again.diagnostics)
    return len(offered)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(layouts())
def test_every_offered_edit_reparses_to_the_changed_config(tmp_path, layout):
    text, through_merge = layout
    _assert_edits_keep_the_yaml(text, str(tmp_path / "run.yaml"), through_merge)


def test_the_layouts_that_broke(tmp_path):
    """Regression cases: a flow mapping's trailing comma (`{a: 1, , b: 2}` was written), a multi-line flow
    mapping ending in a comment, and a key supplied by a merge key (its whole mapping was overwritten)."""
    model = f"model: {{hf_config: {json.dumps(str(MODEL))}}}\n"
    head = "memfit: 1\ndevice: {memory: 12 GiB}\noptimizer: adamw\n" + mapping("dtypes", DTYPES, "block")
    for training in (
        mapping("training", TRAINING, "flow-trailing-comma"),
        mapping("training", TRAINING, "flow-multiline"),
        "training: {<<: {micro_batch: 8, seq_len: 1024}, attention: eager}\n",
    ):
        assert _assert_edits_keep_the_yaml(head + model + training, str(tmp_path / "run.yaml"), False) >= 2


def test_suggest_on_the_command_line_offers_edits_that_apply(tmp_path):
    path = tmp_path / "run.yaml"
    text = "memfit: 1\ndevice: {memory: 12 GiB}\noptimizer: adamw\n" + mapping("dtypes", DTYPES, "flow-trailing-comma")
    text += f"model: {{hf_config: {json.dumps(str(MODEL))}}}\n" + mapping("training", TRAINING, "flow-trailing-comma")
    path.write_text(text, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--suggest", "--format", "json", str(path)], capture_output=True, text=True, check=False)
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["fixes"]
    for fix in entry["fixes"]:
        from memfit.diagnostics.diagnostic import Range
        from memfit.whatif.fixes import Edit

        found = [Edit(Range(e["range"]["start"]["line"], e["range"]["start"]["character"], e["range"]["end"]["line"], e["range"]["end"]["character"]), e["new_text"]) for e in fix["edits"]]
        assert found
        path.write_text(apply_edits(text, found), encoding="utf-8")
        again = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, check=False)
        codes = [d["code"] for d in json.loads(again.stdout)["files"][0]["diagnostics"]]
        assert again.returncode == 0 and codes in ([], ["near-budget"]), (fix["title"], codes)
