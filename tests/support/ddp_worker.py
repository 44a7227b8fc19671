"""One rank's peak under PyTorch DistributedDataParallel: a real run on gloo (CPU), MemTracker around one warm step.

Run as a script by tests/placement/test_ddp_buckets.py under a hard timeout:
    python tests/support/ddp_worker.py WORLD OUT.json CASE.json
CASE.json: {"model": a Llama config.json (dict), "micro_batch", "seq_len", "gradient_as_bucket_view": bool}.

transformers' LlamaForCausalLM wrapped in DistributedDataParallel (its default bucket_cap_mb), AdamW (foreach),
`zero_grad(set_to_none=True)` after each step. The reducer's buckets are allocated in C++ at DDP's construction,
where MemTracker's dispatch mode does not see them: a communication hook (the default all-reduce of the bucket's
mean, torch's allreduce_hook) hands each bucket's flat tensor to the worker, which gives them to MemTracker as
external tensors beside the model and optimizer, so its peak counts the buckets from the start of the step.
Every rank reports MemTracker's peak (bytes), its categories, the buckets' bytes and the gradients' storage bytes.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import fork_ranks, storage_bytes  # noqa: E402
from rank_worker import CPU, Tracker, build  # noqa: E402


def run(rank, world, case):
    model = build(case)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=case["gradient_as_bucket_view"])
    buckets = {}

    def hook(state, bucket):  # torch's allreduce_hook: the bucket's mean across the ranks, in place
        buffer = bucket.buffer()
        buckets[bucket.index()] = buffer
        buffer.div_(world)
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(rank)
    vocab = case["model"]["vocab_size"]
    ids = torch.randint(0, vocab, (case["micro_batch"], case["seq_len"]), generator=g)
    labels = torch.randint(0, vocab, (case["micro_batch"], case["seq_len"]), generator=g)

    def step():
        logits = ddp(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
        del logits
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # the reducer rebuilds its buckets once, in the second iteration's forward
        step()
    held = list(buckets.values())
    tracker = Tracker()
    tracker.track_external(model, optimizer, ids, labels, *held)
    with tracker:
        step()
    snap = tracker.get_tracker_snapshot("peak")[CPU]
    return {"rank": rank, "bytes": snap["Total"], "categories": {(k.value if hasattr(k, "value") else str(k)): v for k, v in snap.items()},
            "buckets": storage_bytes(held), "gradients": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)}


def main():
    world, out = int(sys.argv[1]), sys.argv[2]
    with open(sys.argv[3]) as f:
        case = json.load(f)
    fork_ranks(world, out, run, case, preload=("transformers.models.llama.modeling_llama",))


if __name__ == "__main__":
    main()
