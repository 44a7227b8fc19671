"""torchtune's OffloadActivations (torchtune/training/_activation_offloading.py, commit 05cda5e9, use_streams=True:
its default on torch >= 2.5) run on the CPU, for MemTracker.

The class creates CUDA streams, so it cannot run here; this is its pack/unpack logic line for line with the device
parts replaced: the host copy (`torch.empty_like(activation, pin_memory=..., device="cpu")` + `copy_`) is a numpy
array (memory MemTracker does not see, as it does not see pinned host memory on a GPU), the copy back
(`maybe_gpu_tensor.to("cuda", non_blocking=True)`) is a new torch tensor made from it (a tracked allocation, as the
device copy is), stream waits and events are dropped (their only effect on memory is how long a tensor stays
referenced, which the stashes below keep as the class does). What stays on the device:
- tensors under min_offload_size (1024 bytes) and nn.Parameter / nn.Buffer instances (pack_tensor's test; a
  weight's transposed view is neither, so it is copied out and back like an activation);
- the forward stash: each offloaded tensor stays referenced until a tensor `max_fwd_stash_size` (5) ids later is
  packed (pack_tensor's loop over fwd_stash), and what is still there at the first backward node is used directly;
- in backward, the tensors brought back for one autograd node stay until the next node's hook has run
  (unpack_tensor_with_streams: prev_node_ids, bwd_tensor_stash).
torchtune's recipes put the output projection under NoOpManager (training/_activation_offloading.py
get_act_offloading_ctx_manager: `model.output` forward pre-/post-hooks) and compute the loss outside the context
(recipes/full_finetune_single_device.py _loss_step): their saved tensors stay on the device.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.autograd.graph import saved_tensors_hooks


class _Host:
    """A tensor's bytes in host memory, outside the tracked allocator."""

    def __init__(self, t: torch.Tensor):
        self.shape, self.dtype = t.shape, t.dtype
        flat = t.detach().reshape(-1)
        self.bytes = flat.view(torch.uint8).numpy().copy() if flat.numel() else np.zeros(0, np.uint8)

    def to_device(self) -> torch.Tensor:
        return torch.from_numpy(self.bytes).view(self.dtype).reshape(self.shape).clone()


class CPUOffloadActivations(saved_tensors_hooks):
    def __init__(self, max_fwd_stash_size: int = 5, min_offload_size: int = 1024):
        self.min_tensor_size_bytes = min_offload_size
        self.tracker: dict = {}
        self.tensor_id = 0
        self.is_first_forward_call = True
        self.is_first_backward_call = True
        self.fwd_stash: dict = {}
        self.max_fwd_stash_size = max_fwd_stash_size
        self.bwd_tensor_stash: dict = {}
        self.curr_graph_id = None
        self.curr_autograd_node = None
        self.host_bytes = 0  # what the host holds at most (the offloaded copies)
        self._host_now = 0

        def pack_tensor(activation: torch.Tensor) -> int:
            if self.is_first_forward_call:
                assert len(self.tracker) == 0, "backward pass should have cleared tracker of all tensors"
                self.is_first_forward_call = False
                self.is_first_backward_call = True
            num_bytes = activation.element_size() * activation.nelement()
            self.tensor_id += 1
            tensor_id = self.tensor_id
            if num_bytes >= self.min_tensor_size_bytes and (
                not isinstance(activation, torch.nn.Parameter) and not isinstance(activation, torch.nn.Buffer)
            ):
                for id in list(self.fwd_stash.keys()):
                    if id <= tensor_id - self.max_fwd_stash_size:
                        del self.fwd_stash[id]
                    else:
                        break
                self.tracker[tensor_id] = (_Host(activation), True)
                self._host_now += num_bytes
                self.host_bytes = max(self.host_bytes, self._host_now)
                self.fwd_stash[tensor_id] = (activation, None)
            else:
                self.tracker[tensor_id] = (activation, False)
            return tensor_id

        def unpack_tensor(unpack_tensor_id: int) -> torch.Tensor:
            if self.is_first_backward_call:
                self.curr_graph_id = torch._C._current_graph_task_id()

                def wait_and_del_remaining_references() -> None:
                    for id in list(self.bwd_tensor_stash.keys()):
                        del self.bwd_tensor_stash[id]

                torch.autograd.variable.Variable._execution_engine.queue_callback(wait_and_del_remaining_references)
                self.is_first_backward_call = False
                self.is_first_forward_call = True
            maybe_gpu_tensor, modified = self.tracker[unpack_tensor_id]
            if modified:
                host = maybe_gpu_tensor
                self._host_now -= host.bytes.nbytes
                graph_id = torch._C._current_graph_task_id()
                node = torch._C._current_autograd_node()
                prev_node_ids = []
                if graph_id == self.curr_graph_id and self.curr_autograd_node != node:
                    self.curr_autograd_node = node
                    prev_node_ids = list(self.bwd_tensor_stash.keys())
                brought_back_from_cpu = True
                if unpack_tensor_id in self.fwd_stash:
                    maybe_gpu_tensor = self.fwd_stash[unpack_tensor_id][0]
                    brought_back_from_cpu = False
                else:
                    maybe_gpu_tensor = host.to_device()
                    self.bwd_tensor_stash[unpack_tensor_id] = maybe_gpu_tensor

                def hook(outputs, inputs):
                    if brought_back_from_cpu:
                        unpacked = self.bwd_tensor_stash.get(unpack_tensor_id)
                        if unpacked is not None and any(
                            o is not None and o.untyped_storage() is unpacked.untyped_storage() for o in outputs
                        ):
                            del self.bwd_tensor_stash[unpack_tensor_id]
                    for id in list(self.fwd_stash.keys()):
                        del self.fwd_stash[id]
                    for id in prev_node_ids:
                        self.bwd_tensor_stash.pop(id, None)
                    return outputs

                node.register_hook(hook)
            del self.tracker[unpack_tensor_id]
            return maybe_gpu_tensor

        super().__init__(pack_tensor, unpack_tensor)


class NoOp(saved_tensors_hooks):
    """torchtune's NoOpManager: the innermost hooks win, so what runs under it is saved as it is."""

    def __init__(self):
        super().__init__(lambda t: t, lambda t: t)


class CPUSaveOnCPU(saved_tensors_hooks):
    """torch's save_on_cpu (torch/autograd/graph.py; what the Trainer's activation_checkpointing_kwargs {offload: true}
    puts around each checkpoint) run on the CPU: every saved tensor, whatever its size and a parameter too, is copied to
    host memory when it is saved (`packed.copy_(tensor)` into a pinned `torch.empty`; here a numpy array, which
    MemTracker does not see) and brought back as a new device tensor each time a node unpacks it (`tensor.to(device)`;
    here a tracked copy). Nothing else is kept: no size threshold, no forward stash, no backward stash (the brought
    back tensor lives while the node that unpacked it uses it). On the CPU torch's own class cannot stand in: its
    `tensor.cpu()` of a CPU tensor is that tensor."""

    def __init__(self):
        self.host_bytes = 0

        def pack_to_cpu(tensor: torch.Tensor) -> _Host:
            host = _Host(tensor)
            self.host_bytes += host.bytes.nbytes
            return host

        def unpack_from_cpu(host: _Host) -> torch.Tensor:
            return host.to_device()

        super().__init__(pack_to_cpu, unpack_from_cpu)
