"""One real FSDP2 training step per rank (gloo on CPU), reporting what each rank holds.

Run as a script by tests/placement/test_sharding.py under a hard timeout:
    python tests/support/fsdp_worker.py WORLD OUT.json MODEL:PRECISION [MODEL:PRECISION ...]
(several cases share one process group: starting processes is the slow part). MODEL is "blocks" (a small transformer-like nn.Module with dims that do not divide the world size,
so FSDP's padding shows) or "llama" (a tiny transformers LlamaForCausalLM built from a config).
PRECISION is "fp32" or "bf16" (MixedPrecisionPolicy(param_dtype=bfloat16): the sharded parameters
stay fp32, the all-gathered ones are bf16).
"""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ranks import fork_ranks, storage_bytes  # noqa: E402


class Block(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
        x = x + self.proj(attn)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Blocks(nn.Module):
    def __init__(self, vocab=37, hidden=10, ffn=23, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([Block(hidden, ffn) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.final_norm(h))


def build(name):
    if name == "blocks":
        return Blocks(), lambda m: list(m.layers)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=101, hidden_size=40, intermediate_size=50, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config), lambda m: list(m.model.layers)


def run(rank, world, cases):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    return [(tensor_parallel if case == "llama:tp" else step)(rank, mesh, *case.split(":")) for case in cases]


def tensor_parallel(rank, mesh, model_name, _):
    """transformers' own tensor-parallel plan for Llama (base_model_tp_plan), applied with torch's
    ColwiseParallel / RowwiseParallel: each rank's local parameter shapes."""
    import fnmatch

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model, _ = build(model_name)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {}
    for name, _module in model.model.named_modules():
        for pattern, style in model.config.base_model_tp_plan.items():
            if fnmatch.fnmatchcase(name, pattern):
                plan[name] = styles[style]()
    parallelize_module(model.model, mesh, plan)
    local = [(n, tuple(p.to_local().shape if isinstance(p, DTensor) else p.shape)) for n, p in model.named_parameters()]
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    return {"rank": rank, "case": "llama:tp", "shapes": shapes, "local": local, "plan": sorted(plan)}


def step(rank, mesh, model_name, precision):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    if precision == "hsdp":  # hybrid sharding: replicate over 2 "nodes", shard within each of 2 ranks
        mesh = init_device_mesh("cpu", (mesh.size() // 2, 2), mesh_dim_names=("replicate", "shard"))

    torch.manual_seed(0)
    model, layers_of = build(model_name)
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if precision == "bf16" else MixedPrecisionPolicy()
    for layer in layers_of(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    gathered = [0]

    def unsharded_now(module, args):
        # parameters swapped in unsharded are plain tensors; resting ones are DTensors
        live = [p for p in model.parameters() if not isinstance(p, DTensor)]
        gathered[0] = max(gathered[0], storage_bytes(live))

    for layer in layers_of(model):
        layer.register_forward_pre_hook(unsharded_now)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.embed.num_embeddings if model_name == "blocks" else 101, (2, 5))
    logits = model(ids) if model_name == "blocks" else model(input_ids=ids).logits
    logits.float().sum().backward()
    optimizer.step()
    params = [p.to_local() for p in model.parameters()]
    grads = [p.grad.to_local() for p in model.parameters()]
    states = [v.to_local() for p in model.parameters() for k, v in optimizer.state[p].items() if k != "step"]
    return {
        "rank": rank,
        "case": f"{model_name}:{precision}",
        "shapes": shapes,
        "parameters": storage_bytes(params),
        "gradients": storage_bytes(grads),
        "optimizer_state": storage_bytes(states),
        "gathered": gathered[0],
        "param_dtype": str(params[0].dtype),
    }


def main():
    world, out, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    llama = ("transformers.models.llama.modeling_llama",) if any(case.startswith("llama") for case in cases) else ()
    fork_ranks(world, out, run, cases, preload=("torch.distributed.fsdp", "torch.distributed.tensor", *llama))


if __name__ == "__main__":
    main()
