"""Issue 19: a device preset name that could mean cards with different memory (A100: 40 or 80 GB, V100: 16
or 32 GB) is an error listing the choices, at the value; exact names keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "memfit: 1\ndevice:\n  preset: {name}\n  reserve: 1 GiB\noptimizer: sgd\nparameters:\n  - {{name: w, shape: [1024, 1024]}}\n"


def check(tmp_path, name):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(name=name), encoding="utf-8")
    return path, subprocess.run([sys.executable, "-m", "memfit", "check", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("name, choices", [("A100", ["A100-40GB", "A100-80GB"]), ("v100", ["V100-16GB", "V100-32GB"]), ("A 100", ["A100-40GB", "A100-80GB"])])
def test_an_ambiguous_preset_is_an_error_listing_the_choices(tmp_path, name, choices):
    path, done = check(tmp_path, name)
    assert done.returncode == 1
    line = next(x for x in done.stdout.splitlines() if "error[" in x)
    assert line.startswith(f"{path}:3:11: error[unknown-preset]"), line  # at the value
    assert "is ambiguous" in line
    for choice in choices:
        assert choice in line


@pytest.mark.parametrize("name", ["A100-80GB", "a100_40gb", "V100-32GB", "H100", "RTX4090"])
def test_exact_names_and_unique_short_names_keep_working(tmp_path, name):
    _, done = check(tmp_path, name)
    assert done.returncode == 0, done.stdout


def test_no_alias_or_prefix_hides_a_choice_of_memory():
    """From the table itself: any prefix of the presets' names that starts cards of different memory is
    ambiguous, never resolved to one of them."""
    from memfit.config import presets

    key = presets._key
    for name in presets.PRESETS:
        for cut in range(1, len(key(name)) + 1):
            prefix = key(name)[:cut]
            starts = {presets.PRESETS[n].memory for n in presets.PRESETS if key(n).startswith(prefix)}
            found = presets.lookup(prefix)
            if found is not None and len(starts) > 1 and key(found.name) != prefix:
                pytest.fail(f"{prefix!r} resolves to {found.name} though it starts presets of {len(starts)} memory sizes")
            if found is None and len(starts) > 1:
                assert presets.ambiguous(prefix), prefix
