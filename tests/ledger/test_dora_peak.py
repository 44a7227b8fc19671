"""DoRA's forward moment (issue 32): peft's DoraLinearLayer.forward computes the weight norm from (out, in) temporaries
in every forward of an adapted linear (models/hf_act_flights._dora_flights). The gated peak of `memfit check` against
MemTracker around a real step on CPU (peft 0.21.2), at two sizes.

The reference is MemTracker without its module tracker (peak_reference.unhooked_step), with Python's cyclic collector
off. With its module tracker, MemTracker's own peak for a DoRA step depended on when the collector ran (the same tiny
step measured 1,689,320 / 1,716,728 / 1,783,296 bytes in three processes, 1,929,712 with the collector off): the
tracker's pre-forward hook makes a reference cycle through each module input's grad_fn, and DoRA's get_lora_weight
builds a graph that only a detached tensor leaves (lora_B(lora_A(eye)).T, its norm detached), so the (in, in) identity
lora_A's mm saved stays in that cycle until a collection. A DoRA step without the tracker makes no cyclic garbage
(tested below), and MemTracker's dispatch counts every byte without the module hooks: that peak is the same with the
collector on or off, and is what a training loop holds (docs/accuracy.md)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

torch = needs.module("torch")
needs.module("transformers")
needs.module("peft")

import doc_tables  # noqa: E402  (tools/doc_tables.py: the docs' measurement tables)
import hf_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

BAND = 0.05
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", "use_dora": True}
TINY = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
TABLE = doc_tables.DoraPeakTable()
ROWS = doc_tables.documented("docs/accuracy.md", "dora-peak")   # tiny and wide Llama: setup, memfit, MemTracker, ratio
TINY_ROW = ROWS[0][0]

_MEASURED: dict = {}


def measured(setup: str, collector: bool = False) -> dict:
    """MemTracker's peak of the row's step without its module tracker (peak_reference.unhooked_step)."""
    run = TABLE.SETUPS[setup]
    if run.get("nf4"):
        needs.module("bitsandbytes")
    if (setup, collector) not in _MEASURED:
        _MEASURED[setup, collector] = TABLE.measure(run, collector=collector)
    return _MEASURED[setup, collector]


def step_parts():
    model = hf_measure.build(TINY, "sdpa", "32-true", LORA)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    batch = hf_measure.inputs(TINY, 2, 32)
    return model, opt, batch["input_ids"], batch["labels"]


def memfit_peak(tmp_path, setup: str) -> dict:
    doc, files = TABLE.config(TABLE.SETUPS[setup])
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    return json.loads(done.stdout)["files"][0]["peak"]


def saved_bytes(node) -> dict:
    """{storage pointer: bytes} of the tensors an autograd node saved (its _saved_* attributes)."""
    out = {}
    for name in dir(node):
        if not name.startswith("_saved_"):
            continue
        try:
            value = getattr(node, name)
        except RuntimeError:  # already freed
            continue
        if torch.is_tensor(value):
            out[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return out


def cyclic_garbage(during) -> list:
    """Objects made by `during()` (run with the collector off) that the cyclic collector then finds unreachable (kept:
    DEBUG_SAVEALL). What existed before is held alive meanwhile, so it is not counted: an earlier test's step under
    MemTracker with its module tracker leaves autograd nodes that come loose here (test_peak_transformers' Mixtral
    run before these tests: 2 ViewBackward0, an UnsafeViewBackward0 and 2 AddBackward0 read as DoRA's; the module
    tracker's leftovers: tests/ledger/test_reference_tracker.py)."""
    gc.collect()
    before = gc.get_objects()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        during()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        del before
        gc.enable()


def autograd_nodes(objects) -> list:
    return [o for o in objects if type(o).__module__ == "torch.autograd.graph" or type(o).__name__.endswith("Backward0")]


def test_the_table_has_the_two_sizes():
    assert [TABLE.SETUPS[r[0]]["wide"] for r in ROWS] == [False, True, True, True, False]
    assert TABLE.SETUPS[TINY_ROW] == {"wide": False, "precision": "32-true", "b": 2, "s": 32}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("row", ROWS, ids=[f"row{i}" for i in range(len(ROWS))])
def test_the_reference_is_what_docs_accuracy_prints(row):
    theirs = measured(row[0])
    assert (theirs["bytes"], theirs["phase"]) == (int(row[2].replace(",", "")), "forward"), (row, theirs)


@pytest.mark.filterwarnings("ignore")
def test_the_reference_does_not_depend_on_the_collector():
    assert measured(TINY_ROW, collector=True) == measured(TINY_ROW), "the collector moves the unhooked step's peak"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("row", ROWS, ids=[f"row{i}" for i in range(len(ROWS))])
def test_the_gated_peak_under_dora_matches_memtracker(row, tmp_path):
    theirs = measured(row[0])
    peak = memfit_peak(tmp_path, row[0])
    assert abs(peak["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (row[0], peak["bytes"], theirs["bytes"])
    assert peak["phase"] == theirs["phase"], (peak, theirs)


def in_a_fresh_process(check: str) -> None:
    """Run this module's `check` in a new interpreter: a MemTracker run earlier in the same process (another test's)
    leaves what makes autograd nodes cyclic in later steps, and these two claims are about a training loop's own
    process."""
    here = Path(__file__).resolve()
    paths = os.pathsep.join(str(p) for p in (here.parent, here.parents[1] / "support", here.parents[2] / "tools"))
    env = {**os.environ, "PYTHONPATH": paths + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", f"import test_dora_peak as t; t.{check}()"],
                          capture_output=True, text=True, timeout=300, check=False, env=env, cwd=here.parents[2])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


@pytest.mark.filterwarnings("ignore")
def test_a_dora_step_without_a_tracker_leaves_no_cyclic_garbage():
    """What a training loop holds does not wait for the collector: no tensor and no autograd node is cyclic garbage
    after DoRA's forward and backward."""
    in_a_fresh_process("no_cyclic_garbage")


def no_cyclic_garbage():
    model, opt, x, y = step_parts()

    def step():
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    garbage = cyclic_garbage(step)
    held = [o for o in garbage if torch.is_tensor(o)] + autograd_nodes(garbage)
    assert held == [], [type(o).__name__ for o in held]


@pytest.mark.filterwarnings("ignore")
def test_memtrackers_module_hooks_keep_each_dora_identity_in_a_cycle():
    """With MemTracker's module tracker, the garbage after DoRA's forward is one autograd node per adapted linear
    (lora_A's mm in get_lora_weight) holding what it saved: `torch.eye(in_features)` in the adapters' dtype, counted
    here from the model's own adapters; the collector-off step then peaks at 1,929,712 bytes in the backward (the
    figure docs/accuracy.md explains)."""
    in_a_fresh_process("module_hooks_cycle")


def module_hooks_cycle():
    model, opt, x, y = step_parts()
    for _ in range(2):
        model(input_ids=x, labels=y).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    adapted = [m for m in model.modules() if hasattr(m, "lora_magnitude_vector") and "default" in m.lora_A]
    expected = sum(m.lora_A["default"].in_features ** 2 * m.lora_A["default"].weight.element_size() for m in adapted)
    tracker = ref.PhaseTracker(list(model.parameters()))
    tracker.track_external(model, opt, x, y)
    kept = {}

    def forward():
        kept["loss"] = model(input_ids=x, labels=y).loss

    with tracker:
        nodes = autograd_nodes(cyclic_garbage(forward))
    held = {}
    for node in nodes:
        held.update(saved_bytes(node))
    assert (len(nodes), sum(held.values())) == (len(adapted), expected), (len(nodes), sum(held.values()), len(adapted), expected)
    assert expected == 296_960

    model, opt, x, y = step_parts()
    gc.collect()
    gc.disable()
    try:
        hooked = ref.warm_step(model, opt, x, y)
    finally:
        gc.enable()
    assert (hooked._peak_mem[ref.CPU], hooked.peak_phase) == (1_929_712, "backward")
