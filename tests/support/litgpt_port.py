"""LitGPT's Llama-style GPT with LoRA on its fused qkv, ported line for line from Lightning-AI/litgpt at
3ba6da4012fa880294ae4557cc16e5182591a73d (the commit of the config hub's measured rows; docs/accuracy.md), for what
autograd keeps: `litgpt/model.py` (GPT.forward through lora.py's, Block 149-171, CausalSelfAttention 187-243,
GptNeoxMLP 269-280, LLaMAMLP 292-296, build_rope_cache 334-352, apply_rope 355-361, RMSNorm 409-421; GPT's
ln_f 30 and Config's norm_class: torch.nn.LayerNorm for "LayerNorm", config.py 133-141, rope_n_elem 92) and
`litgpt/lora.py` (LoRAQKVLinear: lora_ind 261-279, zero_pad 322-341, conv1d 344-376, forward 398-433, its linear's
bias 220; GPT.forward with lm_head_chunk_size 525-553), `litgpt/utils.py` chunked_cross_entropy 233-262. Only what a
training forward of a Llama (RMSNorm, LLaMAMLP, no bias, full rotary) or of a GPT-NeoX such as StableLM Alpha
(LayerNorm, GptNeoxMLP with GELU, biases, partial rotary, the parallel residual with two norms:
shared_attention_norm False) runs, with LoRA on the qkv alone and no kv cache, is kept; the names are
LitGPT's. LitGPT itself is not a test dependency (it pins lightning); the same measurement on LitGPT's own
source at that commit and at 8641822 gave the same bytes for these setups (docs/accuracy.md), but for 8641822's
RMSNorm, which did not upcast: norm="RMSNorm 8641822" (lit_gpt/rmsnorm.py 8641822:17-21) is that norm, whose saved
bytes equal 8641822's source (tests/support/litgpt_source_measure.py)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):   # model.py 409-421
        dtype = x.dtype
        x = x.float()
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        x_normed = x * torch.rsqrt(norm_x + self.eps)
        x_normed = x_normed.to(dtype=dtype)
        return x_normed * self.weight


class RMSNorm8641822(RMSNorm):
    """Lit-GPT 8641822's RMSNorm (lit_gpt/rmsnorm.py 17-21), before 6178c7cc (2023-10-24) added the upcast: computed in
    its input's dtype."""

    def forward(self, x):   # lit_gpt/rmsnorm.py 8641822:17-21 (dim -1)
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        x_normed = x * torch.rsqrt(norm_x + self.eps)
        return self.weight * x_normed


class LoRAQKVLinear(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_query_groups: int, r: int, alpha: int, enable_lora: tuple,
                 bias: bool = False, lora_dropout: float = 0.0):
        super().__init__()
        # lora.py 82-84 (LoRALayer): one dropout for the fused qkv's adapter
        self.lora_dropout = nn.Dropout(p=lora_dropout) if lora_dropout > 0.0 else (lambda x: x)
        head_size = n_embd // n_head
        out_features = (n_head + 2 * n_query_groups) * head_size
        self.linear = nn.Linear(n_embd, out_features, bias=bias)
        self.n_head, self.n_query_groups, self.enable_lora, self.r = n_head, n_query_groups, enable_lora, r
        self.lora_A = nn.Parameter(torch.zeros((r * sum(enable_lora), n_embd)))
        kv_embd_size = n_embd // (n_head // n_query_groups)
        enable_q, enable_k, enable_v = enable_lora
        self.qkv_shapes = [s for s in (n_embd * enable_q, kv_embd_size * enable_k, kv_embd_size * enable_v) if s]
        self.lora_B = nn.Parameter(torch.zeros(sum(self.qkv_shapes), r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / r
        q_per_kv = n_head // n_query_groups   # lora.py 261-279
        total_qkv = q_per_kv + 2
        ind = range(out_features)
        self.lora_ind = []
        if enable_q:
            self.lora_ind.extend(x for x in ind if (x // head_size) % total_qkv < total_qkv - 2)
        if enable_k:
            self.lora_ind.extend(x for x in ind if (x // head_size) % total_qkv == total_qkv - 2)
        if enable_v:
            self.lora_ind.extend(x for x in ind if (x // head_size) % total_qkv == total_qkv - 1)

    def zero_pad(self, x):   # lora.py 322-341
        if all(self.enable_lora):
            return x
        x = x.transpose(0, 1)
        result = x.new_zeros((*x.shape[:-1], self.linear.out_features))
        result = result.view(-1, self.linear.out_features)
        result = result.index_copy(
            1, torch.tensor(self.lora_ind, device=result.device), x.reshape(-1, sum(self.qkv_shapes))
        )
        return result.view((*x.shape[:-1], self.linear.out_features)).transpose(0, 1)

    def conv1d(self, input, weight):   # lora.py 344-376
        if self.n_head == self.n_query_groups:
            return F.conv1d(input, weight, groups=sum(self.enable_lora))
        input_splitted = input.chunk(sum(self.enable_lora), dim=1)
        weight_splitted = weight.split(self.qkv_shapes)
        return torch.cat([F.conv1d(a, b) for a, b in zip(input_splitted, weight_splitted)], dim=1)

    def forward(self, x):   # lora.py 398-433
        pretrained = self.linear(x)
        after_A = F.linear(self.lora_dropout(x), self.lora_A)
        after_B = self.conv1d(after_A.transpose(-2, -1), self.lora_B.unsqueeze(-1)).transpose(-2, -1)
        lora = self.zero_pad(after_B) * self.scaling
        return pretrained + lora


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, n_query_groups, r, alpha, enable_lora, bias=False, rotary_percentage=1.0,
                 lora_dropout=0.0):
        super().__init__()
        self.attn = LoRAQKVLinear(n_embd, n_head, n_query_groups, r, alpha, enable_lora, bias, lora_dropout)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head, self.n_query_groups, self.head_size = n_head, n_query_groups, n_embd // n_head
        self.rope_n_elem = int(rotary_percentage * self.head_size)   # config.py 92

    def forward(self, x, cos, sin):   # model.py 187-243 (no mask, no kv cache: sdpa is_causal)
        B, T, C = x.size()
        qkv = self.attn(x)
        q_per_kv = self.n_head // self.n_query_groups
        total_qkv = q_per_kv + 2
        qkv = qkv.view(B, T, self.n_query_groups, total_qkv, self.head_size)
        qkv = qkv.permute(0, 2, 3, 1, 4)
        q, k, v = qkv.split((q_per_kv, 1, 1), dim=2)
        if self.n_query_groups != self.n_head:
            k = k.expand(B, self.n_query_groups, q_per_kv, T, self.head_size)
            v = v.expand(B, self.n_query_groups, q_per_kv, T, self.head_size)
        q = q.reshape(B, -1, T, self.head_size)
        k = k.reshape(B, -1, T, self.head_size)
        v = v.reshape(B, -1, T, self.head_size)
        n_elem = self.rope_n_elem
        q_roped = apply_rope(q[..., :n_elem], cos, sin)
        k_roped = apply_rope(k[..., :n_elem], cos, sin)
        q = torch.cat((q_roped, q[..., n_elem:]), dim=-1)
        k = torch.cat((k_roped, k[..., n_elem:]), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                           scale=1.0 / math.sqrt(self.head_size), is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, self.head_size * self.n_head)
        return self.proj(y)


class LLaMAMLP(nn.Module):
    def __init__(self, n_embd: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.fc_1 = nn.Linear(n_embd, intermediate_size, bias=bias)
        self.fc_2 = nn.Linear(n_embd, intermediate_size, bias=bias)
        self.proj = nn.Linear(intermediate_size, n_embd, bias=bias)

    def forward(self, x):   # model.py 292-296
        x_fc_1 = self.fc_1(x)
        x_fc_2 = self.fc_2(x)
        x = F.silu(x_fc_1) * x_fc_2
        return self.proj(x)


class GptNeoxMLP(nn.Module):
    def __init__(self, n_embd: int, intermediate_size: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(n_embd, intermediate_size, bias=bias)
        self.proj = nn.Linear(intermediate_size, n_embd, bias=bias)

    def forward(self, x):   # model.py 277-280, gelu_approximate "none" (config.py 58)
        x = self.fc(x)
        x = F.gelu(x, approximate="none")
        return self.proj(x)


NORMS = {"RMSNorm": RMSNorm, "LayerNorm": nn.LayerNorm,   # config.py 133-141
         "RMSNorm 8641822": RMSNorm8641822}   # Lit-GPT 8641822's (the A100 table's runs)
MLPS = {"LLaMAMLP": LLaMAMLP, "GptNeoxMLP": GptNeoxMLP}


class Block(nn.Module):
    def __init__(self, n_embd, n_head, n_query_groups, intermediate_size, r, alpha, enable_lora, norm="RMSNorm",
                 mlp="LLaMAMLP", bias=False, rotary_percentage=1.0, parallel_residual=False, lora_dropout=0.0):
        super().__init__()
        self.norm_1 = NORMS[norm](n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, n_query_groups, r, alpha, enable_lora, bias, rotary_percentage,
                                        lora_dropout)
        self.norm_2 = NORMS[norm](n_embd, eps=1e-5)   # shared_attention_norm False
        self.mlp = MLPS[mlp](n_embd, intermediate_size, bias=bias)
        self.parallel_residual = parallel_residual

    def forward(self, x, cos, sin):   # model.py 149-171
        n_1 = self.norm_1(x)
        h = self.attn(n_1, cos, sin)
        if self.parallel_residual:
            n_2 = self.norm_2(x)
            return self.mlp(n_2) + h + x
        x = h + x
        return self.mlp(self.norm_2(x)) + x


def build_rope_cache(seq_len: int, n_elem: int, base: int = 10000):   # model.py 334-352
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2).float() / n_elem))
    seq_idx = torch.arange(seq_len) / 1
    idx_theta = torch.outer(seq_idx, theta).repeat(1, 2)
    return torch.cos(idx_theta), torch.sin(idx_theta)


def apply_rope(x, cos, sin):   # model.py 355-361
    head_size = x.size(-1)
    x1 = x[..., : head_size // 2]
    x2 = x[..., head_size // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    roped = (x * cos) + (rotated * sin)
    return roped.to(dtype=x.dtype)


class GPT(nn.Module):
    def __init__(self, *, n_embd, n_head, n_query_groups, n_layer, vocab_size, intermediate_size, r, alpha,
                 enable_lora, block_size=256, norm="RMSNorm", mlp="LLaMAMLP", bias=False, rotary_percentage=1.0,
                 parallel_residual=False, lora_dropout=0.0):
        super().__init__()
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)   # lm_head_bias False
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            h=nn.ModuleList(Block(n_embd, n_head, n_query_groups, intermediate_size, r, alpha, enable_lora, norm, mlp,
                                  bias, rotary_percentage, parallel_residual, lora_dropout)
                            for _ in range(n_layer)),
            ln_f=NORMS[norm](n_embd, eps=1e-5)))
        cos, sin = build_rope_cache(block_size, int(rotary_percentage * (n_embd // n_head)))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, lm_head_chunk_size: int = 128):   # lora.py 525-553
        T = idx.size(1)
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x, cos, sin)
        x = self.transformer.ln_f(x)
        return [self.lm_head(x_i) for x_i in x.split(lm_head_chunk_size, dim=1)]


def chunked_cross_entropy(logits: list, targets, ignore_index: int = -100):   # utils.py 233-262, chunk_size 128
    logit_chunks = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
    target_chunks = [target_chunk.reshape(-1) for target_chunk in targets.split(logits[0].size(1), dim=1)]
    loss_chunks = [F.cross_entropy(logit_chunk, target_chunk, ignore_index=ignore_index, reduction="none")
                   for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)]
    non_masked_elems = (targets != ignore_index).sum()
    return torch.cat(loss_chunks).sum() / max(1, non_masked_elems)


def chunked_cross_entropy_8641822(logits: list, targets):   # lit_gpt/utils.py 8641822:256-262 (ignore_index -1)
    logit_chunks = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
    target_chunks = [target_chunk.reshape(-1) for target_chunk in targets.split(logits[0].size(1), dim=1)]
    loss_chunks = [F.cross_entropy(logit_chunk, target_chunk, ignore_index=-1, reduction="none")
                   for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)]
    return torch.cat(loss_chunks).mean()


def build(dtype=torch.bfloat16, **dims) -> GPT:
    """LitGPT's finetune/lora.py build: the model in the precision's dtype, only the LoRA matrices trainable
    (mark_only_lora_as_trainable)."""
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = GPT(**dims)
    finally:
        torch.set_default_dtype(default)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def step(model: GPT, micro_batch: int, seq_len: int, vocab_size: int, loss_fn=chunked_cross_entropy):
    """finetune/lora.py's step: logits = model(input_ids, lm_head_chunk_size=128); logits[-1] = logits[-1][..., :-1, :];
    loss = chunked_cross_entropy(logits, targets[..., 1:]); backward. `loss_fn`: chunked_cross_entropy_8641822 for
    Lit-GPT 8641822's (its .mean() keeps no int64 count: 8 B less)."""
    idx = torch.randint(0, vocab_size, (micro_batch, seq_len), generator=torch.Generator().manual_seed(1))
    logits = model(idx, lm_head_chunk_size=128)
    logits[-1] = logits[-1][..., :-1, :]
    loss = loss_fn(logits, idx[..., 1:])
    loss.backward()


class FabricModule(nn.Module):
    """What Lightning Fabric's `_FabricModule.forward` does around the model at `precision="bf16-true"`
    (lightning/fabric/wrappers.py 51ad6bb8:137-148, HalfPrecision in plugins/precision/half.py), after `Fabric.setup`'s
    `convert_module` (:41-42, `module.to(dtype=bf16)`: the fp32 rope buffers cos and sin too): `convert_input` (the
    int64 ids stay as they are: utils.py:20-21 converts floating tensors only), the forward under `forward_context`
    (:53-54, `_DtypeContextManager`: torch's default dtype bf16 while it runs), then `convert_output` (:61-62,
    `apply_to_collection(data, function=_convert_fp_tensor, dtype=Tensor, dst_type=torch.get_default_dtype())`: a new
    list of each floating output's `.to(float32)`, made while the model's list is alive), and a gradient hook on each
    output (:147, no memory). Lit-GPT 8641822's pin (71aed751) does the same (wrappers.py 116-124)."""

    def __init__(self, module: nn.Module, dtype=torch.bfloat16):
        super().__init__()
        self.module, self.dtype = module.to(dtype=dtype), dtype

    def forward(self, *args, **kwargs):
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            output = self.module(*args, **kwargs)
        finally:
            torch.set_default_dtype(default)
        dst = torch.get_default_dtype()
        return [t.to(dst) if torch.is_floating_point(t) else t for t in output]
