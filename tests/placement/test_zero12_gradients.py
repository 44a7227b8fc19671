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


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    needs.module("torch")
    needs.module("transformers")
    needs.module("deepspeed")
    tmp = tmp_path_factory.mktemp("zero12")
    runs = [{"stage": z, "micro_batch": b, "seq_len": s, "impl": impl} for b, s, impl in RUNS for z in STAGES]
    spec, out = tmp / "case.json", tmp / "ranks.json"
    spec.write_text(json.dumps({"model": MODEL, "reduce_bucket": BUCKET, "runs": runs}))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, str(HERE / "deepspeed_worker.py"), "2", str(out), str(spec)], capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict = {}
    for per_rank in json.loads(out.read_text()):
        for report in per_rank:
            assert report["optimizer"] == "DeepSpeedZeroOptimizer"  # stage_1_and_2.py's, not the BF16_Optimizer
            found.setdefault((report["stage"], report["micro_batch"], report["seq_len"], report["impl"]), []).append(report["bytes"])
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
