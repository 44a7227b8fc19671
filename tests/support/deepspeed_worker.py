"""One rank's peak under DeepSpeed ZeRO-1/2 (stage_1_and_2.py): a real run on gloo (CPU), MemTracker around a warm step.

Run as a script by tests/placement/test_zero12_gradients.py under a hard timeout:
    python tests/support/deepspeed_worker.py WORLD OUT.json CASE.json
CASE.json: {"model": a Llama config.json (dict), "reduce_bucket": elements, "runs": [{"micro_batch", "seq_len",
"stage": 1 | 2, "impl": "foreach" | "fused", "accum": gradient_accumulation_steps (default 1), "grad_accum_dtype":
data_types.grad_accum_dtype ("fp32"; default unset: the bf16 of the model)}, ...]}: each run a model and engine of
its own, in the same process group. The step measured is `accum` micro-batches (forward, `engine.backward`,
`engine.step`: DeepSpeed steps the optimizer at the last). ZeRO-1 with grad_accum_dtype fp32 under bf16 is DeepSpeed's
BF16_Optimizer (engine.py _do_optimizer_sanity_check), whose fp32 gradient buffer of the whole model
(`fp32_groups_gradients_flat`, made at construction) is given to MemTracker with the master partitions.

transformers' LlamaForCausalLM under `deepspeed.initialize` on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu: its
communication backend is gloo where oneCCL is not installed), bf16 (16-bit parameters and gradients, the fp32
master partition), torch's AdamW (foreach or fused) as the basic optimizer, `reduce_bucket_size` as given, the rest of
zero_optimization at DeepSpeed's defaults (contiguous_gradients true, overlap_comm false). MemTracker's dispatch mode
sees every tensor DeepSpeed allocates during the step (the reduce buckets, the gradient partitions, the fp32
gradient partition of the step); the model's 16-bit parameters, the fp32 master partitions and the optimizer state
are given to it as external tensors, held from the start. Every rank reports MemTracker's peak and its categories.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import fork_ranks  # noqa: E402
from rank_worker import CPU, Tracker, build  # noqa: E402


def run(rank, world, case):
    return [one(rank, dict(case, **r)) for r in case["runs"]]


def one(rank, case):
    import deepspeed

    model = build(case)
    fused = case.get("impl") == "fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=not fused, fused=fused)
    accum = case.get("accum", 1)
    ds = {"train_micro_batch_size_per_gpu": case["micro_batch"], "gradient_accumulation_steps": accum, "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": case["stage"], "reduce_bucket_size": case["reduce_bucket"]}}
    if case.get("grad_accum_dtype"):
        ds["data_types"] = {"grad_accum_dtype": case["grad_accum_dtype"]}
    engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds, dist_init_required=False)
    g = torch.Generator().manual_seed(rank)
    vocab = case["model"]["vocab_size"]
    ids = torch.randint(0, vocab, (case["micro_batch"], case["seq_len"]), generator=g)
    labels = torch.randint(0, vocab, (case["micro_batch"], case["seq_len"]), generator=g)

    def step():
        for _ in range(accum):
            logits = engine(input_ids=ids).logits
            loss = F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
            del logits
            engine.backward(loss)
            engine.step()

    for _ in range(2):
        step()
    tracker = Tracker()
    # stage_1_and_2.py's fp32 master partitions, or BF16_Optimizer's and its whole fp32 gradient buffers
    held = list(getattr(zero, "single_partition_of_fp32_groups", None) or [*zero.fp32_groups_flat_partition, *zero.fp32_groups_gradients_flat])
    tracker.track_external(engine.module, zero.optimizer, *held, ids, labels)
    with tracker:
        step()
    snap = tracker.get_tracker_snapshot("peak")[CPU]
    cats = {(k.value if hasattr(k, "value") else str(k)): v for k, v in snap.items()}
    return {"rank": rank, "stage": case["stage"], "impl": case.get("impl", "foreach"), "micro_batch": case["micro_batch"], "seq_len": case["seq_len"],
            "accum": accum, "grad_accum_dtype": case.get("grad_accum_dtype"), "bytes": snap["Total"], "categories": cats, "optimizer": type(zero).__name__}


def main():
    world, out, case_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with open(case_path) as f:
        case = json.load(f)
    fork_ranks(world, out, run, case, preload=("deepspeed", "transformers.models.llama.modeling_llama"))


if __name__ == "__main__":
    main()
