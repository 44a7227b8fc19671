"""Each rank's peak under tensor, sequence and pipeline parallelism: real runs on gloo (CPU), one
MemTracker per rank around one warm training step.

Run as a script by tests/placement/test_ranks.py under a hard timeout:
    python tests/support/rank_worker.py WORLD OUT.json CASE.json
CASE.json: {"model": a Llama config.json (dict), "micro_batch", "seq_len", "mode": "tp" | "sp" | "gpipe" | "1f1b",
"micro_batches" (pipeline: the schedule's micro-batches)}.

- "tp": Megatron's tensor parallelism with DTensor plans on transformers' LlamaForCausalLM: the vocabulary-parallel
  embedding (RowwiseParallel on nn.Embedding: its rows, the vocabulary, split; the output all-reduced), q/k/v and
  gate/up column-parallel, o/down row-parallel, the head column-parallel over the vocabulary with its logits left
  sharded for the vocabulary-parallel cross-entropy (loss_parallel). The vocabulary is padded as Megatron pads it:
  the model is built with the padded vocabulary (`padded_vocab` in CASE.json).
- "sp": the same with sequence parallelism (torchtitan's Llama plan): the norms and the residual stream split by the
  sequence, gathered before q/k/v and gate/up (PrepareModuleInput to Replicate() on the attention and the MLP; the
  head's ColwiseParallel gathers its own input), reduce-scattered after o/down. The column-parallel linears save the
  gathered input: memfit's `parallel.tensor_plan: dtensor`.
- "fsdp_tp": "tp" on pairs of ranks and FSDP2's fully_shard (each layer a unit, then the root) over the data ranks
  of a (WORLD / 2) x 2 mesh.
- "gpipe" / "1f1b": two pipeline stages (torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B): the first
  holds the embedding and the first half of the layers, the second the rest, the final norm and the head; the loss
  is transformers' ForCausalLM cross-entropy on each micro-batch's logits.

Every rank reports MemTracker's peak (bytes) and its categories, and what it holds: parameters, gradients and
optimizer state (storage bytes).
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import fork_ranks, storage_bytes  # noqa: E402

CPU = torch.device("cpu")


def build(case):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = {k: v for k, v in case["model"].items() if k != "model_type"}
    if case.get("padded_vocab"):
        fields["vocab_size"] = case["padded_vocab"]
    model = LlamaForCausalLM._from_config(LlamaConfig(**fields), attn_implementation="sdpa")
    model.train()
    return model


def local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def tensor_parallel(model, mesh, sequence: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    seq = Shard(1) if sequence else Replicate()
    top = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence:
        top["model.norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    for layer in model.model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(), "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq),
        }
        if sequence:
            plan.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq}, desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(layer, mesh, plan)


class Tracker(MemTracker):
    """MemTracker over a step that runs a module more than once (a pipeline stage's micro-batches): a later forward
    call of a module it tracks already adds nothing to its per-module statistics (MemTracker refuses it); the
    device-wide peak, the figure compared, is tracked at every operator as before."""

    def _pre_fw_hook(self, module, inputs):
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            return
        super()._pre_fw_hook(module, inputs)


def measure(step, params, optimizers, inputs, warmup=2):
    for _ in range(warmup):
        step()
    tracker = Tracker()
    tracker.track_external(*params, *optimizers, *inputs)
    with tracker:
        step()
    snap = tracker.get_tracker_snapshot("peak")[CPU]
    cats = {(k.value if hasattr(k, "value") else str(k)): v for k, v in snap.items()}
    return {"bytes": snap["Total"], "categories": cats}


def run_tp(rank, world, case):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    model = build(case)
    if case["mode"] == "fsdp_tp":  # 2-D: FSDP2 over the data ranks (each layer a unit, the root), TP within a pair
        from torch.distributed.fsdp import fully_shard

        mesh2 = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        mesh = mesh2["tp"]
        tensor_parallel(model, mesh, False)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh2["dp"])
        fully_shard(model, mesh=mesh2["dp"])
    else:
        mesh = init_device_mesh("cpu", (world,))
        tensor_parallel(model, mesh, case["mode"] == "sp")
    # one foreach optimizer per device mesh the parameters live on (and one for plain tensors: the norms without
    # sequence parallelism): torch.optim's foreach does not mix them
    from torch.distributed.tensor import DTensor

    by_mesh: dict = {}
    for p in model.parameters():
        by_mesh.setdefault(p.device_mesh if isinstance(p, DTensor) else None, []).append(p)
    optimizers = [torch.optim.AdamW(g, lr=1e-3, foreach=True) for g in by_mesh.values()]
    g = torch.Generator().manual_seed(1)
    b, s, vocab = case["micro_batch"], case["seq_len"], case["model"]["vocab_size"]
    ids = torch.randint(0, vocab, (b, s), generator=g)
    labels = torch.randint(0, vocab, (b, s), generator=g)

    positions = torch.arange(s).unsqueeze(0)  # the whole sequence's (under sequence parallelism the embedding's output is a slice)

    def forward():  # the logits go when the loss has read them (a training loop keeps the loss only)
        logits = model(input_ids=ids, position_ids=positions).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    def step():
        with loss_parallel():
            loss = forward()
            loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    out = measure(step, [model], optimizers, [ids, labels])
    out["parameters"] = storage_bytes([local(p) for p in model.parameters()] + [local(x) for x in model.buffers()])
    out["local"] = {n: list(local(p).shape) for n, p in model.named_parameters()}
    return out


class Stage(nn.Module):
    """A pipeline stage of a LlamaForCausalLM: its embedding (first), its layers, its norm and head (last)."""

    def __init__(self, model, first, last, layers):
        super().__init__()
        self.embed_tokens = model.model.embed_tokens if first else None
        self.layers = nn.ModuleList(model.model.layers[a] for a in layers)
        self.rotary_emb = model.model.rotary_emb
        self.norm = model.model.norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x):
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        position_ids = torch.arange(h.shape[1]).unsqueeze(0)
        position_embeddings = self.rotary_emb(h, position_ids=position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_embeddings=position_embeddings, position_ids=position_ids)
        if self.lm_head is not None:
            h = self.lm_head(self.norm(h))
        return h


def run_pp(rank, world, case):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    model = build(case)
    n = case["model"]["num_hidden_layers"]
    half = -(-n // world)
    layers = range(rank * half, min(n, (rank + 1) * half))
    module = Stage(model, rank == 0, rank == world - 1, layers)
    del model
    m, b, s, vocab = case["micro_batches"], case["micro_batch"], case["seq_len"], case["model"]["vocab_size"]
    stage = PipelineStage(module, rank, world, CPU)

    def loss_fn(logits, target):  # transformers' ForCausalLMLoss on fp32 logits: cross-entropy over the tokens
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    schedule = (ScheduleGPipe if case["mode"] == "gpipe" else Schedule1F1B)(stage, n_microbatches=m, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (m * b, s), generator=g)
    labels = torch.randint(0, vocab, (m * b, s), generator=g)

    def step():
        if rank == 0:
            schedule.step(ids, return_outputs=False)
        else:
            schedule.step(target=labels, return_outputs=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    out = measure(step, [module], [optimizer], [ids, labels] if rank == 0 else [labels])
    out["parameters"] = storage_bytes(list(module.parameters()) + list(module.buffers()))
    out["layers"] = list(layers)
    return out


def run(rank, world, case):
    report = (run_tp if case["mode"] in ("tp", "sp", "fsdp_tp") else run_pp)(rank, world, case)
    report["rank"] = rank
    return report


def main():
    world, out = int(sys.argv[1]), sys.argv[2]
    with open(sys.argv[3]) as f:
        case = json.load(f)
    fork_ranks(world, out, run, case, preload=("torch.distributed.pipelining", "torch.distributed.tensor.parallel", "transformers.models.llama.modeling_llama"))


if __name__ == "__main__":
    main()
