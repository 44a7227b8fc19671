"""Run by a torchtune 0.6.1 interpreter (MEMFIT_TORCHTUNE_PYTHON): build each named builder
(`family.builder`, e.g. gemma2.gemma2_2b) on the meta device and print its parameter count, as JSON.

    python torchtune_count.py gemma2.gemma2_2b phi4.phi4_14b
"""

import torch, importlib, json, sys
out = {}
for b in sys.argv[1:]:
    mod, name = b.rsplit(".", 1)
    fn = getattr(importlib.import_module("torchtune.models." + mod), name)
    with torch.device("meta"):
        m = fn()
    out[b] = sum(p.numel() for p in m.parameters())
print(json.dumps(out))
