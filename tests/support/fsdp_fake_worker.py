"""One rank of a larger FSDP2 world in a single process, on fake tensors and a fake process group (torchtitan's
memory estimator: `FakeTensorMode`, `torch.testing._internal.distributed.fake_pg.FakeStore`, `FSDPMemTracker`).

Run as a script by tests/placement/test_fsdp_offload.py under a hard timeout:
    python tests/support/fsdp_fake_worker.py WORLD OUT.json CONFIG.json CHECKPOINTING [CHECKPOINTING ...]
The same step as tests/support/fsdp_offload_worker.py (its `step`, the tiny Llama every decoder layer and the model
`fully_shard`ed with CPUOffloadPolicy, a warm step under the same DeviceTracker), but the process is rank 0 of
WORLD on the "fake" backend: no other process, no data, every collective returns at once with outputs of their
real shapes, so a world of 8 or 64 ranks costs one process. The model is built under FakeTensorMode (no bytes
allocated); the tracker counts the fake tensors' storages as it counts real ones.
"""

import json
import sys

import torch
import torch.distributed as dist


def main():
    world, out, config_path, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from fsdp_offload_worker import step

    with open(config_path) as f:
        config = json.load(f)
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    reports = []
    for case in cases:
        reports.append(step(0, world, config, case, fake=FakeTensorMode(allow_non_fake_inputs=True)))
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump([reports], f)


if __name__ == "__main__":
    main()
