"""`memfit fit`, `memfit check --suggest` and a passing check's lines, through the real CLI.
The oracle for every answer is `memfit check` itself on the edited file: fit and the fixes
must agree with the gate they predict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.whatif import fit as fitmod
from memfit.check.pipeline import check
from memfit.whatif.fixes import apply_edits, fixes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# a Keras stack whose batch axis is model.batch_size; at 512 it needs more than 2 MiB
from sample_configs import KERAS  # noqa: E402


def memfit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=120)


def checked_json(path: Path) -> dict:
    return json.loads(memfit("check", "--format", "json", path).stdout)["files"][0]


def with_batch(tmp_path: Path, text: str, batch: int) -> Path:
    path = tmp_path / f"batch-{batch}.yaml"
    path.write_text(text.replace("batch_size: 512", f"batch_size: {batch}"), encoding="utf-8")
    return path


@pytest.fixture
def keras(tmp_path):
    path = tmp_path / "keras.yaml"
    path.write_text(KERAS, encoding="utf-8")
    return path


def test_fit_is_exact_against_check(keras, tmp_path):
    done = memfit("fit", "--format", "json", keras)
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)["files"]
    assert list(entry) == ["path", "vary", "max", "bytes_at_max", "bytes_at_next", "budget", "diagnostics"]
    assert entry["vary"] == "micro_batch" and entry["diagnostics"] == []
    top = entry["max"]
    at_max, at_next = checked_json(with_batch(tmp_path, KERAS, top)), checked_json(with_batch(tmp_path, KERAS, top + 1))
    assert at_max["footprint"]["total"] == entry["bytes_at_max"] <= entry["budget"] == at_max["budget"] == 2 * 2**20
    assert at_next["footprint"]["total"] == entry["bytes_at_next"] > entry["budget"]
    assert "budget-exceeded" not in [d["code"] for d in at_max["diagnostics"]]
    assert "budget-exceeded" in [d["code"] for d in at_next["diagnostics"]]
    text = memfit("fit", keras).stdout
    assert text.startswith(f"{keras}: micro_batch ≤ {top} fits (") and f"; {top + 1} needs " in text


def test_fit_when_even_one_does_not_fit(keras):
    done = memfit("fit", "--format", "json", "--budget", "64 KiB", keras)
    assert done.returncode == 1
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["max"] == 0 and entry["bytes_at_max"] is None and entry["bytes_at_next"] > entry["budget"] == 65536
    assert "does not fit at any micro_batch: at 1 (the config has 512) it needs" in memfit("fit", "--budget", "64 KiB", keras).stdout


def test_fit_nothing_to_vary_and_usage_errors(keras):
    done = memfit("fit", EXAMPLES / "cifar-cnn.yaml")
    assert done.returncode == 2
    assert "error[cannot-vary] nothing to vary: this config does not set training.micro_batch or model.batch_size" in done.stdout
    assert memfit("fit", "--vary", "gradient_accumulation", keras).returncode == 2
    assert memfit("fit", "--vary", "width", keras).returncode == 2  # not a key fit knows
    assert memfit("fit").returncode == 2
    broken = keras.parent / "broken.yaml"
    broken.write_text("memfit: 1\noptimizer: [\n", encoding="utf-8")
    done = memfit("fit", broken)
    assert done.returncode == 1 and "error[yaml-syntax]" in done.stdout


def test_vary_on_a_key_that_does_not_change_memory(tmp_path, monkeypatch, capsys):
    """A key that exists but leaves the footprint alone: a width of a category this config has
    no tensors of (the vary table is data, so a test entry can point there)."""
    path = tmp_path / "still.yaml"
    path.write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\ndtypes: {activations: 2}\nparameters: [[4, 4]]\n", encoding="utf-8")
    monkeypatch.setitem(fitmod.VARY, "seq_len", (("dtypes", "activations"),))
    from memfit.cli.main import main

    assert main(["fit", "--vary", "seq_len", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"{path}:4:23: error[cannot-vary] seq_len does not change memory in this config" in out


class Curve:
    """A stand-in for the pipeline: any monotone byte curve, counting evaluations."""

    def __init__(self, bytes_at, budget):
        self.at, self.budget, self.seen = bytes_at, budget, set()

    @property
    def runs(self):  # distinct values evaluated: the real Probe memoizes each
        return len(self.seen)

    def bytes(self, value):
        self.seen.add(value)
        return self.at(value)

    def fits(self, value):
        return self.bytes(value) <= self.budget

    def result(self, value):
        return type("R", (), {"budget": self.budget})()


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(0, 10**6),
    linear=st.integers(0, 5000),
    square=st.integers(0, 50),
    step=st.integers(1, 64),
    budget=st.integers(1, 10**8),
)
def test_search_is_exact_for_any_monotone_curve(base, linear, square, step, budget):
    curve = Curve(lambda v: base + linear * v + square * v * v + (v // step) * 1000 + v, budget)
    expected = 0
    low, high = 0, 1
    while curve.at(high) <= budget:  # the brute force answer, by doubling then scanning
        low, high = high, high * 2
    expected = max([v for v in range(max(low, 1), high) if curve.at(v) <= budget], default=0)
    assert fitmod.largest(curve) == expected
    assert curve.runs <= 3 * max(expected, 2).bit_length() + 8  # O(log n) pipeline runs


@settings(max_examples=200, deadline=None)
@given(
    flat=st.integers(0, 10**8),
    base=st.integers(0, 10**6),
    linear=st.integers(1, 5000),
    square=st.integers(0, 50),
    budget=st.integers(1, 10**8),
)
def test_search_is_exact_where_the_peak_changes_phase(flat, base, linear, square, budget):
    # a step's peak is the worse of its phases: at small values the optimizer step's (flat in the batch), further
    # out the backward's (growing): the first two points' line misses by far, and the answer stays exact
    curve = Curve(lambda v: max(flat + v, base + linear * v + square * v * v), budget)
    low, high = 0, 1
    while curve.at(high) <= budget:
        low, high = high, high * 2
    expected = max([v for v in range(max(low, 1), high) if curve.at(v) <= budget], default=0)
    assert fitmod.largest(curve) == expected


def test_a_far_first_guess_is_followed_by_the_line_through_it():
    # the 70B-size transformer's shape in micro_batch: the optimizer step's peak (almost flat) binds at 1 and 2, the
    # backward's (3,000 a step) from 334: the line through 2 and the failed first guess lands near the answer,
    # where doubling from 2 took 11 more runs
    curve = Curve(lambda v: max(10**6 + v, 3000 * v), 10**7)
    assert fitmod.largest(curve) == 3333
    assert curve.runs <= 8, sorted(curve.seen)


def test_fit_reuses_the_parsed_data_and_runs_a_few_times(keras):
    text = keras.read_text(encoding="utf-8")
    result = check(text, str(keras))
    found = fitmod.fit(result, text)
    assert found.max > 0 and found.runs <= 8  # affine in the batch: the first guess is the answer


@pytest.mark.parametrize(("example", "vary"), [("text-encoder.yaml", "micro_batch"), ("llama-3-8b.yaml", "micro_batch"), ("gpt2-small.yaml", "seq_len")])
def test_fit_searches_in_a_logarithmic_number_of_pipeline_runs(example, vary):
    """Keras and transformer forms (eager attention: quadratic in seq_len). fit's time is a few
    pipeline runs on data parsed once; its wall time against check is a row of benchmarks/bench.py
    (the brief keeps timings out of unit tests)."""
    import math

    path = EXAMPLES / example
    text = path.read_text(encoding="utf-8")
    found = fitmod.fit(check(text, str(path)), text, vary)
    assert found.max > 0
    assert found.runs <= 2 * math.ceil(math.log2(found.max + 2)) + 4, (found.runs, found.max)


@pytest.mark.parametrize(("vary", "old", "key"), [("micro_batch", "micro_batch: 8", "micro_batch"), ("seq_len", "seq_len: 1024", "seq_len")])
def test_fit_on_a_transformer_config_is_exact_against_check(tmp_path, vary, old, key):
    """GPT-2 from its config.json (examples/models/gpt2.json), the training keys varied."""
    import shutil

    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    text = (EXAMPLES / "gpt2-small.yaml").read_text(encoding="utf-8")
    (entry,) = json.loads(memfit("fit", "--vary", vary, "--format", "json", EXAMPLES / "gpt2-small.yaml").stdout)["files"]
    assert entry["vary"] == vary and entry["max"] > 1
    for value, fits in ((entry["max"], True), (entry["max"] + 1, False)):
        path = tmp_path / f"{vary}-{value}.yaml"
        path.write_text(text.replace(old, f"{key}: {value}"), encoding="utf-8")
        report = checked_json(path)
        gate = report["peak"]["bytes"] if report.get("peak") else report["footprint"]["total"]  # what the gate compares
        assert gate == entry["bytes_at_max" if fits else "bytes_at_next"]
        assert ("budget-exceeded" in [d["code"] for d in report["diagnostics"]]) is not fits


# --- fixes -----------------------------------------------------------------------------------


def test_suggest_gives_the_largest_batch_that_fits_as_an_edit(keras, tmp_path):
    done = memfit("check", "--suggest", "--format", "json", keras)
    assert done.returncode == 1
    (entry,) = json.loads(done.stdout)["files"]
    # the 8-bit optimizer is offered too (recipes); this test is about the batch fix
    assert [f["kind"] for f in entry["fixes"]] == ["optimizer_8bit", "micro_batch"]
    fix = entry["fixes"][1]
    top = json.loads(memfit("fit", "--format", "json", keras).stdout)["files"][0]["max"]
    assert fix["kind"] == "micro_batch" and fix["changes"] == [{"key": "model.batch_size", "from": 512, "to": top}]
    # the edit is the value's range only: comments, flow style and key order are kept
    (edit,) = fix["edits"]
    assert edit["range"] == {"start": {"line": 5, "character": 14}, "end": {"line": 5, "character": 17}} and edit["new_text"] == str(top)
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(KERAS.replace("batch_size: 512", f"batch_size: {top}"), encoding="utf-8")
    after = checked_json(fixed)
    assert after["footprint"]["total"] == fix["total"] and after["budget"] >= fix["total"]
    assert memfit("check", fixed).returncode == 0
    text = memfit("check", "--suggest", keras).stdout
    assert f"2. micro_batch 512 → {top}" in text and f"{keras}:6:15: replace with '{top}'" in text
    # without --suggest the json contract is unchanged
    assert "fixes" not in json.loads(memfit("check", "--format", "json", keras).stdout)["files"][0]


def test_near_budget_fixes_clear_the_warning(keras):
    text = KERAS.replace("batch_size: 512", "batch_size: 450")  # 97% of the budget
    result = check(text, "near.yaml")
    assert [d.code for d in result.diagnostics] == ["near-budget"]
    found = fixes(result, text)
    assert [fix.kind for fix in found] == ["optimizer_8bit", "micro_batch"]
    for fix in found:
        again = check(apply_edits(text, fix.edits), "near.yaml")
        assert again.diagnostics == [] and again.footprint["total"] == fix.total


def test_no_fix_for_explicit_tensors_is_said():
    done = memfit("check", "--suggest", EXAMPLES / "over-budget" / "gpt2-medium-on-t4.yaml")
    assert done.returncode == 1 and "no change memfit knows of, alone or up to 3 together, makes this config fit" in done.stdout  # closest: the 8-bit optimizer


def test_insertions_keep_the_layout():
    from memfit.whatif.fixes import edits

    block = "memfit: 1\ntraining:\n  micro_batch: 8   # per device\noptimizer: adam\n"
    (edit,) = edits(block, [(("training", "gradient_accumulation"), None, 4)])
    assert apply_edits(block, [edit]) == "memfit: 1\ntraining:\n  micro_batch: 8   # per device\n  gradient_accumulation: 4\noptimizer: adam\n"
    flow = "memfit: 1\ntraining: {micro_batch: 8}\n"
    (edit,) = edits(flow, [(("training", "checkpointing"), None, "full")])
    assert apply_edits(flow, [edit]) == "memfit: 1\ntraining: {micro_batch: 8, checkpointing: full}\n"
    bare = "memfit: 1\noptimizer: adam"
    (edit,) = edits(bare, [(("parallel", "offload", "optimizer"), None, "cpu")])
    assert apply_edits(bare, [edit]) == "memfit: 1\noptimizer: adam\nparallel:\n  offload:\n    optimizer: cpu\n"


# --- a passing check says what it found; explain takes several files -----------------------------


def test_passing_check_prints_each_total_for_a_handful():
    few = [EXAMPLES / name for name in ("atari-cnn.yaml", "gpt2-small.yaml")]
    lines = memfit("check", *few).stdout.splitlines()
    assert lines == [
        f"{few[0]}: total 57.53 MiB of 2.00 GiB (2.8%), fits",
        f"{few[1]}: peak 15.49 GiB of 38.00 GiB (40.8%), fits",  # a run: the gate compares its peak
        "memfit: 2 configs checked, all fit",
    ]
    many = [EXAMPLES / "atari-cnn.yaml"] * 6
    assert memfit("check", *many).stdout.splitlines() == ["memfit: 6 configs checked, all fit"]


def test_explain_takes_several_files():
    done = memfit("explain", EXAMPLES / "atari-cnn.yaml", EXAMPLES / "cifar-cnn.yaml")
    assert done.returncode == 0
    assert "atari-cnn (seed 004)" in done.stdout and "cifar10-cnn" in done.stdout


def test_the_docs_show_real_output():
    """Every `$ memfit fit|check|explain …` block of docs/fit-and-diff.md is what that command prints
    on the bundled examples today (diff's blocks need an edited clone: tests/whatif/test_diff.py)."""
    import re
    import shlex

    page = (ROOT / "docs" / "fit-and-diff.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```text\n(.*?)```", page, re.DOTALL) if b.startswith("$ memfit ") and not b.startswith("$ memfit diff")]
    assert len(blocks) >= 4
    # the README's block: several commands, each `$ ` line followed by what it prints
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Memory changes in review") :]
    (joined,) = [b for b in re.findall(r"```text\n(.*?)```", section, re.DOTALL) if b.startswith("$ memfit ")][:1]
    blocks += ["$ " + part for part in joined.split("$ ")[1:]]
    for block in blocks:
        command, _, expected = block.partition("\n")
        done = memfit(*shlex.split(command)[2:], cwd=ROOT)
        assert done.stdout == expected, command


def test_suggest_with_worker_processes(keras, tmp_path):
    """Pooled results come back without the data: --suggest reads and checks those files again."""
    other = tmp_path / "other.yaml"
    other.write_text(KERAS, encoding="utf-8")
    done = memfit("check", "--suggest", "--jobs", "2", "--format", "json", keras, other)
    assert [len(f["fixes"]) for f in json.loads(done.stdout)["files"]] == [2, 2]


def test_checkpointing_fix_on_a_transformer_config(tmp_path):
    """Where the format has training.checkpointing, `full` is offered after the cheaper micro_batch
    fix; its edit is an insertion into the training mapping, and the edited file passes."""
    import shutil

    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    config = tmp_path / "gpt2.yaml"
    shutil.copy(EXAMPLES / "gpt2-small.yaml", config)
    (entry,) = json.loads(memfit("check", "--suggest", "--budget", "9GiB", "--format", "json", config).stdout)["files"]
    assert [f["kind"] for f in entry["fixes"]] == ["micro_batch", "checkpointing"]
    checkpointing = entry["fixes"][1]
    assert checkpointing["changes"] == [{"key": "training.checkpointing", "from": None, "to": "full"}]
    from memfit.diagnostics.diagnostic import Range
    from memfit.whatif.fixes import Edit

    (edit,) = checkpointing["edits"]
    start, end = edit["range"]["start"], edit["range"]["end"]
    text = config.read_text(encoding="utf-8")
    fixed = apply_edits(text, [Edit(Range(start["line"], start["character"], end["line"], end["character"]), edit["new_text"])])
    assert fixed == text + "  checkpointing: full\n"
    config.write_text(fixed, encoding="utf-8")
    after = checked_json(config)
    done = memfit("check", "--budget", "9GiB", config)
    assert done.returncode == 0 and after["peak"]["bytes"] == checkpointing["total"]


def test_remedies_propose_only_where_the_format_and_the_config_allow(monkeypatch):
    """The table's entries for keys other features bring (parallel.zero/fsdp/offload, 8-bit
    optimizers): what each proposes, against a format that has those keys. Whether the change
    then fits is the pipeline's to say (fixes() evaluates every proposal)."""
    from memfit.whatif import fixes as fx

    fmt = {
        "properties": {
            "optimizer": {"type": "string"},
            "training": {"properties": {"checkpointing": {"enum": ["none", "full"]}, "gradient_accumulation": {"type": "integer"}}},
            "parallel": {
                "properties": {
                    "data": {"type": "integer"},
                    "zero": {"enum": [0, 1, 2, 3]},
                    "fsdp": {"enum": ["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]},
                    "offload": {"properties": {"optimizer": {"enum": ["cpu", "none"]}}},
                }
            },
        }
    }
    monkeypatch.setattr(fx, "_schema", lambda: fmt)
    monkeypatch.setattr(fx, "_known_optimizer", lambda name: name in {"adamw8bit", "adam8bit", "lion8bit"})
    by_kind = {r.kind + str(r.speed): r.propose for r in fx.REMEDIES}

    def changes(kind, data):
        return [c for _, cs in by_kind[kind](data, None, fx.OVER, None) for c in cs]

    eight = {"optimizer": "adamw"}
    assert changes("optimizer_8bit0", eight) == [(("optimizer",), "adamw", "adamw8bit")]
    assert changes("optimizer_8bit0", {"optimizer": "sgd"}) == []
    dp = {"parallel": {"data": 8, "zero": 1}}
    assert changes("zero1", dp) == [(("parallel", "zero"), 1, 2)]
    assert changes("zero1", {"parallel": {"data": 1, "zero": 1}}) == []  # nothing to shard over
    assert changes("zero1", {"parallel": {"data": 8, "zero": 3}}) == []
    assert changes("fsdp4", {"parallel": {"data": 8}}) == [(("parallel", "fsdp"), None, "full_shard")]
    assert changes("fsdp4", dp) == []  # ZeRO and FSDP are not both
    # selective is not in this format's enum: only full is proposed
    run = {"training": {}}
    assert changes("checkpointing3", run) == [] and changes("checkpointing5", run) == [(("training", "checkpointing"), None, "full")]
    assert changes("checkpointing5", {}) == []  # no training section: not a run, and adding one would change what the gate compares
    assert changes("offload6", {"parallel": {"offload": {"optimizer": "none"}}}) == [(("parallel", "offload", "optimizer"), "none", "cpu")]
    assert changes("offload6", {"parallel": {"offload": {"optimizer": "cpu"}}}) == []
    # the cost order of the table: cheaper in training speed first
    assert [r.speed for r in fx.REMEDIES] == sorted(r.speed for r in fx.REMEDIES)
