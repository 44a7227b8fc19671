"""Pure-torch ports of the two fused linear cross-entropies memfit models (ledger/techniques/fused_loss.py), for the
CPU: their kernels are Triton, so these functions allocate what that code allocates, in the same order, and compute
the same values with torch ops a chunk (Liger) or a block of rows (Cut Cross-Entropy) at a time.

Liger: linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py (commit 00eba634),
fused_linear_cross_entropy_forward, the CUDA path for the dtypes memfit prices (`_can_use_mm_out` holds inside an
autograd Function's forward, where grad mode is off): `grad_input = torch.zeros_like(_input)`, `grad_weight =
torch.zeros_like(weight)` when the weight is trained, `loss_1d`, `target_mask`, one `logits_storage` of
(chunk_size, V) in the input's dtype filled by `torch.mm(_input_chunk, weight.t(), out=logits_chunk)`, the
cross-entropy kernel writing the chunk's gradient over it, `torch.mm(grad_logits_chunk, weight,
out=grad_input[start:end])`, and for the weight's gradient `torch.addmm(grad_weight, grad_logits_t, _input_chunk,
out=grad_weight)` (a 16-bit weight, sm80+) or the legacy `grad_weight += torch.mm(grad_logits_chunk.t(),
_input_chunk).float()` (an fp32 weight); LigerFusedLinearCrossEntropyFunction saves grad_input and grad_weight and
its backward returns them (grad_output is 1.0: no rescaling). LigerForCausalLMLoss
(src/liger_kernel/transformers/model/loss_utils.py) pads the labels by one and shifts them.
The cross-entropy kernel (ops/cross_entropy.py liger_cross_entropy_kernel) overwrites each logits row with
softmax - onehot, scaled by 1/n_non_ignore: here the same, in place, with torch ops on the chunk (the kernel keeps
its row in registers; the port's fp32 copy of 4 rows at a time is the only extra).

Cut Cross-Entropy: apple/ml-cross-entropy cut_cross_entropy/cce.py LinearCrossEntropyFunction (commit 3a798378),
cce_lse_forward.py (`lse`, `logit_avg`), utils.py _build_flat_valids, cce_backward.py (`de`, `dc`, the int32 vocab
ordering from argsort of logit_avg). The Triton kernels hold (block_b, block_v) tiles in on-chip memory; the
port computes blocks of 4 rows over the whole vocabulary (4 x V elements, fp32: the only bytes it has
that the kernels do not; memfit's tiny runs keep them under 1% of the peak).
"""

from __future__ import annotations

import torch

IGNORE = -100
BLOCK = 4   # rows per block in the CCE port
ROWS = 4    # rows per block of the Liger cross-entropy kernel's port


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


class LigerFLCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, _input, weight, target):
        BT, H = _input.shape
        V = weight.shape[0]
        inc_factor = -(-V // H)
        chunk_size = min(_next_power_of_2(-(-BT // inc_factor)), BT)
        num_chunks = -(-BT // chunk_size)
        grad_input = torch.zeros_like(_input)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        loss_1d = torch.zeros(BT, dtype=torch.float32)
        target_mask = target != IGNORE
        n_non_ignore = int(target_mask.sum().item())
        logits_storage = torch.empty((chunk_size, V), dtype=_input.dtype)
        for chunk_id in range(num_chunks):
            start, end = chunk_id * chunk_size, min((chunk_id + 1) * chunk_size, BT)
            _input_chunk = _input[start:end]
            logits_chunk = logits_storage[: end - start]
            torch.mm(_input_chunk, weight.t(), out=logits_chunk)
            target_chunk = target[start:end]
            # liger_cross_entropy_kernel (a program per row, the row in registers): the loss, then softmax - onehot
            # over the row, in place; here ROWS rows at a time (their fp32 copies: the port's only extra bytes)
            for r in range(0, end - start, ROWS):
                rows = logits_chunk[r:r + ROWS]
                y = target_chunk[r:r + ROWS]
                valid = y != IGNORE
                x = rows.float()
                lse = torch.logsumexp(x, dim=-1)
                picked = x.gather(1, y.clamp(min=0)[:, None])[:, 0]
                loss_1d[start + r:start + r + rows.shape[0]] = torch.where(valid, lse - picked, 0.0) / n_non_ignore
                x.sub_(lse[:, None]).exp_().div_(n_non_ignore)
                x[torch.arange(rows.shape[0]), y.clamp(min=0)] -= 1.0 / n_non_ignore
                x.mul_(valid[:, None])
                rows.copy_(x)
                del x, lse, picked, rows
            grad_logits_chunk = logits_chunk
            torch.mm(grad_logits_chunk, weight, out=grad_input[start:end])
            if grad_weight is not None:
                if grad_weight.dtype == torch.float32:
                    grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()
                else:
                    torch.addmm(grad_weight, grad_logits_chunk.t(), _input_chunk, out=grad_weight)
            del grad_logits_chunk, _input_chunk, target_chunk
        del logits_storage
        loss = torch.sum(loss_1d)
        ctx.save_for_backward(grad_input.detach(), grad_weight.detach() if grad_weight is not None else None)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        return grad_input, grad_weight, None


def liger_causal_lm_loss(hidden_states, lm_head_weight, labels):
    """LigerForCausalLMLoss: pad the labels by one, shift, flatten, the fused function."""
    labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)
    shift_labels = labels[..., 1:].contiguous()
    hidden_states = hidden_states.view(-1, hidden_states.size(-1))
    return LigerFLCE.apply(hidden_states, lm_head_weight, shift_labels.view(-1))


class CCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, c, targets, valids):
        V = c.shape[0]
        B = valids.numel()
        lse = e.new_full((B,), -float("inf"), dtype=torch.float32)
        logit_avg = e.new_full((V,), 0.0, dtype=torch.float32)
        for start in range(0, B, BLOCK):
            rows = e[valids[start:start + BLOCK].long()]
            block = (rows @ c.t()).float()
            lse[start:start + BLOCK] = torch.logsumexp(block, dim=-1)
            logit_avg += block.sum(0) / B
            del rows, block
        # indexed_neg_dot_forward_kernel: -<e_i, c_{t_i}> per valid row, out_dtype lse's (fp32)
        neg_dot = torch.empty((B,), dtype=torch.float32)
        for start in range(0, B, BLOCK):
            idx = valids[start:start + BLOCK].long()
            neg_dot[start:start + BLOCK] = -(e[idx].float() * c[targets[idx + 1].long()].float()).sum(-1)
        nll = neg_dot.add_(lse)
        loss = nll.mean()
        ctx.save_for_backward(e, c, lse, targets, valids, logit_avg)
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        e, c, lse, targets, valids, logit_avg = ctx.saved_tensors
        vocab_ordering = torch.argsort(logit_avg).to(torch.int32)   # sort_logit_avg
        de = torch.zeros_like(e) if ctx.needs_input_grad[0] else None
        dc = torch.zeros_like(c) if ctx.needs_input_grad[1] else None
        scale = grad_out / lse.numel()
        for start in range(0, valids.numel(), BLOCK):
            idx = valids[start:start + BLOCK].long()
            block = (e[idx] @ c.t()).float()
            d = (block - lse[start:start + BLOCK, None]).exp_()
            d[torch.arange(idx.numel()), targets[idx + 1].long()] -= 1.0
            d = (d * scale).to(e.dtype)
            if de is not None:
                de[idx] += d @ c
            if dc is not None:
                dc += d.t() @ e[idx]
            del block, d
        del vocab_ordering
        return de, dc, None, None


def cce_linear_cross_entropy(e, c, targets):
    """linear_cross_entropy(e, c, labels, shift=True) as apply_lce calls it: e (b, s, h), targets (b, s)."""
    targets = targets.contiguous()
    shifted = targets[..., 1:]
    valids = (shifted != IGNORE).nonzero().to(torch.int32)   # _build_flat_valids, shift 1
    valids[:, 0] *= shifted.stride(0)
    valids = valids.sum(1).to(torch.int32)
    # (cce.py flattens e and targets; the valid row i predicts targets[i + shift])
    return CCE.apply(e.contiguous().flatten(0, -2), c, targets.flatten(), valids)


class Fused(torch.nn.Module):
    """A transformers causal LM whose forward ends in a fused loss, as the Liger and CCE patches of its forward do:
    the decoder's last hidden states and lm_head.weight handed to the function (the head's matmul never runs)."""

    def __init__(self, model, kind: str):
        super().__init__()
        self.inner = model
        self.kind = kind

    def forward(self, input_ids, labels):
        base = self.inner.get_base_model() if hasattr(self.inner, "get_base_model") else self.inner
        hidden = base.model(input_ids=input_ids).last_hidden_state
        weight = base.lm_head.weight
        if self.kind == "liger":
            return liger_causal_lm_loss(hidden, weight, labels)
        return cce_linear_cross_entropy(hidden, weight, labels)
