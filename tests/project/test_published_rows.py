"""docs/accuracy.md's published rows (issue 32): each row names a config file in tests/support/published/ whose header
cites the source (repository, file and commit) and the measured figure the table prints, so a published cell cannot
drift from the file that reproduces it; memfit's cells are held by tests/project/test_docs.py (tools/doc_tables.py)."""

from __future__ import annotations

import re
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "support" / "published"


def rows() -> list[list[str]]:
    sys.path.insert(0, str(ROOT / "tools"))
    import doc_tables

    text = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    lines = text.split("\n")
    return [doc_tables.cells(line) for _, kind, _, start, end in doc_tables.found(text) if kind == "published" for line in lines[start:end]]


def test_each_published_row_is_its_config_files_measurement():
    found = rows()
    assert len(found) >= 58  # torchtune 13, transformers 9, LitGPT 12 + 9 + the hub's later 15
    named = set()
    for row in found:
        name = re.fullmatch(r"\[`([\w.-]+)`\]\(\.\./tests/support/published/\1\)", row[1])[1]
        header = (PUBLISHED / name).read_text(encoding="utf-8").split("\nmodel:")[0]
        assert re.search(r"^# [\w-]+/[\w-]+ [\w./-]+ at [0-9a-f]{40}: ", header, re.M), name  # the source and its commit
        assert f"# measured: {row[2]}\n" in header + "\n", (name, row[2])
        named.add(name)
    assert named == {p.name for p in PUBLISHED.glob("*.yaml")}  # every config is a row of the page


# The rows outside their band, each with why (docs/accuracy.md says more). The transformers BERT-large rows are held here
# too: their configs say what the 2022 step ran (torch 1.10's softmax keeping its input, transformers 4.15's fp32 mask)
# and autocast's cast cache is priced (0.954-1.021).
OPEN = {
    "torchtune-3b-1-baseline.yaml": "unpacked: alpaca's samples set the length, memfit gates the 4,096-token cap",
    # the config hub's later full fine-tunes on one A10G: each published figure is below the run's own bf16 parameters,
    # gradients and AdamW state (memfit's footprint), so what was measured is not the config as written; unknown what ran
    "litgpt-hub-llama-3.2-1B-full.yaml": "memfit 18,934,108,416 B = 2.176 x the published 8.70 GB, which is below the "
                                         "11.99 GB of bf16 parameters, gradients and AdamW state alone: what ran is unknown",
    "litgpt-hub-llama-3.2-3B-full.yaml": "memfit 40,046,539,264 B = 2.426 x the published 16.51 GB, below the 28.85 GB of "
                                         "parameters, gradients and AdamW state (above an A10G's 24 GB): what ran is unknown",
    "litgpt-hub-phi-3-full.yaml": "memfit 41,347,722,624 B = 2.431 x the published 17.01 GB, below the 30.57 GB of "
                                  "parameters, gradients and AdamW state (above an A10G's 24 GB): what ran is unknown",
}


def banded() -> list:
    out = []
    for row in rows():
        name = re.fullmatch(r"\[`([\w.-]+)`\]\(\.\./tests/support/published/\1\)", row[1])[1]
        marks = [pytest.mark.xfail(strict=True, reason=OPEN[name])] if name in OPEN else []
        # the printed ratio as the decimal it is (0.950 is within 5%; as a float, 1 - 0.95 is not <= 0.05)
        out.append(pytest.param(name, Fraction(row[5]), id=name, marks=marks))
    return out


@pytest.mark.parametrize("name, ratio", banded())
def test_published_row_is_within_its_band(name, ratio):
    """Issue 32: a row without `compile` within 5% of its measurement; a row with it (memfit gates the eager figure)
    never more than 5% below."""
    config = yaml.safe_load((PUBLISHED / name).read_text(encoding="utf-8"))
    if config.get("compile") is True:
        assert ratio >= Fraction("0.95"), ratio
    else:
        assert abs(ratio - 1) <= Fraction("0.05"), ratio


@pytest.mark.parametrize("tokens, printed", [(128, "0.996"), (768, "0.998")])
def test_the_unpacked_baseline_below_800_tokens(tmp_path, tokens, printed):
    """The figures docs/accuracy.md prints for the Baseline row (unpacked alpaca, fused AdamW) at batches of 128 and
    768 tokens: memfit's peak in the backward, 0.996 and 0.998 of the 25.5 GiB measured (the run's lengths are the
    data's and unknown, so these pin what the docs say, not a measurement; the row itself stays open)."""
    import json
    import subprocess

    text = (PUBLISHED / "torchtune-3b-1-baseline.yaml").read_text(encoding="utf-8")
    assert "  max_seq_len: 4096\n" in text and "  fused: True\n" in text
    config = tmp_path / "baseline.yaml"
    config.write_text(text.replace("  max_seq_len: 4096\n", f"  max_seq_len: {tokens}\n"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--device", "A100-80GB", str(config)],
                          capture_output=True, text=True, timeout=120, check=False)
    peak = json.loads(done.stdout)["files"][0]["peak"]
    ratio = Fraction(peak["bytes"], int(Fraction("25.5") * 2**30))
    assert peak["phase"] == "backward" and f"{float(ratio):.3f}" == printed, (peak, float(ratio))
