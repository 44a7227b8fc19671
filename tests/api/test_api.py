"""memfit's Python API against the command line it mirrors: `check_file` and `check_config` give what `memfit check`
gives for the same file and flags (to_json() is its json entry, the diagnostics its text lines), DoesNotFit prints
what the CLI prints, bad settings are refused as the CLI refuses its flags, and `import memfit` pays for none of it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import memfit

ROOT = Path(__file__).resolve().parents[2]
OVER = ROOT / "examples" / "over-budget" / "gpt2-medium-on-t4.yaml"
NATIVE = ROOT / "examples" / "native" / "axolotl-llama3-8b-qlora.yml"


def cli(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "memfit", *args], capture_output=True, text=True, timeout=300, check=False, cwd=cwd, env=env)


def entries(*args) -> list[dict]:
    return json.loads(cli("check", "--format", "json", *args).stdout)["files"]


@pytest.mark.parametrize("path", ["examples/gpt2-small.yaml", "examples/over-budget/gpt2-medium-on-t4.yaml", "examples/parallel/llama3-70b-fsdp-8xh100.yaml", "examples/atari-cnn.yaml"])
def test_check_file_is_the_cli_s_json_entry(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = memfit.check_file(path)
    (entry,) = entries(path)
    assert result.to_json() == entry
    assert result.footprint == entry["footprint"] and result.budget == entry["budget"]
    assert result.peak == (entry["peak"]["bytes"] if "peak" in entry else None)
    assert result.fits == (not any(d["severity"] == "error" for d in entry["diagnostics"]))
    # 1-based line and column, as the text output prints them
    text = cli("check", path).stdout
    for d in result.diagnostics:
        assert f"{path}:{d.line}:{d.column}: {d.severity}[{d.code}] {d.message}" in text


def test_settings_are_the_cli_s_flags(monkeypatch):
    monkeypatch.chdir(ROOT)
    path = str(NATIVE.relative_to(ROOT))
    result = memfit.check_file(path, device="RTX-4090", gpus=1, warn_at="50%")
    (entry,) = entries(path, "--device", "RTX-4090", "--gpus", "1", "--warn-at", "50%")
    assert result.to_json() == entry and result.input_format == "axolotl"
    small = memfit.check_file(path, budget="10 GB")
    (entry,) = entries(path, "--budget", "10GB")
    assert small.to_json() == entry and small.budget == 10**10 and not small.fits
    assert memfit.check_file(path, budget=10**10).to_json() == entry  # an int of bytes, as --budget 10000000000


def test_check_config_checks_a_mapping_as_the_file_it_came_from():
    native = memfit.check_file(NATIVE)
    data = yaml.safe_load(NATIVE.read_text())
    held = memfit.check_config(data, base=NATIVE.parent)  # base_model resolves through the settings beside the file
    assert held.input_format == "axolotl" and held.peak == native.peak > 0 and held.footprint == native.footprint and held.fits == native.fits
    assert held.config == native.config  # the memfit config it means, as `memfit convert` prints it
    memfit_form = memfit.check_config({"memfit": 1, "device": {"memory": "1 GiB"}, "optimizer": "adam", "parameters": [[4, 3]]})
    assert memfit_form.fits and memfit_form.footprint["total"] == (12 + 12 + 24) * 4 and memfit_form.peak is None
    # a problem is placed in the text the mapping was checked as
    bad = memfit.check_config({"memfit": 1, "device": {"memory": "1 GiB"}, "optimizer": "adam", "parameters": [[4, -3]]})
    (d,) = bad.diagnostics
    assert not bad.fits and d.severity == "error" and bad.text.splitlines()[d.line - 1].strip().startswith("- -3")


def test_does_not_fit_prints_what_the_cli_prints():
    result = memfit.check_file(OVER)
    with pytest.raises(memfit.DoesNotFit) as raised:
        result.raise_if_not_fits()
    assert raised.value.result is result
    assert str(raised.value) + "\n" == cli("check", str(OVER)).stdout
    assert memfit.check_file(ROOT / "examples" / "gpt2-small.yaml").raise_if_not_fits().fits


def test_a_file_that_cannot_be_read_is_a_result_with_an_error(tmp_path):
    result = memfit.check_file(tmp_path / "missing.yaml")
    assert not result.fits and result.peak is None and result.footprint is None
    assert [d.code for d in result.diagnostics] == [e["code"] for e in entries(str(tmp_path / "missing.yaml"))[0]["diagnostics"]]


@pytest.mark.parametrize("settings, error", [
    ({"budget": "80 GBs"}, ValueError), ({"gpus": 0}, ValueError), ({"warn_at": "0.9"}, ValueError), ({"reserve": "-1 GiB"}, ValueError),
    ({"overhead": "some"}, ValueError), ({"input_format": "yaml"}, ValueError), ({"budjet": "1 GiB"}, TypeError),
])
def test_bad_settings_are_refused(settings, error):
    with pytest.raises(error):
        memfit.check_file(OVER, **settings)


def test_check_config_takes_plain_data_only():
    with pytest.raises(TypeError):
        memfit.check_config(["memfit", 1])
    with pytest.raises(TypeError):
        memfit.check_config({"memfit": 1, "optimizer": object()})


def _modules(code: str) -> set:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"], capture_output=True, text=True, timeout=120, check=True, env=env)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_import_memfit_pays_nothing_for_the_api_and_the_api_imports_no_framework():
    at_start = _modules("import memfit")
    cli_start = _modules("import memfit.cli.main")  # what every `memfit` command loads before it parses its arguments
    assert not {m for m in at_start if m.startswith("memfit.")} - {m for m in cli_start if m.startswith("memfit.")}
    assert "memfit.api.checking" not in at_start and "yaml" not in at_start
    checked = _modules(f"import memfit; memfit.check_file({str(ROOT / 'examples' / 'gpt2-small.yaml')!r})")
    assert "memfit.api.checking" in checked
    assert not {"torch", "transformers", "peft"} & checked


def test_only_the_integration_module_imports_transformers():
    importers = []
    for path in (ROOT / "src" / "memfit").rglob("*.py"):
        if path.parts[-2] not in ("api", "integrations"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name.split(".")[0] in ("transformers", "trl", "peft") for name in names):
                importers.append(path.relative_to(ROOT / "src").as_posix())
    assert sorted(set(importers)) == ["memfit/integrations/transformers.py"]


def test_the_example_in_docs_python_prints_what_it_says():
    page = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    shown = page.split("prints, run in a clone:\n\n```text\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT, env=env)
    assert done.stdout == shown
