"""`memfit check --suggest` when no single change fits: combinations of up to three remedies from the fix
table, cheapest in training speed first; applying the first one's edits gives a config that `memfit check`
passes. When nothing fits, what came closest and by how much."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_edits import apply_edits

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def _variant(tmp_path, example: str, replacements: list[tuple[str, str]]) -> Path:
    text = (EXAMPLES / example).read_text(encoding="utf-8")
    # the model file, wherever the variant is written
    text = re.sub(r"hf_config: (\S+)", lambda m: f"hf_config: {(EXAMPLES / example).parent.joinpath(m.group(1)).resolve()}", text)
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / Path(example).name
    path.write_text(text, encoding="utf-8")
    return path


CASES = {
    # one GPU: GPT-2 small as bundled
    "single-device": ("gpt2-small.yaml", []),
    # QLoRA without checkpointing at micro-batch 8
    "lora": ("llama7b-qlora.yaml", [("micro_batch: 1", "micro_batch: 8"), ("  checkpointing: full\n", "")]),
    # 4 GPUs under ZeRO-2, no offload, no checkpointing, micro-batch 4
    "parallel": (
        "parallel/llama3-8b-zero3-offload-4x4090.yaml",
        [
            ("micro_batch: 2, seq_len: 4096, attention: sdpa, checkpointing: full", "micro_batch: 4, seq_len: 4096, attention: sdpa"),
            ("  zero: 3", "  zero: 2"),
            ("  offload: {optimizer: cpu, parameters: cpu}\n", ""),
        ],
    ),
}
# The budget is searched, not written down: from the config's own figure down, the first budget at which no
# single change fits but a combination does (the figures are the pipeline's, and they may change).
SHARES = (0.9, 0.75, 0.6, 0.5, 0.4, 0.33, 0.25, 0.2, 0.15, 0.12, 0.1)


def _suggest(path: Path, budget: int) -> dict:
    done = memfit("check", "--suggest", "--format", "json", "--budget", f"{budget}B", str(path))
    (entry,) = json.loads(done.stdout)["files"]
    return entry


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_combined_fix_makes_the_config_pass(tmp_path, case):
    example, replacements = CASES[case]
    path = _variant(tmp_path, example, replacements)
    plain = json.loads(memfit("check", "--format", "json", str(path)).stdout)["files"][0]
    figure = plain["peak"]["bytes"] if plain.get("peak") else plain["footprint"]["total"]
    for share in SHARES:
        budget = int(figure * share)
        entry = _suggest(path, budget)
        if entry["fixes"] and "+" in entry["fixes"][0]["kind"]:
            break
    else:
        pytest.fail(f"{case}: no budget from {figure:,} B down to a tenth of it asks for a combination")
    fixes = entry["fixes"]
    assert all("+" in fix["kind"] and 2 <= len(fix["kind"].split("+")) <= 3 for fix in fixes)  # no single change fits
    assert len(fixes) <= 3
    first = fixes[0]
    assert first["total"] <= entry["budget"] == budget
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(apply_edits(path.read_text(encoding="utf-8"), first["edits"]), encoding="utf-8")
    after = memfit("check", "--format", "json", "--budget", f"{budget}B", str(fixed))
    assert after.returncode == 0, after.stdout
    (checked,) = json.loads(after.stdout)["files"]
    figure_after = checked["peak"]["bytes"] if checked.get("peak") else checked["footprint"]["total"]
    assert figure_after == first["total"]  # the fix says what the fixed config needs
    # each change named in the fix is in the fixed file
    text = fixed.read_text(encoding="utf-8")
    for change in first["changes"]:
        assert f"{change['key'].rsplit('.', 1)[-1]}: {change['to']}" in text or f"{change['key'].rsplit('.', 1)[-1]}:\n" in text, change
    # text output: the same fixes, announced as combinations
    text_out = memfit("check", "--suggest", "--budget", f"{budget}B", str(path)).stdout
    assert "(no single change fits: combinations):" in text_out and f"  1. {first['title']}:" in text_out


def test_when_nothing_fits_the_closest_is_named_with_how_far(tmp_path):
    done = memfit("check", "--suggest", "--format", "json", "--budget", "1GiB", "examples/gpt2-small.yaml")
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["fixes"] == []
    closest = entry["closest"]
    assert closest["over"] == closest["total"] - closest["budget"] > 0
    assert closest["budget"] == 1 << 30
    # it is better than the config as written, and no better than the cheapest single change's
    assert closest["total"] < entry["peak"]["bytes"]
    text = memfit("check", "--suggest", "--budget", "1GiB", "examples/gpt2-small.yaml").stdout
    assert "no change memfit knows of, alone or up to 3 together, makes this config fit" in text
    assert "  closest: " in text and ", over by " in text


def test_fused_optimizer_impl_is_offered_where_it_makes_a_config_fit(tmp_path):
    """Issue 19: the foreach implementation's temporaries are what pushes a run over; fused has none."""
    # Llama-3-8B full fine-tune: its peak is the optimizer step, where foreach's temporaries live
    path = _variant(tmp_path, "llama-3-8b.yaml", [])
    text = path.read_text(encoding="utf-8")
    if "optimizer_impl:" in text:
        text = re.sub(r"optimizer_impl: \w+", "optimizer_impl: foreach", text)
    else:
        text = re.sub(r"\ntraining:( *\{)?", lambda m: m.group(0) + (" optimizer_impl: foreach," if m.group(1) else "\n  optimizer_impl: foreach"), text, count=1)
    path.write_text(text, encoding="utf-8")
    foreach = json.loads(memfit("check", "--format", "json", str(path)).stdout)["files"][0]["peak"]
    fused_path = tmp_path / "fused.yaml"
    fused_path.write_text(text.replace("optimizer_impl: foreach", "optimizer_impl: fused"), encoding="utf-8")
    fused = json.loads(memfit("check", "--format", "json", str(fused_path)).stdout)["files"][0]["peak"]
    if fused["bytes"] >= foreach["bytes"]:
        pytest.fail(f"fused is not smaller than foreach here ({fused['bytes']} vs {foreach['bytes']}): the test needs a config where it is")
    budget = f"{(fused['bytes'] + foreach['bytes']) // 2}B"  # between the two: only fused fits (and cheaper fixes)
    done = memfit("check", "--suggest", "--format", "json", "--budget", budget, str(path))
    kinds = [fix["kind"] for fix in json.loads(done.stdout)["files"][0]["fixes"]]
    assert "optimizer_impl" in kinds, kinds
    assert kinds.index("optimizer_impl") == 0
