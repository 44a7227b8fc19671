"""`memfit runs` on a hand-written record file with measured figures: the table, the median and the worst error, the
low-run and out-of-memory flags, --format json, the exit code, and bad lines reported by number and skipped.
(The records MemfitCallback writes are read in tests/integrations/.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def record(n: int, predicted: int | None, allocated: int | None, reserved: int | None, status="completed", fits=True, device="NVIDIA H100 80GB HBM3") -> str:
    return json.dumps({
        "record": 1, "id": f"run{n}", "time": f"2026-12-0{n}T10:00:00Z", "memfit": "0.1.0", "status": status, "device": device, "world_size": 1,
        "versions": {"torch": "2.13.0", "transformers": "5.24.0", "peft": None, "bitsandbytes": None}, "config": {"memfit": 1},
        "predicted": {"peak": predicted, "fits": fits, "seq_len": 4096, "budget": 80 * 10**9},
        "measured": {"allocated": allocated, "reserved": reserved, "steps": 3}, "error": None,
    })


def runs(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "memfit", "runs", *args], capture_output=True, text=True, timeout=120, check=False, env=env)


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_table_the_median_the_worst_and_a_low_run(tmp_path):
    path = write(tmp_path, [
        record(1, 20 * GIB, 19 * GIB, 21 * GIB),  # memfit high by 1/19
        "this is not json",
        record(2, 40 * GIB, 41 * GIB, 44 * GIB),  # low by 1/41: flagged, within 5%
        '{"record": 1, "status": "completed"}',
        record(3, 10 * GIB, None, None, device="cpu"),  # no measurement: shown, not in the statistics
        record(4, 30 * GIB, 30 * GIB, 31 * GIB),  # exact
    ])
    done = runs(str(path))
    assert done.returncode == 0, done.stdout + done.stderr  # low, but by less than 5%
    assert done.stderr.splitlines() == [
        f"{path}:2: not a memfit run record: Expecting value: line 1 column 1 (char 0)",
        f"{path}:4: not a memfit run record: no `predicted` object",
    ]
    out = done.stdout.splitlines()
    assert out[0].split() == ["run", "device", "status", "tokens", "predicted", "allocated", "reserved", "error", "flags"]
    assert out[1].split()[0] == f"{path}:1" and "20.00 GiB  19.00 GiB  21.00 GiB  +5.3%" in out[1]
    assert out[2].endswith("40.00 GiB  41.00 GiB  44.00 GiB  -2.4%  low")
    assert out[3].split()[1:] == ["cpu", "completed", "4096", "10.00", "GiB", "-", "-", "-"]
    errors = sorted([Fraction(1, 19), Fraction(-1, 41), Fraction(0)])
    assert f"memfit runs: 4 runs, 3 measured; error median {float(errors[1]) * 100:+.1f}%, worst +5.3% ({path}:1)" in done.stdout
    assert f"{path}:3: low: measured {41 * GIB:,} B allocated, {GIB:,} B above the prediction {40 * GIB:,} B (-2.4%)" in done.stdout

    report = json.loads(runs("--format", "json", str(path)).stdout)
    assert [r["line"] for r in report["runs"]] == [1, 3, 5, 6]
    low = report["runs"][1]
    assert low["flags"] == ["low"] and low["difference"] == -GIB and low["error"] == float(Fraction(-1, 41))
    assert report["runs"][2]["error"] is None and report["runs"][2]["allocated"] is None
    assert report["summary"] == {"runs": 4, "measured": 3, "median_error": 0.0, "worst_error": float(Fraction(1, 19)), "worst": f"{path}:1",
                                 "low": 1, "low_beyond_tolerance": 0, "oom_after_pass": 0}
    assert [(s["line"], s["message"].split(":")[0]) for s in report["skipped"]] == [(2, "not a memfit run record"), (4, "not a memfit run record")]


def test_a_run_low_by_more_than_five_percent_fails_the_command(tmp_path):
    path = write(tmp_path, [record(1, 95 * GIB - 1, 100 * GIB, 106 * GIB)])  # one byte more than 5% of the measured peak low
    done = runs(str(path))
    assert done.returncode == 1 and "low" in done.stdout.splitlines()[1]
    edge = write(tmp_path, [record(1, 95 * GIB, 100 * GIB, 100 * GIB)])  # exactly 5% low: within the tolerance
    assert runs(str(edge)).returncode == 0


def test_an_out_of_memory_run_fails_the_command_only_after_a_pass(tmp_path):
    said_fits = write(tmp_path, [record(1, 70 * GIB, None, None, status="oom", fits=True)])
    done = runs(str(said_fits))
    assert done.returncode == 1 and "oom-after-pass" in done.stdout
    said_not = write(tmp_path, [record(1, 90 * GIB, None, None, status="oom", fits=False)])
    assert runs(str(said_not)).returncode == 0


def test_a_missing_file_is_reported_and_fails(tmp_path):
    done = runs(str(tmp_path / "none.jsonl"))
    assert done.returncode == 1 and str(tmp_path / "none.jsonl") in done.stderr
    assert "memfit runs: 0 runs, 0 measured" in done.stdout
