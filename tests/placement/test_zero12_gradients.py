"""DeepSpeed ZeRO-1/2's gradients where they live (runtime/zero/stage_1_and_2.py, deepspeed 0.19.8), measured.

The rank's 16-bit gradients do not exist before its backward makes them: ZeRO-1's are the parameters' `.grad`, made
as the backward runs; ZeRO-2's partition is allocated at the first gradient the backward copies into it
(`copy_grads_in_partition`: `self.grads_in_partition = torch.empty(...)` when None) and freed by the step
(`free_grad_in_param_list`). The fp32 gradient partition exists only in the step (`single_grad_partition =
flat_grad_partition.to(fp32)`, `.grad = None` after `_optimizer_step`; `initialize_optimizer_states` frees the one
it makes at construction). memfit counted every one of them from the first instant of the forward: at a backward
peak (the activations at their largest, before any gradient) it was 1.22x (ZeRO-1) and 1.17x (ZeRO-2) the measured
figure, and at an optimizer-step peak 1.16x / 1.08x.

tests/support/deepspeed_worker.py runs a tiny Llama under `deepspeed.initialize` on two gloo ranks (DeepSpeed's CPU
accelerator), bf16 with torch's AdamW (foreach, or fused: no temporaries), `reduce_bucket_size` 20,000, MemTracker
around a warm step; memfit's figure
is `memfit check --format json` on the same run written as a config a user writes (DeepSpeed's bf16 recipe:
`precision: bf16-true`, `master_weights: float32`, `training.grad_accum_dtype: float32`, as read/native/deepspeed.py
reads a DeepSpeed JSON), within 5% on every rank: one shape whose peak is the loss's backward, one whose peak is the
optimizer step.

With gradient accumulation (`gradient_accumulation_steps` 2: the step measured is two micro-batches) the same shapes
are checked through memfit's readers as a user writes the run: the Trainer's argument file (hf-trainer) with the
DeepSpeed config inline, `--gpus 2`. ZeRO-1 keeps the parameters' 16-bit `.grad` across the micro-batches (reduced at
the boundary only); ZeRO-2 reduces each micro-batch's gradients into its partition, which stays allocated between
them (`grads_in_partition`): a later micro-batch runs with them from its first instant.

`data_types.grad_accum_dtype: fp32` under bf16 with ZeRO-1 is DeepSpeed's BF16_Optimizer, not stage_1_and_2.py
(engine.py `_do_optimizer_sanity_check`; runtime/bf16_optimizer.py): an fp32 gradient buffer of the whole model
(`fp32_groups_gradients_flat`, not partitioned, made at construction and held throughout), the parameters' bf16
`.grad` accumulated into it after each backward and kept until the step's `zero_grad`, and the buffer all-reduced
through a bf16 copy of it (engine.py `allreduce_bucket`: `tensor.to(communication_data_type)`, bf16 under bf16).
memfit's DeepSpeed reader says so (`parallel.bf16_optimizer: true`, no `not-modelled` warning) and memfit counts it:
within 5%. ZeRO-2 with it stays stage_1_and_2.py's, its gradient partition in fp32: within 5%.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parents[1] / "support"
sys.path.insert(0, str(HERE))
import needs  # noqa: E402

BAND = 0.05
BUCKET = 20_000
MODEL = {"model_type": "llama", "vocab_size": 250, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 128, "attention_dropout": 0.0,
         "tie_word_embeddings": False, "use_cache": False}
# (micro_batch, seq_len, the optimizer's implementation): a backward peak, an optimizer-step peak, and an optimizer
# step without temporaries (fused AdamW), where the step's worst moment is the conversion of the gradients to fp32
RUNS = ((2, 64, "foreach"), (1, 8, "foreach"), (1, 8, "fused"))
STAGES = (1, 2)
# DeepSpeed's step flattens the rank's 16-bit gradients into a copy (stage_1_and_2.py step:
# `flatten(self.averaged_gradients[i])`) alive beside the 16-bit and the fp32 gradient partitions at the conversion:
# with fused AdamW (no temporaries) that is the step's worst moment: without the copy memfit was 1,166,624 B against
# 1,272,816 B (rank 1) and 1,280,880 B (rank 0), 0.917. Measured gaps would be strict xfails here, with their numbers.
GAPS: dict = {}
# gradient accumulation: (micro_batch, seq_len, accumulation steps), ZeRO-1 and ZeRO-2, foreach AdamW
ACCUM_RUNS = ((2, 64, 2), (1, 8, 2))
# grad_accum_dtype fp32 under bf16, ZeRO-1 (DeepSpeed's BF16_Optimizer) and ZeRO-2 (stage_1_and_2.py's, its gradient
# partition in fp32): (micro_batch, seq_len, accumulation steps)
BF16_RUNS = ((2, 64, 1), (1, 8, 2))
# measured (deepspeed 0.19.8, both ranks alike), ZeRO-1: at 2x64 the loss's backward with the whole fp32 gradient
# buffer held, 2,359,600 B; at 1x8 (one micro-batch or two) the all-reduce after the backward, 1,696,940 B (the
# buffer, the bf16 .grad and the bf16 copy all-reduced, 212,096 B each, beside the parameters, the master partition
# and Adam's state). Before BF16_Optimizer was modelled memfit counted stage_1_and_2.py's fp32 gradient partition of
# the step: 1,936,420 B (0.821) and 1,272,704 B (0.750), strict xfails here; now 2,360,612 B and 1,696,896 B.


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    needs.module("torch")
    needs.module("transformers")
    needs.module("deepspeed")
    tmp = tmp_path_factory.mktemp("zero12")
    runs = [{"stage": z, "micro_batch": b, "seq_len": s, "impl": impl} for b, s, impl in RUNS for z in STAGES]
    runs += [{"stage": z, "micro_batch": b, "seq_len": s, "impl": "foreach", "accum": a} for b, s, a in ACCUM_RUNS for z in STAGES]
    runs += [{"stage": z, "micro_batch": b, "seq_len": s, "impl": "foreach", "accum": a, "grad_accum_dtype": "fp32"} for b, s, a in BF16_RUNS for z in STAGES]
    spec, out = tmp / "case.json", tmp / "ranks.json"
    spec.write_text(json.dumps({"model": MODEL, "reduce_bucket": BUCKET, "runs": runs}))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, str(HERE / "deepspeed_worker.py"), "2", str(out), str(spec)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict = {}
    for per_rank in json.loads(out.read_text()):
        for report in per_rank:
            fp32 = report["grad_accum_dtype"] == "fp32"
            # stage_1_and_2.py's, or the BF16_Optimizer that ZeRO-1 with an fp32 grad_accum_dtype is
            assert report["optimizer"] == ("BF16_Optimizer" if fp32 and report["stage"] == 1 else "DeepSpeedZeroOptimizer")
            key = (report["stage"], report["micro_batch"], report["seq_len"], report["impl"])
            if report["accum"] > 1 or fp32:
                key = ("fp32" if fp32 else "bf16", *key, report["accum"])
            found.setdefault(key, []).append(report["bytes"])
    return found


def checked(tmp_path: Path, stage: int, micro_batch: int, seq_len: int, impl: str) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(MODEL))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "precision": "bf16-true", "master_weights": "float32", "optimizer": "adamw",
           "model": {"hf_config": "config.json"},
           "training": {"micro_batch": micro_batch, "seq_len": seq_len, "attention": "sdpa", "optimizer_impl": impl, "grad_accum_dtype": "float32"},
           "parallel": {"data": 2, "zero": stage, "buckets": {"reduce": BUCKET}}}
    path = tmp_path / f"zero{stage}-{micro_batch}x{seq_len}-{impl}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads(done.stdout)["files"][0]
    return {"peak": entry["peak"], "footprint": entry["footprint"]}


CASES = [pytest.param(b, s, impl, marks=[pytest.mark.xfail(strict=True, reason=GAPS[(b, s, impl)])] if (b, s, impl) in GAPS else [],
                      id=f"{b}x{s}-{impl}") for b, s, impl in RUNS]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("micro_batch, seq_len, impl", CASES)
@pytest.mark.parametrize("stage", STAGES)
def test_zero12_rank_peak_within_five_percent_of_deepspeed(tmp_path, measured, stage, micro_batch, seq_len, impl):
    ours = checked(tmp_path, stage, micro_batch, seq_len, impl)
    peak, footprint = ours["peak"], ours["footprint"]
    theirs = measured[(stage, micro_batch, seq_len, impl)]
    assert len(theirs) == 2
    for bytes_ in theirs:
        assert abs(peak["bytes"] - bytes_) <= BAND * bytes_, (peak["bytes"], bytes_, peak["bytes"] / bytes_)
    # the gradients at every instant of the step would be the footprint's: more than 5% over the measured figure
    # (at the step's conversion every gradient the footprint counts is live anyway)
    if peak["phase"] != "optimizer_step" or impl != "fused":
        held_throughout = peak["bytes"] - peak["live"]["gradients"] + footprint["gradients"]
        assert held_throughout > (1 + BAND) * max(theirs), (held_throughout, theirs)


def trainer_checked(tmp_path: Path, stage: int, micro_batch: int, seq_len: int, accum: int, grad_accum_dtype: str | None = None) -> dict:
    """`memfit check --gpus 2` of the run as a Trainer's argument file with its DeepSpeed config inline (the values
    "auto" where the Trainer fills them in), read by memfit's hf-trainer and DeepSpeed readers."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(MODEL))
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}, "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET}}
    if grad_accum_dtype:
        ds["data_types"] = {"grad_accum_dtype": grad_accum_dtype}
    args = {"model_name_or_path": "model", "output_dir": "out", "per_device_train_batch_size": micro_batch, "gradient_accumulation_steps": accum,
            "max_seq_length": seq_len, "bf16": True, "optim": "adamw_torch", "attn_implementation": "sdpa", "deepspeed": ds}
    path = tmp_path / f"zero{stage}-{micro_batch}x{seq_len}-accum{accum}.json"
    path.write_text(json.dumps(args))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--gpus", "2", "--budget", "1TiB", str(path)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads(done.stdout)["files"][0]
    assert entry["input_format"] == "hf-trainer"
    # the BF16_Optimizer that ZeRO-1 with an fp32 grad_accum_dtype is, modelled: no not-modelled warning at the key
    said = [d for d in entry["diagnostics"] if d["code"] == "not-modelled" and "grad_accum_dtype" in d["message"]]
    assert not said, entry["diagnostics"]
    return entry["peak"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("micro_batch, seq_len, accum", ACCUM_RUNS, ids=[f"{b}x{s}-accum{a}" for b, s, a in ACCUM_RUNS])
@pytest.mark.parametrize("stage", STAGES)
def test_zero12_with_gradient_accumulation_within_five_percent_of_deepspeed(tmp_path, measured, stage, micro_batch, seq_len, accum):
    peak = trainer_checked(tmp_path, stage, micro_batch, seq_len, accum)
    theirs = measured[("bf16", stage, micro_batch, seq_len, "foreach", accum)]
    assert len(theirs) == 2
    for bytes_ in theirs:
        assert abs(peak["bytes"] - bytes_) <= BAND * bytes_, (peak["bytes"], bytes_, peak["bytes"] / bytes_)
    one = measured.get((stage, micro_batch, seq_len, "foreach"))
    if peak["phase"] == "backward" and one is not None:
        # the later micro-batch's backward with the gradients of the first held: more than the step of one
        assert min(theirs) > max(one), (theirs, one)


BF16_CASES = [pytest.param(z, b, s, a, id=f"zero{z}-{b}x{s}-accum{a}") for b, s, a in BF16_RUNS for z in STAGES]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("stage, micro_batch, seq_len, accum", BF16_CASES)
def test_fp32_gradient_accumulation_within_five_percent_of_deepspeed(tmp_path, measured, stage, micro_batch, seq_len, accum):
    """ZeRO-2 with grad_accum_dtype fp32 stays stage_1_and_2.py's (its fp32 partition of the step, as without it);
    ZeRO-1 with it is the BF16_Optimizer (its whole fp32 gradient buffer held throughout, parallel.bf16_optimizer)."""
    peak = trainer_checked(tmp_path, stage, micro_batch, seq_len, accum, grad_accum_dtype="fp32")
    theirs = measured[("fp32", stage, micro_batch, seq_len, "foreach", accum)]
    assert len(theirs) == 2
    for bytes_ in theirs:
        assert abs(peak["bytes"] - bytes_) <= BAND * bytes_, (peak["bytes"], bytes_, peak["bytes"] / bytes_)
