"""One real FSDP2 training step per rank (torch's `fully_shard`, gloo on CPU) of a tiny transformers Llama under bf16
CPU autocast with transformers' gradient checkpointing, reporting the peak of each phase under torch's FSDPMemTracker
(its bytes by FSDPMemTracker's category and the module it is in).

Run as a script by tests/ledger/test_fsdp_cast_cache.py under a hard timeout:
    python tests/support/fsdp2_cast_worker.py WORLD OUT.json ACCUMULATION CACHE(0|1)
(CACHE: autocast's cache_enabled)
Each decoder layer and then the model are `fully_shard`ed (fp32 parameters, no MixedPrecisionPolicy: autocast casts);
SGD over the model's (sharded) parameters; two warm steps, then FSDPMemTracker around the third, its peak noted per
phase. The worker also reports what autocast's `can_try_cache` (aten/src/ATen/autocast_mode.cpp) tests of a decoder
layer's linear weight while that layer runs its forward: whether it is a leaf, a view, fp32 and requires a gradient.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from gloo_ranks import fork_ranks  # noqa: E402

from fsdp1_cast_worker import LAYERS, MICRO_BATCH, SEQ_LEN, config  # noqa: E402,F401  (the same run as FSDP1's)


def gloo_copy(model, world: int) -> int:
    """Bytes of gloo's own copy of the root unit's reduce-scatter input, from torch's code: foreach_reduce
    (_fsdp_collectives.py) allocates that input as the unit's gradients, each padded on dim 0 to the world size
    (`_get_dim0_padded_size`), in the gradients' dtype (no reduce_dtype: the fp32 parameters'), and hands it to
    dist.reduce_scatter_single; ProcessGroupGloo::_reduce_scatter_base -> reduce_scatter_tensor_coalesced
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) clones each input (`buffers.push_back(inputTensors[i].clone())`)
    and all-reduces the clone, copying the rank's chunk out; ProcessGroupNCCL::_reduce_scatter_base reduces from the
    input in place (reduceScatterSingleImpl, ncclReduceScatter(input.data_ptr(), output.data_ptr(), ...)): no copy.
    0 where the process group is not gloo."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_common import _get_dim0_padded_size

    if dist.get_backend() != "gloo":
        return 0
    group = model._get_fsdp_state()._fsdp_param_group
    return sum(_get_dim0_padded_size(p._orig_size, world).numel() * p.sharded_param.element_size()
               for p in group.fsdp_params)


def body(rank, world, accumulation, cache):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import hf_measure
    import peak_reference as ref

    class Phases(FSDPMemTracker):
        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            now = self._curr_mem_snap[ref.CPU]["Total"]
            # the innermost module running (FSDPMemTracker's names: the model's class, then its module path)
            inner = max((m for m in self._mod_tracker.parents if m != "Global"), key=len, default="")
            if self.phase == "forward":  # the forward's worst by innermost module (the embeddings' moment)
                name = inner.partition(".")[2]
                self.by_module[name] = max(self.by_module.get(name, 0), now)
            if now > self.peaks.get(self.phase, 0):
                self.peaks[self.phase] = now
                self.at_peak[self.phase] = {getattr(k, "value", k): v for k, v in self._curr_mem_snap[ref.CPU].items() if v}
                self.at_peak[self.phase]["module"] = inner.partition(".")[2]

    cfg = config()
    model = hf_measure.build(cfg, "sdpa", "32-true", None)
    model.activation_checkpointing_enable()
    # what autocast would cache of a plain module's weights: a bf16 cast of every checkpointed layer's linear weight
    # (all trained: leaves that require a gradient), unsharded
    casts = 2 * sum(m.weight.numel() for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    seen = {}
    probe = model.model.layers[1].self_attn.q_proj

    def look(module, args):
        w = module.weight
        seen.update(leaf=w.is_leaf, view=w._is_view(), fp32=w.dtype == torch.float32, requires_grad=w.requires_grad,
                    dtensor=type(w).__name__ == "DTensor", shape=list(w.shape))

    hook = probe.register_forward_pre_hook(look)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=False)
    batch = hf_measure.inputs(cfg, MICRO_BATCH, SEQ_LEN, seed=1 + rank)
    x, y = batch["input_ids"], batch["labels"]

    tracker = Phases(model, opt)
    tracker.peaks, tracker.at_peak, tracker.by_module = {}, {}, {}
    # the loss (transformers computes it in the model's forward, after the head): its own phase, as memfit's timeline
    head = model.module.lm_head if hasattr(model, "module") else model.lm_head
    head.register_forward_hook(lambda *_: setattr(tracker, "phase", "loss"))
    tracker = ref.warm_step(model, opt, x, y, accumulation,
                            lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache), tracker)
    hook.remove()
    return {"gloo_copy": gloo_copy(model, world), "peaks": tracker.peaks, "bytes": tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"], "casts": casts, "at_peak": tracker.at_peak,
            "weight": seen, "by_module": tracker.by_module}


if __name__ == "__main__":
    world, out, accumulation, cache = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    fork_ranks(world, out, body, accumulation, cache,
               preload=("torch.distributed.fsdp", "transformers", "hf_measure", "peak_reference"))
