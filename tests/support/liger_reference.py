"""Pure-torch ports of Liger-Kernel's RMSNorm and SwiGLU (memfit's training.liger_kernels,
ledger/techniques/liger_kernels.py), for the CPU: their kernels are Triton, so these autograd Functions allocate and
save what Liger's code allocates and saves, in the same order, and compute the same values with torch ops a block of
rows at a time (the kernels hold one row in registers; the port's fp32 copies of ROWS rows are its only extra bytes).

liger-kernel 0.6.4 (`pip download --no-deps liger-kernel==0.6.4`), src/liger_kernel/:

- ops/rms_norm.py LigerRMSNormFunction (as LigerRMSNorm.forward calls it: offset 0, casting_mode "llama",
  in_place True, row_mode None; `@ensure_contiguous` on forward and backward, ops/utils.py: `x.contiguous()`).
  rms_norm_forward: `Y = torch.empty((n_rows, n_cols), dtype=X.dtype)`, `RSTD = torch.empty(n_rows,
  dtype=torch.float32)` (llama casting mode: fp32), the kernel (_rms_norm_forward_kernel: the row in fp32,
  `rstd = rsqrt(mean_square + eps)`, `X_row = (X_row * rstd).to(X_row_dtype)`, `Y_row = X_row * (offset + W_row)`);
  `ctx.save_for_backward(X, W, RSTD)`: the input itself (a view of the caller's tensor), the weight and the fp32
  1/rms per row. rms_norm_backward: `_dW = torch.empty((sm_count, n_cols), dtype=torch.float32)` (sm_count = 1 off
  CUDA and XPU: `if X.device.type == "cuda": sm_count = ...multi_processor_count`), `dX = dY` (in_place True: the
  input's gradient written over the output's), `dW = _dW.sum(dim=0).to(W.dtype)`.
- ops/swiglu.py LigerSiLUMulFunction (transformers/swiglu.py LigerSwiGLUMLP.forward:
  `self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))`). swiglu_forward: `c =
  torch.empty_like(a)`, the kernel `c_row = silu(a_row.to(fp32)).cast(b_row.dtype) * b_row`;
  `ctx.save_for_backward(a, b)`: gate's and up's outputs, not silu(gate). swiglu_backward recomputes silu and stores
  `da` over `a` and `db` over `b` (`tl.store(a_ptr + col_offsets, da_row)`, `tl.store(b_ptr + ..., db_row)`) and
  returns `a.view(*ori_shape), b.view(*ori_shape)`: no new storage.

`patch(model, kernels)` swaps the forwards in as transformers/monkey_patch.py does for Llama, Mistral, Qwen2 and Qwen3
(`modeling_llama.LlamaRMSNorm = LigerRMSNorm`, `modeling_llama.LlamaMLP = LigerSwiGLUMLP`, before the model is built
as Axolotl's and LLaMA-Factory's patches run: every RMSNorm of the family's class, Qwen3's q_norm and k_norm too).
"""

from __future__ import annotations

import types

import torch

ROWS = 4   # rows per block of the port (the kernels' one row per program)


class LigerRMSNormPort(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps):
        X = X.contiguous()
        shape = X.shape
        dim = shape[-1]
        X = X.view(-1, dim)
        n_rows, n_cols = X.shape
        Y = torch.empty((n_rows, n_cols), dtype=X.dtype)
        RSTD = torch.empty(n_rows, dtype=torch.float32)
        for r in range(0, n_rows, ROWS):
            x = X[r:r + ROWS].float()
            rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
            RSTD[r:r + ROWS] = rstd
            Y[r:r + ROWS] = (x * rstd[:, None]).to(X.dtype) * W
            del x, rstd
        ctx.eps = eps
        ctx.save_for_backward(X, W, RSTD)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY):
        X, W, RSTD = ctx.saved_tensors
        dY = dY.contiguous()
        shape = dY.shape
        dY = dY.view(-1, shape[-1])
        n_rows, n_cols = dY.shape
        _dW = torch.empty((1, n_cols), dtype=torch.float32)   # sm_count 1 off CUDA
        _dW.zero_()
        dX = dY   # in_place True
        w = W.float()
        for r in range(0, n_rows, ROWS):
            x = X[r:r + ROWS].float()
            rstd = RSTD[r:r + ROWS][:, None]
            normed = x * rstd
            dy = dY[r:r + ROWS].float()
            _dW[0] += (dy * normed.to(X.dtype).float()).sum(0)
            m = dy * w
            dX[r:r + ROWS] = (rstd * (m - normed * (m * normed).mean(-1, keepdim=True))).to(dX.dtype)
            del x, rstd, normed, dy, m
        dW = _dW.sum(dim=0).to(W.dtype)
        return dX.view(*shape), dW, None


class LigerSiLUMulPort(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        shape = a.shape
        a = a.view(-1, shape[-1])
        b = b.view(-1, shape[-1])
        c = torch.empty_like(a)
        for r in range(0, a.shape[0], ROWS):
            c[r:r + ROWS] = torch.nn.functional.silu(a[r:r + ROWS].float()).to(b.dtype) * b[r:r + ROWS]
        ctx.save_for_backward(a, b)
        return c.view(*shape)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        dc = dc.contiguous()
        shape = dc.shape
        dc = dc.view(-1, shape[-1])
        for r in range(0, a.shape[0], ROWS):
            x = a[r:r + ROWS].float()
            sig = torch.sigmoid(x)
            silu = x * sig
            d = dc[r:r + ROWS]
            db = d * silu
            da = d * (silu * (1 - sig) + sig) * b[r:r + ROWS]
            a[r:r + ROWS] = da.to(a.dtype)
            b[r:r + ROWS] = db.to(b.dtype)
            del x, sig, silu, d, db, da
        return a.view(*shape), b.view(*shape)


def _rms_forward(self, hidden_states):
    return LigerRMSNormPort.apply(hidden_states, self.weight, self.variance_epsilon)


def _swiglu_forward(self, x):
    return self.down_proj(LigerSiLUMulPort.apply(self.gate_proj(x), self.up_proj(x)))


def patch(model, kernels=("rms_norm", "swiglu")):
    """Every RMSNorm (the family's own class: LlamaRMSNorm, Qwen3RMSNorm...) and gated MLP of `model` runs Liger's
    function instead (its `forward` swapped, as the class swap does)."""
    for module in model.modules():
        name = type(module).__name__
        if "rms_norm" in kernels and name.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_forward, module)
        if "swiglu" in kernels and name.endswith("MLP") and all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")):
            module.forward = types.MethodType(_swiglu_forward, module)
    return model
