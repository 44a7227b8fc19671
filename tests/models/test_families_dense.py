"""Issue 21's dense decoders through the front door: `memfit check --format json` on a config.json and a memfit
config a user could write, against the real transformers model (parameters on the meta device, saved bytes in a
real CPU step), the bundled examples, and docs/transformers.md's family table kept in step with the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

from memfit.models import families, hf_activations

needs.module("torch")
needs.module("transformers")

import hf_measure as hm  # noqa: E402
from family_check import meta_buffer_bytes, meta_elements, run_check  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NEW = [f for f in ("gemma2", "gemma3_text", "olmo2", "granite", "cohere", "starcoder2", "falcon", "smollm3") if f in hm.TINY]




@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("family", NEW)
def test_check_matches_the_real_model(family, attention, checkpointing, tmp_path):
    cfg = hm.tiny(family, num_hidden_layers=4) if checkpointing == "full" else hm.tiny(family)
    if attention == "sdpa":
        cfg = hm.without_attention_dropout(cfg)
    result = run_check(tmp_path, cfg, attention=attention, checkpointing=checkpointing)
    elements = meta_elements(cfg)
    footprint = result["footprint"]
    assert footprint["parameters"] == 4 * elements + meta_buffer_bytes(cfg)  # (the buffers are parameters too)
    assert footprint["gradients"] == 4 * elements and footprint["optimizer_state"] == 8 * elements
    measured = hm.measure(cfg, micro_batch=2, seq_len=16, attention=attention, checkpointing=checkpointing)
    real = measured["peak"] if checkpointing == "full" else measured["total"]
    assert abs(footprint["activations"] - real) <= 0.05 * real, (footprint["activations"], real)


EXAMPLES = sorted((ROOT / "examples" / "families").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_fit_and_their_parameters_are_the_real_models(example, tmp_path):
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(example)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["files"][0]["diagnostics"] == []
    # the example's config.json, fully fine-tuned in fp32: 4 bytes per parameter of the real model
    reference = (example.parent / yaml.safe_load(example.read_text())["model"]["hf_config"]).resolve()
    cfg = json.loads(reference.read_text())
    # (a vision-language model's sequence holds its image's tokens: LLaVA-1.5's 576, Qwen-VL's largest image 1,225)
    # (DeepSeek-V3's 671B in fp32 with AdamW needs 10.7 TB: a budget no device has, so that the check passes)
    result = run_check(tmp_path, cfg, memory="64 TiB", micro_batch=1, seq_len={"llava": 1024, "qwen2_vl": 2048, "qwen2_5_vl": 2048}.get(cfg["model_type"], 8))
    assert result["footprint"]["parameters"] == 4 * meta_elements(cfg) + meta_buffer_bytes(cfg)


def family_table() -> list[list[str]]:
    text = (ROOT / "docs" / "transformers.md").read_text(encoding="utf-8")
    body = text.split("<!-- family-table:begin -->")[1].split("<!-- family-table:end -->")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body.strip().splitlines()]
    return rows[2:]


def test_the_family_table_follows_the_code():
    import transformers

    rows = family_table()
    names = [row[0].strip("`") for row in rows]
    assert sorted(names) == sorted(families.FAMILIES)
    # (Whisper's, DeBERTa-v2's and ModernBERT's saved tensors are their own modules': models/whisper.py, deberta.py, modernbert.py)
    assert sorted(hf_activations.FAMILIES) == sorted(set(families.FAMILIES) - {"whisper", "deberta-v2", "modernbert"})
    package = Path(transformers.__file__).parent
    for name, exact, ratio, source in rows:
        family = families.FAMILIES[name.strip("`")]
        path = package / source.strip("`")
        assert path.is_file(), source
        assert f"class {family.default_architecture}(" in path.read_text(encoding="utf-8"), (name, source)
        assert exact.startswith("parameters")
        low, high = (float(x) for x in re.fullmatch(r"(\d\.\d+)–(\d\.\d+)", ratio).groups())
        assert 0.95 <= low <= high <= 1.05, ratio
