"""What LitGPT 0.5.13's RMSNorm (litgpt/model.py 26857050:1315-1322) keeps for backward: one norm of width argv[1] on a
(2, 16, width) input that needs a gradient, its weight trained, under bf16-true (a bf16 model), bf16-mixed (fp32
weights, CPU autocast) and 32-true; the bytes of the distinct storages saved_tensors_hooks sees, the weight itself
left out (a parameter). Run in litgpt 0.5.13's interpreter (MEMFIT_LITGPT_PYTHON); prints one JSON object."""
import json, sys, torch
from litgpt.model import RMSNorm
out, width = {}, int(sys.argv[1])
for precision in ("bf16-true", "bf16-mixed", "32-true"):
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    norm = RMSNorm(width, eps=1e-5).to(dtype)
    x = torch.randn(2, 16, width, dtype=dtype).requires_grad_()
    seen = {}
    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        y = norm(x)
    seen.pop(norm.weight.untyped_storage().data_ptr(), None)   # the parameter itself: no activation
    out[precision] = sum(seen.values())
print(json.dumps(out))
