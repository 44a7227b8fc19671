"""torch.compile is not modelled: each format's compile key gets a positioned `not-modelled` warning that says the
figure is high (compiled kernels save less for backward) and by how much torchtune measured (its README: + compile
51.0 GiB vs 60.0 GiB eager), and the gated peak stays the eager one (the safe side)."""

from __future__ import annotations

import shutil

import pytest
from test_native import MODELS, figures
from test_native_partial_checkpointing import TORCHTUNE


def _compile_warning(entry: dict) -> dict:
    found = [d for d in entry["diagnostics"] if d["code"] == "not-modelled" and "torch.compile" in d["message"]]
    assert len(found) == 1, entry["diagnostics"]
    return found[0]


@pytest.mark.parametrize("fmt", ["torchtune", "hftrainer"])
def test_compile_is_warned_at_its_key_and_the_eager_figure_is_gated(fmt, tmp_path):
    if fmt == "torchtune":
        eager, compiled = tmp_path / "eager.yaml", tmp_path / "compiled.yaml"
        eager.write_text(TORCHTUNE)
        compiled.write_text(TORCHTUNE + "compile: True\n")
        line = TORCHTUNE.count("\n")  # the key's line (0-based), the last of the file
    else:
        shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
        body = '{"model_name_or_path": "./llama-3-8b.json", "output_dir": "out", "per_device_train_batch_size": 1, "bf16": true'
        eager, compiled = tmp_path / "eager.json", tmp_path / "compiled.json"
        eager.write_text(body + "}")
        compiled.write_text(body + ',\n "torch_compile": true}')
        line = 1
    a, _ = figures(eager, "--device", "H100-80GB")
    b, _ = figures(compiled, "--device", "H100-80GB")
    warning = _compile_warning(b)
    assert warning["range"]["start"]["line"] == line
    assert "the figure is high" in warning["message"] and "51.0 GiB" in warning["message"] and "60.0 GiB" in warning["message"]
    assert b["peak"] == a["peak"] and b["footprint"] == a["footprint"]
