"""Not a test: which backward nodes save different tensors in two torch versions, read off each wheel's generated
autograd header (torch/include/torch/csrc/autograd/generated/Functions.h: one struct per node, a `SavedVariable`
member per tensor it keeps for backward). docs/accuracy.md, "PyTorch 2.1's torch.mean": 2.1.0 against 2.13.0.

    python tests/support/torch_saved_diff.py /tmp/t21/lib/python3.11/site-packages/torch .venv/lib/python3.11/site-packages/torch
"""
import pathlib
import re
import sys

HEADER = "include/torch/csrc/autograd/generated/Functions.h"


def saved(torch_dir: str) -> dict:
    """{node: the names of its SavedVariable members}."""
    out, node = {}, None
    for line in (pathlib.Path(torch_dir) / HEADER).read_text().splitlines():
        found = re.match(r"struct TORCH_API (\w+) :", line)
        if found:
            node = found[1]
            out[node] = set()
        elif node and line.startswith("};"):
            node = None
        elif node:
            member = re.match(r"\s+(?:std::vector<SavedVariable>|SavedVariable)\s+(\w+)", line)
            if member:
                out[node].add(member[1])
    return out


if __name__ == "__main__":
    old, new = saved(sys.argv[1]), saved(sys.argv[2])
    shared = sorted(set(old) & set(new))
    for node in shared:
        if old[node] != new[node]:
            print(f"{node}: first only {sorted(old[node] - new[node])}, second only {sorted(new[node] - old[node])}")
    print(f"{len(shared)} nodes in both, {len(set(old) - set(new))} only in the first, {len(set(new) - set(old))} only in the second")
