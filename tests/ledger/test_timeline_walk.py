"""The timeline is the walk (issue 31), as properties over generated configs (declared tensors, the Keras form,
transformers; gradient accumulation, checkpointing, LoRA, precision recipes, optimizers, ZeRO/FSDP, tensor, sequence and
pipeline layouts): `explain --format json`'s timeline's largest event is `peak.bytes`; every event of the warm step is
an instant of the walk that gives the peak (step.phases' trace; under a parallel layout the binding stage's own
program as ledger.ranks walks it: data parallelism's one program with the rank's shares, tensor and pipeline ranks'
own), in the walk's order, with the walk's live bytes; a module that runs in
a pass has its pre- and post- event there, once each."""

from __future__ import annotations

from dataclasses import replace

import needs
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from memfit.check.pipeline import check
from memfit.ledger import ranks
from memfit.ledger.step import LIVE, phases, rank_trace
from memfit.ledger.timeline import timeline

needs.module("transformers")
import hf_measure  # noqa: E402
import keras_reference as tf  # noqa: E402

FAMILIES = ["llama", "gpt2", "qwen2", "mixtral", "bert", "gpt_neox", "t5", "falcon", "phi3"]
RANKED = tuple(f for f in FAMILIES if f != "t5")  # memfit splits no encoder-decoder's stacks across tensor or pipeline ranks
_TINY: dict = {}


def tiny(family: str) -> dict:
    if family not in _TINY:
        _TINY[family] = hf_measure.tiny(family)
    return _TINY[family]


@st.composite
def declared(draw) -> dict:
    shapes = st.lists(st.integers(1, 300), min_size=1, max_size=3)
    params = draw(st.lists(st.fixed_dictionaries({"shape": shapes}, optional={"count": st.integers(1, 4), "trainable": st.booleans()}), min_size=1, max_size=4))
    acts = draw(st.lists(st.fixed_dictionaries({"shape": shapes}), max_size=3))
    return {"parameters": params, **({"activations": acts} if acts else {})}


@st.composite
def keras(draw) -> dict:
    input_shape, layers = tf.CASES[draw(st.sampled_from(sorted(tf.CASES)))]
    return {"model": {"input_shape": input_shape, "batch_size": draw(st.integers(1, 8)), "layers": layers}}


@st.composite
def transformer(draw, families=tuple(FAMILIES)) -> dict:
    family = draw(st.sampled_from(families))
    doc = {"model": {"transformer": tiny(family)},
           "training": {"micro_batch": draw(st.integers(1, 4)), "seq_len": draw(st.integers(4, 64)),
                        "attention": draw(st.sampled_from(["sdpa", "eager"])), "checkpointing": draw(st.sampled_from(["none", "full"]))}}
    if draw(st.booleans()) and family not in ("gpt2", "mixtral"):
        doc["lora"] = {"r": 8, "alpha": 16, "target_modules": "all-linear"}
    return doc


LAYOUTS = st.sampled_from([None, None, None, {"data": 2, "zero": 2}, {"data": 4, "zero": 3}, {"data": 2, "fsdp": "full_shard"},
                           {"data": 2, "fsdp": "full_shard", "offload": {"parameters": "cpu", "optimizer": "cpu"}}])
# tensor, sequence and pipeline parallelism (a transformer's layers split): each stage's rank walks its own program
RANK_LAYOUTS = st.sampled_from([{"tensor": 2}, {"tensor": 2, "sequence_parallel": True}, {"pipeline": 2},
                           {"pipeline": 2, "schedule": "gpipe"}, {"tensor": 2, "pipeline": 2, "sequence_parallel": True},
                           {"tensor": 2, "data": 2, "zero": 1}, {"pipeline": 2, "data": 2, "zero": 3},
                           {"tensor": 2, "pipeline": 2, "data": 2, "fsdp": "full_shard"}])


@st.composite
def run(draw, ranked: bool = False) -> dict:
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "host": {"memory": "1 TiB"}, "optimizer": draw(st.sampled_from(["adamw", "sgd", "adafactor"]))}
    doc.update(draw(transformer(RANKED) if ranked else st.one_of(declared(), keras(), transformer())))
    doc["precision"] = draw(st.sampled_from(["32-true", "bf16-true", "bf16-mixed"]))
    training = dict(doc.get("training") or {})
    training["gradient_accumulation"] = draw(st.sampled_from([1, 4]))
    doc["training"] = training
    layout = draw(RANK_LAYOUTS if ranked else LAYOUTS)
    if layout is not None:
        doc["parallel"] = {**layout, "gpus_per_node": 8}
    return doc


# LoRA on every linear, the embeddings frozen: the first layer's attention is the last row to run backward, so it
# makes no input gradient and the step's kept tensors go with its nodes (its post-backward edge was 1,536 B over the
# peak with both counted)
LAST_ROW_BACKWARD = {"memfit": 1, "device": {"memory": "1 TiB"}, "host": {"memory": "1 TiB"}, "optimizer": "sgd",
                     "model": {"transformer": tiny("llama")}, "precision": "32-true",
                     "training": {"micro_batch": 1, "seq_len": 4, "attention": "sdpa", "checkpointing": "none", "gradient_accumulation": 1},
                     "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run())
@example(LAST_ROW_BACKWARD)
def test_the_timeline_is_the_walk(doc):
    _the_timeline_is_the_walk(doc)


# a rank whose worst instant is not its program's worst moment with the rank's shares put in: ZeRO-1's gradient
# partitions are held for the whole step, so the rank peaks where the single program's gradients are still few
# (the peak taken at the program's worst moment was 4,096 B under the timeline's largest event)
ZERO_BESIDE_TENSOR = {"memfit": 1, "device": {"memory": "1 TiB"}, "host": {"memory": "1 TiB"}, "optimizer": "adamw",
                      "model": {"transformer": tiny("llama")}, "precision": "32-true",
                      "training": {"micro_batch": 1, "seq_len": 4, "attention": "sdpa", "checkpointing": "none", "gradient_accumulation": 1},
                      "parallel": {"tensor": 2, "data": 2, "zero": 1, "gpus_per_node": 8}}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run(ranked=True))
@example(ZERO_BESIDE_TENSOR)
def test_the_timeline_is_the_binding_stages_walk(doc):
    """Under tensor, sequence and pipeline parallelism (with ZeRO or FSDP beside them, gradient accumulation as the
    pipeline's micro-batches, GPipe or 1F1B), the timeline is the binding stage's own program."""
    _the_timeline_is_the_walk(doc)


def _the_timeline_is_the_walk(doc):
    result = check(yaml.safe_dump(doc, sort_keys=False))
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assume(not any(d.code == "optimizer-impl" for d in errors))
    assert not errors, [(d.code, d.message) for d in errors]
    config = result.config
    events = timeline(config)
    peak = config.placement.peak if "parallel" in doc else config.peak
    assert events and max(e["bytes"] for e in events) == peak["bytes"]
    assert all(e["bytes"] == sum(e["live"].values()) and min(e["live"].values()) >= 0 for e in events)
    # each warm-step event is an instant of the walk, in its order, with its live bytes (under a parallel layout, the
    # binding rank's: the same instants as that rank holds them)
    if "parallel" in doc:
        assert all(e["rank"] == peak["rank"] for e in events)
        if "per_rank" in peak:  # every layout but expert parallelism: the binding stage's own program
            assert ranks.walked(config)
            instants = ranks.binding_trace(config)
            _beside_the_programs_walk(config, instants)
        else:
            instants = rank_trace(config.step, config.placement, config.granule)
        walked = [live for _, _, _, live in instants]
    else:
        trace: list = []
        phases(config.step, trace, edges=True)
        walked = [dict(live) for _, _, live, _ in trace]
    k = 0
    for e in (e for e in events if e["step"] == 2):
        live = {key: e["live"][key] for key in LIVE}
        while k < len(walked) and walked[k] != live:
            k += 1
        assert k < len(walked), (e, "not an instant of the walk, in order")
        k += 1
    # a module that runs in a pass has its pre- and post- event there, once each (a decoder's final norm and its head
    # are rows of their own: model.norm has its post-forward, lm_head its pre-forward; an encoder-decoder's final
    # norm and head are one row of the walk: the norm opens it in forward and closes it in backward, the head the
    # other ends)
    halves = _head_modules(config) if _one_head_row(config) else set()
    for phase, pre, post in (("forward", "pre-forward", "post-forward"), ("backward", "pre-backward", "post-backward")):
        seen: dict = {}
        for e in events:
            if e["step"] == 2 and e["phase"] == phase and e["module"] not in ("loss", "optimizer"):
                seen.setdefault(e["module"], []).extend([e["at"]] if e["at"] in (pre, post) else [])
        for module, ats in seen.items():
            if module in halves:
                assert len(ats) == 1, (module, ats)
            else:
                assert sorted(ats) == sorted([pre, post]), (phase, module, ats)


def _beside_the_programs_walk(config, instants: list) -> None:
    """The binding stage's instants are its program's walk (step.phases' trace, the program fresh or with every
    gradient of earlier micro-batches), phase by phase: the same instants in the same order, with the same
    parameters, gradients, optimizer state and transients, the activations and the overhead each above the walk's
    by one amount for the whole phase (the other micro-batches in flight, the loader's batch, the receive buffers;
    the allocator's rounding). Under ZeRO or FSDP the rank's data-parallel shares replace the first three and
    its gathered unit is among the transients: then only the instants' order and names are the walk's."""
    sharded = config.parallel.engine != "ddp"
    for phase in ("forward", "backward", "optimizer_step"):
        mine = [i for i in instants if i[0] == phase]
        fits = []
        for accumulating in (False, True):
            trace: list = []
            phases(replace(config.step, accumulating=accumulating), trace, edges=True)
            theirs = [(ph, at, edge, live) for ph, at, live, edge in trace if ph == phase]
            if [i[:3] for i in mine] != [i[:3] for i in theirs]:
                continue
            if sharded:
                if ranks.data_only(config):
                    # one program on every data rank: its saved activations and overhead at each instant are the
                    # walk's own (the techniques' rewrites reach the rank), nothing beside them
                    assert all(a[3][k] == b[3][k] for a, b in zip(mine, theirs) for k in ("activations", "overhead")), phase
                fits.append(accumulating)
                continue
            keep = ("parameters", "gradients", "optimizer_state", "transient")
            beside = {(a[3]["activations"] - b[3]["activations"], a[3]["overhead"] - b[3]["overhead"]) for a, b in zip(mine, theirs)}
            if all(a[3][k] == b[3][k] for a, b in zip(mine, theirs) for k in keep) and len(beside) == 1 and min(next(iter(beside))) >= 0:
                fits.append(accumulating)
        assert fits, (phase, "not the stage program's walk")


def _one_head_row(config) -> bool:
    """The final norm and the head are one row of the walk (an encoder-decoder's)."""
    step = getattr(config, "step", None)
    return getattr(config, "model", None) is not None and step is not None and any(r.name == "head" for r in step.rows) \
        and not any(r.name == "final norm" for r in step.rows)


def _head_modules(config) -> set:
    from memfit.ledger.timeline import module_namer

    namer = module_namer(config)
    return {namer("head", "pre-forward"), namer("head", "post-forward")}
