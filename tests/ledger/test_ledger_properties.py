"""Invariants between the figures (issue 19), as property tests over generated configs of every kind
(declared tensors, the Keras form, transformers; precision recipes, optimizers and their
implementations, LoRA and QLoRA, checkpointing, gradient accumulation): the peak the gate compares
and the footprint count the same tensors the same way, and a one-GPU layout changes nothing."""

from __future__ import annotations

import copy
import json

import needs
import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from memfit.check.pipeline import check, gated

needs.module("transformers")
import hf_measure  # noqa: E402
import keras_reference as tf  # noqa: E402

FAMILIES = list(hf_measure.FAMILIES)
_TINY: dict = {}


def tiny(family: str) -> dict:
    if family not in _TINY:
        _TINY[family] = hf_measure.tiny(family)
    return _TINY[family]


PRECISIONS = st.sampled_from([None, "32-true", "bf16-true", "bf16-mixed", "16-true"])
OPTIMIZERS = st.sampled_from(["adamw", "adam", "sgd", "momentum", "adamw8bit", "adafactor", "rmsprop"])
IMPLS = st.sampled_from(["foreach", "fused", "for_loop"])


@st.composite
def declared(draw) -> dict:
    shapes = st.lists(st.integers(1, 300), min_size=1, max_size=3)
    params = draw(st.lists(st.fixed_dictionaries({"shape": shapes}, optional={"count": st.integers(1, 4), "trainable": st.booleans()}), min_size=1, max_size=4))
    acts = draw(st.lists(st.fixed_dictionaries({"shape": shapes}, optional={"count": st.integers(1, 3)}), max_size=3))
    doc = {"parameters": params}
    if acts:
        doc["activations"] = acts
    return doc


@st.composite
def keras(draw) -> dict:
    name = draw(st.sampled_from(sorted(tf.CASES)))
    input_shape, layers = tf.CASES[name]
    return {"model": {"input_shape": input_shape, "batch_size": draw(st.integers(1, 8)), "layers": layers}}


@st.composite
def transformer(draw) -> dict:
    family = draw(st.sampled_from(FAMILIES))
    doc = {"model": {"transformer": tiny(family)}}
    training = {"micro_batch": draw(st.integers(1, 4)), "seq_len": draw(st.integers(4, 64)),
                "attention": draw(st.sampled_from(["sdpa", "eager"])), "checkpointing": draw(st.sampled_from(["none", "full"]))}
    adapter = draw(st.sampled_from(["none", "lora", "qlora"]))
    if adapter != "none" and family != "gpt2":
        targets = ["q_proj", "k_proj", "v_proj", "o_proj"] if family in ("mixtral", "qwen3_moe", "phimoe") else "all-linear"  # fused experts: bad-lora by design
        doc["lora"] = {"r": draw(st.sampled_from([4, 8])), "alpha": 16, "target_modules": targets}
        if adapter == "qlora" and family != "phimoe":   # a quantized PhiMoE cannot run: bad-quantization by design
            doc["quantization"] = {"method": "nf4", "double_quant": draw(st.booleans()), "compute_dtype": "bfloat16"}
    doc["training"] = training
    return doc


@st.composite
def run(draw) -> dict:
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": draw(OPTIMIZERS)}
    doc.update(draw(st.one_of(declared(), keras(), transformer())))
    precision = draw(PRECISIONS)
    if precision is not None:
        doc["precision"] = precision
    training = dict(doc.get("training") or {})
    training["optimizer_impl"] = draw(IMPLS)
    training["gradient_accumulation"] = draw(st.sampled_from([1, 1, 4]))
    doc["training"] = training
    return doc


@st.composite
def chunked_loss(draw) -> dict:
    """A transformer's run with a chunked loss (ledger/techniques/chunked_loss.py): torchtune's chunks, LitGPT's
    chunked head, LitGPT full.py's chunked rows or torchtune's LinearCrossEntropyLoss, which rewrite the program and the footprint's saved
    activations in one place."""
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": draw(OPTIMIZERS), **draw(transformer())}
    precision = draw(PRECISIONS)
    if precision is not None:
        doc["precision"] = precision
    kind = draw(st.sampled_from(["chunked", "chunked_head", "chunked_rows", "linear"]))
    size = {"chunks": draw(st.integers(1, 8))} if kind not in ("chunked_head", "chunked_rows") else {"chunk_size": draw(st.integers(1, 32))}
    if kind == "chunked_rows":
        size["shift"] = draw(st.booleans())   # full.py's sliced loss, or pretrain.py's on the data's shifted targets
    doc["training"] = {**doc["training"], "optimizer_impl": draw(IMPLS), "loss": {"kind": kind, **size}}
    return doc


def evaluate(doc: dict):
    result = check(yaml.safe_dump(doc, sort_keys=False))
    errors = [d for d in result.diagnostics if d.severity == "error"]
    # an implementation torch.optim does not have for this optimizer is an error by design
    assume(not any(d.code == "optimizer-impl" for d in errors))
    assert not errors, [(d.code, d.message) for d in errors]
    return result


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def t5_full_checkpointing(attention: str, accumulation: int) -> dict:
    """Hypothesis's rare draw: the tiny T5 (2+2 layers) under full checkpointing, with gradient accumulation so the
    peak is in a backward (a later micro-batch's, the gradients held) where the decoder's first layer is recomputed.
    The walk held the decoder's shared position bias (1, H, s, s) through that recomputation, 3,360 B above the
    footprint's activations at seq_len 42; the bias is freed once the second decoder layer's backward is done."""
    return {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"transformer": tiny("t5")},
            "training": {"micro_batch": 1, "seq_len": 42, "attention": attention, "checkpointing": "full",
                         "optimizer_impl": "foreach", "gradient_accumulation": accumulation}}


@SETTINGS
@given(run())
@example(t5_full_checkpointing("sdpa", 4))
@example(t5_full_checkpointing("eager", 4))
def test_the_peak_and_the_footprint_count_the_same_tensors(doc):
    result = evaluate(doc)
    footprint, peak = result.footprint, result.peak
    assert peak is not None and gated(result) == peak["bytes"] == sum(peak["live"].values())
    live = peak["live"]
    assert all(isinstance(v, int) and v >= 0 for v in live.values())
    # the optimizer state is allocated by an earlier step: the peak holds all of it, as the footprint counts it
    assert live["optimizer_state"] == footprint["optimizer_state"]
    # parameters: the same tensors; a transformer's registered buffers (rotary inv_freq, BERT's ids) beside them
    assert live["parameters"] >= footprint["parameters"]
    if "transformer" not in (doc.get("model") or {}):
        assert live["parameters"] == footprint["parameters"]
    else:
        assert live["parameters"] - footprint["parameters"] <= 64 * 1024
    # what is saved at the peak never exceeds what the footprint says is saved
    assert live["activations"] <= footprint["activations"]
    assert live["gradients"] <= footprint["gradients"]
    # the persistent categories are all there at every moment
    assert peak["bytes"] >= footprint["parameters"] + footprint["optimizer_state"]
    # explain's per-row table is a reduction of the same step
    from memfit.ledger.step import rows_table

    rows = rows_table(result.config.step)
    assert sum(r["parameters"] for r in rows) == live["parameters"]
    assert sum(r["gradients"] for r in rows) == footprint["gradients"]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_no_moment_of_a_t5_step_holds_more_activations_than_the_footprint(attention):
    """Every moment of explain's timeline, not only the peak's: the footprint's activations are the peak of what
    is saved, so no moment of the walk holds more. At the recomputation of T5's first decoder layer the decoder's
    shared position bias is gone (its later layers' checkpoints saved it); before the fix the walk held it there:
    523,908 B (sdpa) against the footprint's 520,548."""
    from memfit.ledger.timeline import timeline

    result = check(yaml.safe_dump(t5_full_checkpointing(attention, 2), sort_keys=False))
    assert not [d for d in result.diagnostics if d.severity == "error"]
    moments = timeline(result.config)
    assert moments, "no timeline"
    worst = max(m["live"]["activations"] for m in moments)
    assert worst <= result.footprint["activations"], (worst, result.footprint["activations"])


@SETTINGS
@given(run(), st.sampled_from([{"data": 1}, {"data": 1, "zero": 0}, {"data": 1, "tensor": 1, "pipeline": 1}]))
def test_a_one_gpu_layout_changes_no_figure(doc, layout):
    alone = evaluate(doc)
    placed = copy.deepcopy(doc)
    placed["parallel"] = layout
    result = evaluate(placed)
    assert result.footprint == alone.footprint
    assert result.peak == alone.peak
    assert gated(result) == gated(alone)


@SETTINGS
@given(run(), st.sampled_from([{"data": 2, "zero": 2}, {"data": 4, "zero": 3}, {"data": 2, "fsdp": "full_shard"}, {"data": 3}]))
def test_data_parallel_ranks_keep_the_single_devices_activations(doc, layout):
    """Each data rank runs the whole model on its own micro-batch: the saved activations it holds are the
    single device's (LoRA, QLoRA and the recipe included). (Its model states may exceed the single device's
    for tiny tensors: ZeRO pads its flat partitions to 2 x data ranks, FSDP pads dim 0.)"""
    # under ZeRO a *-mixed precision is DeepSpeed's 16-bit model, another recipe (test_deepspeed_configs.py)
    assume(not ("zero" in layout and str(doc.get("precision", "")).endswith("-mixed")))
    alone = evaluate(doc)
    placed = copy.deepcopy(doc)
    placed["parallel"] = {**layout, "gpus_per_node": 8}
    result = evaluate(placed)
    assert result.footprint["activations"] == alone.footprint["activations"]


def test_inline_transformer_accepts_every_key_hf_config_accepts(tmp_path):
    """A config.json pasted inline (`model.transformer`) is read as `hf_config` reads the file:
    `_name_or_path`, `transformers_version`, `architectures` and every other key included."""
    raw = dict(tiny("llama"), _name_or_path="meta-llama/Llama-3.2-1B", transformers_version="5.24.0", architectures=["LlamaForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    base = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "training": {"micro_batch": 1, "seq_len": 8}}
    inline = check(yaml.safe_dump({**base, "model": {"transformer": raw}}))
    from_file = check(yaml.safe_dump({**base, "model": {"hf_config": "config.json"}}), path=str(tmp_path / "run.yaml"))
    assert not [d for d in inline.diagnostics if d.severity == "error"], [(d.code, d.message) for d in inline.diagnostics]
    assert inline.footprint == from_file.footprint and inline.peak == from_file.peak


@st.composite
def distilled(draw) -> dict:
    """A transformer student on one device with a distillation teacher (training.teacher): a tiny Llama, wider or
    deeper than the student as a teacher is."""
    doc = draw(run().filter(lambda d: "transformer" in (d.get("model") or {}) and "lora" not in d))
    teacher = hf_measure.tiny("llama", hidden_size=draw(st.sampled_from([64, 128])), num_hidden_layers=draw(st.integers(1, 3)),
                              vocab_size=doc["model"]["transformer"]["vocab_size"])
    doc["training"]["teacher"] = {"transformer": teacher}
    return doc


@SETTINGS
@given(distilled())
def test_the_teachers_weights_are_the_footprints_and_the_peaks(doc):
    """On one device the footprint's parameters are every parameter the device holds, the teacher's too: the peak's
    live parameters (the teacher's weights resident the whole step) are the footprint's."""
    result = evaluate(doc)
    footprint, live = result.footprint, result.peak["live"]
    from memfit.ledger.passes import teacher_weights

    weights = teacher_weights(result.config.step)
    assert weights > 0
    assert live["parameters"] == footprint["parameters"]
    assert footprint["total"] == sum(footprint[c] for c in ("parameters", "gradients", "activations", "optimizer_state"))


@SETTINGS
@given(chunked_loss())
def test_a_chunked_loss_keeps_the_peaks_saved_activations_within_the_footprints(doc):
    result = evaluate(doc)
    footprint, live = result.footprint, result.peak["live"]
    assert 0 <= live["activations"] <= footprint["activations"]
    assert footprint["total"] == sum(footprint[c] for c in ("parameters", "gradients", "activations", "optimizer_state"))
