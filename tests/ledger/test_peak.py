"""memfit's peak of a training step against PyTorch's MemTracker around a real step on the CPU.

tests/support/peak_reference.py runs the step (optimizer state allocated by warm-up steps, gradients None
between steps) and notes the phase of the peak. Compared: peak.bytes within 5%, the phase exactly,
live.parameters and live.optimizer_state exactly (MemTracker rounds to 512 bytes on CUDA only), and MemTracker's
figure of every run docs/peak.md prints, to the byte. The transformers families: tests/ledger/test_peak_transformers.py.
"""

from __future__ import annotations

import needs
import pytest
import yaml

import doc_tables  # tools/doc_tables.py: the docs' measurement tables
from memfit.check.pipeline import check

# imported by the tests that use them: the step model's own tests and the presets run without torch
torch = needs.lazy("torch")
ref = needs.lazy("peak_reference")
tf = needs.lazy("keras_reference")
from memfit.ledger.step import IMPLS, OPTIMIZER_TEMPORARIES, Loss, PeakError, Row, Step, optimizer_temporaries, peak, phases

BAND = 0.05


# --- the optimizer's temporaries, per optimizer and implementation ---------------------------
SIZES = ([1000, 3000, 5000], [5000, 1000, 3000])  # order matters to for_loop (a temporary outlives its iteration)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(set(OPTIMIZER_TEMPORARIES) - {"adafactor"}))
def test_optimizer_temporaries_match_torch_optim(name, impl):
    for sizes in SIZES:
        fp32 = [4 * n for n in sizes]
        if OPTIMIZER_TEMPORARIES[name][impl] is None:
            with pytest.raises(TypeError, match="fused"):
                ref.optimizer_step_temporaries(name, impl, sizes)
            with pytest.raises(PeakError, match=f"no {impl} implementation of {name}"):
                optimizer_temporaries(name, impl, fp32)
            return
        assert optimizer_temporaries(name, impl, fp32) == ref.optimizer_step_temporaries(name, impl, sizes), sizes


@pytest.mark.parametrize("impl", ["foreach", "for_loop"])
@pytest.mark.parametrize("shapes", [[(100, 10), (300, 10), (500, 10)], [(500, 10), (100, 10), (300, 10)], [(500, 10), (64,), (300, 10)]])
def test_adafactor_temporaries_on_matrices(shapes, impl):
    """Adafactor's update is a parameter-sized tensor (row_var @ col_var); what memfit leaves out is its row and
    column means and scalar norms: at most rows + columns + a few elements per parameter in flight."""
    import math

    needs.module("torch")
    from torch.distributed._tools.mem_tracker import MemTracker

    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in shapes]
    opt = torch.optim.Adafactor(params, foreach=impl == "foreach")
    for n in range(9):
        for p in params:
            p.grad = torch.randn_like(p)
        if n < 8:
            opt.step()
    tracker = MemTracker()
    tracker.track_external(opt, *params, *[p.grad for p in params])
    with tracker:
        opt.step()
    measured = tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"] - tracker.get_tracker_snapshot("current")[ref.CPU]["Total"]
    ours = optimizer_temporaries("adafactor", impl, [4 * math.prod(shape) for shape in shapes])
    left_out = 4 * sum(sum(shape) + 4 for shape in shapes)
    assert ours <= measured <= ours + left_out, (ours, measured)
    with pytest.raises(PeakError, match="no fused implementation of adafactor"):
        optimizer_temporaries("adafactor", "fused", [4])


def test_unknown_optimizer_or_impl():
    with pytest.raises(PeakError, match="not modelled"):
        optimizer_temporaries("lion", "foreach", [4])
    with pytest.raises(PeakError, match="unknown optimizer_impl"):
        optimizer_temporaries("adam", "fast", [4])


# --- the phase model on a hand-made step -------------------------------------------------------
def test_phases_of_a_two_row_step():
    # batch x (id 1, 100 B), labels (id 5, 8 B); row a: 40 B weight, keeps x, output h (id 2, 60 B);
    # row b: 20 B weight, keeps h, output logits (id 3, 30 B, kept by the loss)
    tensors = {1: 100, 2: 60, 3: 30, 5: 8}
    rows = [
        Row("a", grads=[40], params=[40], input=1, output=2, kept=[1], grad_input=False),
        Row("b", grads=[20], params=[20], input=2, output=3, kept=[2, 3]),
    ]
    # Adam's foreach step: two states per parameter, one temporary per parameter
    step = Step(rows, tensors, [1, 5], Loss(forward=(30,), backward=(30, 30)), [40, 40, 20, 20], "adam", "foreach")
    by = phases(step)
    # forward ends with everything kept (x, h, logits) and the log-softmax copy; the labels, which
    # no row keeps, are held by the loop for the whole step: with the transients, not the saved activations
    assert by["forward"]["live"] == {"parameters": 60, "gradients": 0, "activations": 190, "optimizer_state": 120, "transient": 38, "overhead": 0}
    # backward: the loss's two gradients (60) with all kept, then b: its output's gradient (30) and h's (60) and its weight's
    assert by["backward"]["bytes"] == max(60 + 198 + 120 + 60, 60 + 20 + 198 + 120 + 90, 60 + 60 + 108 + 120 + 60)
    assert by["backward"]["at"] == "b"
    assert by["optimizer_step"]["live"] == {"parameters": 60, "gradients": 60, "activations": 100, "optimizer_state": 120, "transient": 68, "overhead": 0}
    top = peak(step)
    assert top["phase"] == "backward" and top["bytes"] == sum(top["live"].values()) == 488


def test_overhead_is_live_in_every_phase():
    step = Step([Row("a", grads=[4], params=[4], input=1, output=2, kept=[1], grad_input=False)], {1: 8, 2: 8}, [1], Loss((8,), (8, 8)), [], "sgd", "foreach", overhead=1000)
    assert all(p["live"]["overhead"] == 1000 for p in phases(step).values())


def test_allocator_granularity_rounds_every_live_tensor():
    step = Step([Row("a", grads=[4], params=[4], input=1, output=2, kept=[1], grad_input=False)], {1: 8, 2: 8}, [1], Loss((8,), (8, 8)), [], "sgd", "foreach")
    exact, coarse = peak(step), peak(step, granule=512)
    # backward at "a": its weight (4) and gradient (4), x (8), its output's gradient (8): four blocks of 512
    assert coarse["phase"] == exact["phase"] == "backward"
    assert coarse["bytes"] == 4 * 512 and coarse["live"]["overhead"] == 4 * 512 - exact["bytes"]
    assert {k: v for k, v in coarse["live"].items() if k != "overhead"} == {k: v for k, v in exact["live"].items() if k != "overhead"}


def test_a_declared_tensor_list_peaks_at_its_footprint_in_backward():
    from memfit.config.build import build
    from memfit.ledger.training import tensors_step
    from memfit.placement.place import place

    doc = {"memfit": 1, "optimizer": "adam", "parameters": [[1000, 10], {"shape": [10], "trainable": False, "count": 2}], "activations": [[64, 1000]]}
    config, problems = build(doc)
    assert not problems
    fp = place(config.tensors).footprint
    top = peak(tensors_step(config.tensors, "adam", "for_loop"))
    assert top["phase"] == "backward" and top["bytes"] == fp["total"]
    assert top["phases"]["optimizer_step"]["live"]["transient"] == 2 * 40_000  # for_loop Adam: two of its one parameter


# --- Keras-form models against MemTracker --------------------------------------------------------
# the seed's Atari CNN (3.4 M parameters, batch 32); an MLP; an encoder (embedding, attention, layer norms, GELU,
# dropout, pooling): (input_shape, layers, batch), keras_reference's cases
BATCH = {"seed-cnn": 32, "mlp": 8, "encoder": 4}


def keras_model(name):
    return (*(tf.SEED if name == "seed-cnn" else tf.CASES[name]), BATCH[name])


RUNS = [(m, o, i) for m in BATCH for o in ("sgd", "adamw") for i in IMPLS] + [(m, "adam", "foreach") for m in BATCH]
# docs/peak.md's table of these runs (tools/doc_tables.py): the model's name, "adam/adamw", "any" implementation
DOC_MODEL = {"seed-cnn": "seed CNN", "mlp": "MLP", "encoder": "encoder"}


def memfit_peak(input_shape, layers, batch, optimizer, impl):
    """The gated peak of the run as a config says it (a training section names the implementation)."""
    text = yaml.safe_dump({"memfit": 1, "optimizer": optimizer, "device": {"memory": "1 TiB"}, "training": {"optimizer_impl": impl},
                           "model": {"input_shape": input_shape, "batch_size": batch, "layers": layers}})
    result = check(text)
    assert not result.failed, result.diagnostics
    return result.config.peak


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model,optimizer,impl", RUNS)
def test_keras_peak_matches_memtracker(model, optimizer, impl):
    input_shape, layers, batch = keras_model(model)
    theirs = ref.measure_keras(input_shape, layers, batch, optimizer, impl)
    ours = memfit_peak(input_shape, layers, batch, optimizer, impl)
    assert ours["phase"] == theirs["phase"]
    assert abs(ours["bytes"] - theirs["bytes"]) <= BAND * theirs["bytes"], (ours["bytes"], theirs["bytes"])
    assert ours["live"]["parameters"] == theirs["parameters"]
    assert ours["live"]["optimizer_state"] == theirs["optimizer_state"]
    # the page prints MemTracker's figure to the byte: the row of this run (its "any" and "adam/adamw" rows hold
    # for every implementation and both Adams)
    rows = [r for r in doc_tables.documented("docs/peak.md", "peak-keras") if r[0].split(" (")[0] == DOC_MODEL[model]
            and r[1] in (optimizer, "adam/adamw" if optimizer.startswith("adam") else "") and r[2] in (impl, "any")]
    assert len(rows) == 1, (model, optimizer, impl)
    assert (theirs["bytes"], theirs["phase"]) == (int(rows[0][3].replace(",", "")), rows[0][4]), rows[0]


def test_the_flowing_gradients_are_a_third_of_a_small_cnn_peak():
    """The issue's claim, on the seed CNN with SGD: the peak is in backward, at the first ReLU,
    and the two gradients flowing through it are about a tenth of it here (the parameters and
    their gradients dominate this 3.4 M-parameter network at batch 32)."""
    ours = memfit_peak(*keras_model("seed-cnn"), "sgd", "foreach")
    assert ours["phase"] == "backward"
    labels = 32 * 8  # one int64 class label per sample, held by the loop (no layer keeps them)
    assert ours["live"]["transient"] == 2 * 32 * 20 * 20 * 32 * 4 + labels


# --- presets ----------------------------------------------------------------------------------
from memfit.config import presets

REQUIRED_PRESETS = ["V100-16GB", "V100-32GB", "T4", "A10G", "L4", "L40S", "RTX-3090", "RTX-4090", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "MI300X"]


def test_the_issue_lists_gpus_are_presets_with_a_source():
    assert set(REQUIRED_PRESETS) <= set(presets.PRESETS)
    for name in REQUIRED_PRESETS:
        p = presets.PRESETS[name]
        assert isinstance(p.memory, int) and p.memory > 10**10 and p.source


def test_an_80_gb_card_is_not_80_gib():
    # the issue: users write `memory: 80 GB` for a card that reports 81920 MiB (A100) or 81559 MiB (H100)
    assert presets.lookup("A100-80GB").memory == 81920 * 2**20 > 80 * 10**9
    assert presets.lookup("h100 80gb").memory == 81559 * 2**20


def test_lookup_ignores_case_and_punctuation_and_suggests_close_names():
    assert presets.lookup("a100_80gb").name == "A100-80GB"
    assert presets.lookup("rtx 4090").name == "RTX-4090"
    assert presets.lookup("A100-80") is None
    assert presets.closest("A100-80")[0] == "A100-80GB"
    assert "H100-80GB" in presets.closest("H100-8OGB")


def test_overhead_lines_are_named_and_sourced_and_sum_to_auto():
    for p in presets.PRESETS.values():
        lines = presets.overhead_lines(p)
        assert lines and all(line.name and line.source and isinstance(line.bytes, int) and line.bytes > 0 for line in lines)
    hopper = {line.name: line.bytes for line in presets.overhead_lines(presets.PRESETS["H100-80GB"])}
    ampere = {line.name: line.bytes for line in presets.overhead_lines(presets.PRESETS["A100-80GB"])}
    # PyTorch's default cuBLAS workspace: 32 MiB on sm90, :4096:2:16:8 elsewhere; one per thread (forward, autograd)
    assert sum(v for k, v in hopper.items() if k.startswith("cuBLAS workspace")) == 2 * 32 * 2**20
    assert sum(v for k, v in ampere.items() if k.startswith("cuBLAS workspace")) == 2 * (8 * 2**20 + 128 * 2**10)


# --- in the pipeline: config, budget gate, reports ------------------------------------------
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from memfit.editor.editor import Analysis  # noqa: E402
from memfit.report.explain import render  # noqa: E402
from memfit.report.reporters import summary_markdown  # noqa: E402

def seed_run():
    return {
        "memfit": 1,
        "optimizer": "sgd",
        "device": {"memory": "1 GiB"},
        "training": {"optimizer_impl": "foreach"},
        "model": {"input_shape": [80, 80, 4], "batch_size": 32, "layers": tf.SEED[1]},
    }


def run_doc(**changes):
    doc = seed_run()
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    text = yaml.safe_dump(doc, sort_keys=False)
    return text, check(text)


def test_a_training_section_adds_the_peak_and_keeps_the_footprint():
    _, run = run_doc()
    _, plain = run_doc(training=None)
    assert run.footprint == plain.footprint
    assert plain.peak is None and plain.config.peak is None
    assert run.peak == {k: v for k, v in memfit_peak(*keras_model("seed-cnn"), "sgd", "foreach").items() if k in ("bytes", "phase", "live")}
    assert run.peak["bytes"] == sum(run.peak["live"].values())
    assert run.peak["phase"] == "backward" and run.peak["bytes"] > run.footprint["total"]


def test_the_budget_gate_compares_the_peak_with_a_training_section():
    _, probe = run_doc()
    total, top = probe.footprint["total"], probe.peak["bytes"]
    between = (total + top) // 2
    _, plain = run_doc(training=None, device={"memory": between})
    assert not plain.failed  # the total fits (near the budget: a warning)
    _, run = run_doc(device={"memory": between})
    [d] = run.diagnostics
    assert d.code == "budget-exceeded"
    assert d.message.startswith(f"peak {top:,} B") and "during backward exceeds the budget" in d.message
    assert f"by {top - between:,} B" in d.message and f"total {total:,} B" in d.message


def test_json_entry_has_peak_beside_footprint_only_for_a_run(tmp_path):
    run_text, _ = run_doc()
    plain_text, _ = run_doc(training=None)
    (tmp_path / "run.yaml").write_text(run_text)
    (tmp_path / "plain.yaml").write_text(plain_text)
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "run.yaml", "plain.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    run, plain = json.loads(out.stdout)["files"]
    assert list(run) == ["path", "input_format", "footprint", "peak", "budget", "diagnostics"]
    assert list(plain) == ["path", "input_format", "footprint", "budget", "diagnostics"]
    assert set(run["peak"]) == {"bytes", "phase", "live"}
    assert list(run["peak"]["live"]) == ["parameters", "gradients", "activations", "optimizer_state", "transient", "overhead"]
    sarif = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "sarif", "run.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert json.loads(sarif.stdout)["runs"][0]["properties"]["files"][0]["peak"] == run["peak"]


def test_markdown_explain_and_hover_show_the_peak():
    text, run = run_doc()
    table = summary_markdown([run])
    assert "| file | total | peak | budget | headroom | verdict |" in table and "(backward)" in table
    shown = render(run)
    assert all(len(line) <= 80 for line in shown.splitlines())
    assert "backward        [" in shown and "<- peak" in shown and "the peak is in backward" in shown
    line = next(i for i, t in enumerate(text.splitlines()) if t.startswith("device:"))
    hover = Analysis(text, run).hover(line + 1, 4).markdown
    assert "**backward:" in hover and "(the peak)" in hover and "during backward" in hover


# --- presets and overhead in a config ---------------------------------------------------------
def test_a_preset_fills_memory_and_auto_adds_its_named_overhead():
    _, run = run_doc(device={"preset": "a100 80gb", "overhead": "auto"})
    assert not run.diagnostics
    assert run.budget == 81920 * 2**20 and run.budget_origin == "preset A100-80GB"
    lines = presets.overhead_lines(presets.PRESETS["A100-80GB"])
    overhead = run.peak["live"]["overhead"]
    # the named lines, plus the allocator's 512-byte rounding of what is live at the peak
    assert sum(line.bytes for line in lines) < overhead < sum(line.bytes for line in lines) + 512 * 64
    shown = render(run)
    assert all(line.name[:40] in shown for line in lines) and "allocator rounding" in shown


def test_unknown_preset_suggests_the_closest_names():
    _, run = run_doc(device={"preset": "A100-80"})
    [d] = [d for d in run.diagnostics if d.code == "unknown-preset"]
    assert "did you mean A100-80GB" in d.message and d.severity == "error"


def test_memory_wins_over_a_preset_with_a_note():
    _, run = run_doc(device={"preset": "H100-80GB", "memory": "1 GiB"})
    [d] = run.diagnostics
    assert (d.code, d.severity) == ("preset-overridden", "information") and "wins over preset H100-80GB" in d.message
    assert run.budget == 2**30 and not run.failed


def test_an_overhead_larger_than_memory_is_a_bad_budget():
    _, run = run_doc(device={"memory": "1 GiB", "overhead": "2 GiB"})
    assert [d.code for d in run.diagnostics] == ["bad-budget"]
    _, run = run_doc(device={"memory": "1 GiB", "overhead": "auto"})
    assert [d.code for d in run.diagnostics] == ["unknown-preset"]  # auto needs a preset to take it from


def test_a_given_overhead_is_live_in_every_phase_or_taken_off_a_tensor_lists_budget():
    _, run = run_doc(device={"memory": "1 GiB", "overhead": "100 MiB"})
    assert run.peak["live"]["overhead"] == 100 * 2**20 and run.budget == 2**30
    _, plain = run_doc(training=None, device={"memory": "1 GiB", "overhead": "100 MiB"})
    assert plain.budget == 2**30 - 100 * 2**20 and "overhead" in plain.budget_origin


def test_a_fused_step_torch_optim_does_not_have_is_refused():
    _, run = run_doc(optimizer="rmsprop", training={"optimizer_impl": "fused"})
    [d] = run.diagnostics
    assert d.code == "optimizer-impl" and "no fused implementation of rmsprop" in d.message
    _, run = run_doc(optimizer="lion")
    [d] = run.diagnostics
    assert (d.code, d.severity) == ("optimizer-impl", "information") and run.peak is not None
