"""`checkpointing: selective` with a fused attention kernel (issue 22): selective recomputation drops the
attention core's s x s matrices, which only eager attention saves, so with sdpa or flash it changes
nothing. `memfit check` says so at the value, with the peak `checkpointing: full` would give; with eager
attention, where selective does lower the figures, it says nothing. Everything through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TINY = (
    "{model_type: llama, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
    "num_key_value_heads: 4, vocab_size: 256, max_position_embeddings: 512}"
)


def config(attention: str, checkpointing: str, parallel: str = "") -> str:
    return f"""memfit: 1
name: tiny-{attention}-{checkpointing}
optimizer: adamw
device: {{memory: 1 GiB}}
dtypes: {{parameters: bfloat16, gradients: bfloat16, activations: bfloat16, optimizer_state: float32}}
model:
  transformer: {TINY}
training:
  micro_batch: 2
  seq_len: 256
  attention: {attention}
  checkpointing: {checkpointing}
{parallel}"""


def check(tmp_path: Path, text: str, name: str) -> tuple[int, dict]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    (entry,) = json.loads(done.stdout)["files"]
    return done.returncode, entry


def notes(entry: dict) -> list[dict]:
    return [d for d in entry["diagnostics"] if d["code"] == "selective-noop"]


@pytest.mark.parametrize("attention", ["sdpa", "flash"])
def test_selective_with_a_fused_kernel_is_named_at_the_value_with_what_full_gives(tmp_path, attention):
    from memfit.diagnostics.units import human

    text = config(attention, "selective")
    rc, selective = check(tmp_path, text, "selective")
    assert rc == 0  # a note: the config still passes
    (note,) = notes(selective)
    assert note["severity"] == "information"
    # at the value of training.checkpointing: line 13 (0-based 12), after "  checkpointing: "
    line = text.splitlines().index("  checkpointing: selective")
    assert note["range"]["start"] == {"line": line, "character": len("  checkpointing: ")}
    assert note["range"]["end"] == {"line": line, "character": len("  checkpointing: selective")}
    assert attention in note["message"] and "checkpointing: full" in note["message"]

    # it changes nothing: the figures are those of checkpointing: none, byte for byte
    _, none = check(tmp_path, config(attention, "none"), "none")
    assert selective["peak"] == none["peak"] and selective["footprint"] == none["footprint"]
    assert not notes(none)

    # and the figure it gives for full is what `memfit check` says of the config with full
    _, full = check(tmp_path, config(attention, "full"), "full")
    assert not notes(full)
    now, then = selective["peak"]["bytes"], full["peak"]["bytes"]
    assert then < now
    assert note["message"].endswith(f": peak {human(then)} instead of {human(now)}, {human(now - then)} lower"), note["message"]


def test_no_note_where_selective_lowers_the_figures_eager(tmp_path):
    _, selective = check(tmp_path, config("eager", "selective"), "selective")
    _, none = check(tmp_path, config("eager", "none"), "none")
    assert not notes(selective)
    # selective does drop eager attention's s x s matrices here
    assert selective["footprint"]["activations"] < none["footprint"]["activations"]
    assert selective["peak"]["bytes"] < none["peak"]["bytes"]


def test_the_note_under_data_parallelism_and_its_text_line(tmp_path):
    """On data-parallel ranks each rank keeps the model's own rows: the same note, and the text form names
    the file, line and column."""
    text = config("sdpa", "selective", "parallel: {data: 2, zero: 2}\n")
    rc, entry = check(tmp_path, text, "zero2")
    assert rc == 0 and len(notes(entry)) == 1
    path = tmp_path / "zero2.yaml"
    done = subprocess.run([sys.executable, "-m", "memfit", "check", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    line = text.splitlines().index("  checkpointing: selective") + 1
    assert f"{path}:{line}:{len('  checkpointing: ') + 1}: information[selective-noop]" in done.stdout, done.stdout
