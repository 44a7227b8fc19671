"""The ranks of a real gloo run on the CPU, for the test workers (ddp_worker.py, deepspeed_worker.py, fsdp_worker.py,
fsdp_offload_worker.py, rank_worker.py): `fork_ranks` forks WORLD processes (torch.multiprocessing's
start_processes, fork: the children inherit the modules imported before, instead of importing them again), each
joins one process group on a FileStore in a temporary folder, runs `body(rank, world, *args)` and writes what it
returns (JSON) to OUT.RANK; the parent gathers them, by rank, into OUT as one JSON list.
"""

import importlib
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def storage_bytes(tensors) -> int:
    """The bytes of the storages behind `tensors`, each storage once."""
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _rank(rank, world, store, out, body, args):
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))  # as a launcher sets them
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    report = body(rank, world, *args)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


def fork_ranks(world: int, out: str, body, *args, preload=()) -> list:
    """Run `body(rank, world, *args)` on `world` forked gloo ranks; write their reports, by rank, to `out` as one JSON
    list (and return it). `preload`: modules imported here first, once, inherited by the ranks."""
    for name in preload:
        importlib.import_module(name)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(world, os.path.join(tmp, "store"), out, body, args), nprocs=world, start_method="fork")
    reports = []
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            reports.append(json.load(f))
        os.remove(f"{out}.{rank}")
    with open(out, "w") as f:
        json.dump(reports, f)
    return reports
