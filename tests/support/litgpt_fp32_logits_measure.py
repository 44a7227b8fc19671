"""Not a test: what Fabric's fp32 logits add to Lit-GPT 8641822's LoRA step, as the A100 table's StableLM rows run it
(docs/accuracy.md). Lit-GPT 8641822 pins Lightning 71aed751, whose `_FabricModule.forward` ends
`output = self._precision.convert_output(output)` (src/lightning/fabric/wrappers.py 71aed751:123) and whose
`HalfPrecision.convert_output` (plugins/precision/half.py 71aed751:51-52) is `apply_to_collection(data,
function=_convert_fp_tensor, dtype=Tensor, dst_type=torch.get_default_dtype())`: the chunked head's list of bf16
logits comes back as a new list of fp32 chunks. Lightning is not a test dependency, so that line is written out
here (a list built while the old one is alive, as apply_to_collection builds it). The step is finetune/lora.py's at
8641822 (one micro-batch, no graph before it: the first batch is the longest) on tests/support/litgpt_port.py with
StableLM Alpha's layout at tiny widths whose logits dominate (hidden 64, 4 heads, 2 layers, vocabulary 4,096, LoRA r 8
on q and v), measured with MemTracker without its module tracker (tests/ledger/test_previous_outputs_held.py), plain
and with the conversion; it prints both peaks and the difference per logit element (docs/accuracy.md: 5.99 B). The
difference is what is read: the plain step's own peak here is above memfit's for the same config by about 1 MB per
128-row head chunk at any micro-batch (twice the head's bf16 weight: on the CPU, not examined here).

    PYTHONPATH=src python tests/support/litgpt_fp32_logits_measure.py
"""

from __future__ import annotations

import pathlib
import sys
import warnings

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import litgpt_port  # noqa: E402
import peak_reference as ref  # noqa: E402

W, H, L, V, I = 64, 4, 2, 4096, 256


def measured(micro_batch: int, seq_len: int, fp32: bool) -> tuple:
    model = litgpt_port.build(n_embd=W, n_head=H, n_query_groups=H, n_layer=L, vocab_size=V, intermediate_size=I, r=8,
                              alpha=16, enable_lora=(True, False, True), norm="LayerNorm", mlp="GptNeoxMLP", bias=True,
                              rotary_percentage=0.25, parallel_residual=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    idx = torch.randint(0, V, (micro_batch, seq_len), generator=torch.Generator().manual_seed(1))

    def micro(tracker=None):
        if tracker is not None:
            tracker.phase = "forward"
        logits = model(idx, lm_head_chunk_size=128)
        if fp32:   # Fabric's convert_output
            logits = [t.to(torch.get_default_dtype()) for t in logits]
        logits[-1] = logits[-1][..., :-1, :]
        loss = litgpt_port.chunked_cross_entropy(logits, idx[..., 1:])
        if tracker is not None:
            tracker.phase = "backward"
        loss.backward()

    def step(tracker=None):
        micro(tracker)
        if tracker is not None:
            tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad()

    return ref.tracked(step, model, opt, idx, warm=1).peak()   # one warm step: the optimizer state exists


if __name__ == "__main__":
    for B, T in ((1, 256), (2, 256)):
        plain, fabric = measured(B, T, False), measured(B, T, True)
        print(f"{B} x {T}: plain {plain}, fp32 logits {fabric}, {fabric[0] - plain[0]} B more, "
              f"{(fabric[0] - plain[0]) / (B * T * V):.3f} B per logit element")
