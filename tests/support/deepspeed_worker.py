"""One rank's peak under DeepSpeed ZeRO-1/2 (stage_1_and_2.py): a real run on gloo (CPU), MemTracker around a warm step.

Run as a script by tests/placement/test_zero12_gradients.py under a hard timeout:
    python tests/support/deepspeed_worker.py WORLD OUT.json CASE.json
CASE.json: {"model": a Llama config.json (dict), "reduce_bucket": elements, "runs": [{"micro_batch", "seq_len",
"stage": 1 | 2, "impl": "foreach" | "fused"}, ...]}: each run a model and engine of its own, in the same process group.

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
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rank_worker import CPU, Tracker, build  # noqa: E402


def run(rank, world, case, store, out):
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    reports = [one(rank, dict(case, **r)) for r in case["runs"]]
    with open(f"{out}.{rank}", "w") as f:
        json.dump(reports, f)
    dist.destroy_process_group()


def one(rank, case):
    import deepspeed

    model = build(case)
    fused = case.get("impl") == "fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=not fused, fused=fused)
    ds = {"train_micro_batch_size_per_gpu": case["micro_batch"], "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": case["stage"], "reduce_bucket_size": case["reduce_bucket"]}}
    engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds, dist_init_required=False)
    g = torch.Generator().manual_seed(rank)
    vocab = case["model"]["vocab_size"]
    ids = torch.randint(0, vocab, (case["micro_batch"], case["seq_len"]), generator=g)
    labels = torch.randint(0, vocab, (case["micro_batch"], case["seq_len"]), generator=g)

    def step():
        logits = engine(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
        del logits
        engine.backward(loss)
        engine.step()

    for _ in range(2):
        step()
    tracker = Tracker()
    masters = list(zero.single_partition_of_fp32_groups)
    tracker.track_external(engine.module, zero.optimizer, *masters, ids, labels)
    with tracker:
        step()
    snap = tracker.get_tracker_snapshot("peak")[CPU]
    cats = {(k.value if hasattr(k, "value") else str(k)): v for k, v in snap.items()}
    return {"rank": rank, "stage": case["stage"], "impl": case.get("impl", "foreach"), "micro_batch": case["micro_batch"], "seq_len": case["seq_len"],
            "bytes": snap["Total"], "categories": cats, "optimizer": type(zero).__name__}


def main():
    world, out, case_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401  (imported once, inherited by the forked ranks)
    import transformers.models.llama.modeling_llama  # noqa: F401

    with open(case_path) as f:
        case = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(run, args=(world, case, os.path.join(tmp, "store"), out), nprocs=world, start_method="fork")
    reports = []
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            reports.append(json.load(f))
        os.remove(f"{out}.{rank}")
    with open(out, "w") as f:
        json.dump(reports, f)


if __name__ == "__main__":
    main()
