"""The benchmark is part of the project: its configs are valid and deterministic, and the
documented command runs end to end (tiny sizes here) against the real check-jsonschema."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memfit.check.pipeline import check

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("memfit_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


def test_configs_are_deterministic_and_have_the_asked_number_of_tensors():
    assert bench.config_text(75) == bench.config_text(75)
    assert bench.config_text(75, seed=1) != bench.config_text(75, seed=2)
    data = yaml.safe_load(bench.config_text(75))
    assert len(data["parameters"]) + len(data["activations"]) == 75


def test_configs_mix_the_styles_people_write_and_are_schema_valid():
    text = bench.config_text(300)
    data = yaml.safe_load(text)
    items = data["parameters"] + data["activations"]
    assert any(isinstance(i, list) for i in items) and any(isinstance(i, dict) for i in items)
    assert {len(i if isinstance(i, list) else i["shape"]) for i in items} == {2, 3, 4}
    assert any("dtype" in i for i in items if isinstance(i, dict)) and any("count" in i for i in items if isinstance(i, dict))
    assert any("trainable" in i for i in data["parameters"] if isinstance(i, dict))
    assert "  - {name:" in text and "\n    shape: [" in text  # flow and block mappings
    result = check(text)
    assert result.footprint is not None
    assert {d.code for d in result.diagnostics} <= {"budget-exceeded", "near-budget"}


@pytest.mark.slow
def test_the_benchmark_command_runs_and_writes_its_table(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--configs", "3", "--sizes", "50,100,150", "--runs", "1", "--silent", "--json", str(out)],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [row["key"] for row in report["rows"]] == ["floor", "cold", "hf70b", "fit70b", "suggest70b", "check70bh100", "gpus70b", "native70b", "converted70b", "many", "tensors-50", "tensors-100", "tensors-150", "explain"]
    for row in report["rows"]:
        assert row["memfit"]["seconds"] > 0 and row["memfit"]["peak_bytes"] > 0
        if row["key"] not in ("floor", "explain", "fit70b", "suggest70b", "check70bh100", "gpus70b", "native70b", "converted70b"):
            assert row["competitor"]["seconds"] > 0 and row["time_ratio"] > 0
    assert len(report["targets"]) == 11 and all(isinstance(t["met"], bool) for t in report["targets"])
    assert report["machine"]["nproc"] >= 1 and report["machine"]["python"]
    assert "| 1 config (75 tensors), cold |" in done.stdout and "| target | measured | met |" in done.stdout
