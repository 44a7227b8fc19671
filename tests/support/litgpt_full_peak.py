"""Not a test: the FULL peak (every live storage, transients included, not only what autograd saves) of Lit-GPT
8641822's own LoRA step against `memfit check` on the config of that step, per micro-batch, to see whether memfit's
peak (not only its saved bytes, which tests/ledger/test_litgpt_qkv.py holds) follows the measured one per token.

Lit-GPT 8641822's GPT with LoRA on q and v (its source tree, tests/support/litgpt_source_measure.py's import with the
lightning imports stubbed), Llama layout (RMSNorm without the upcast, LLaMAMLP, full rope, no biases), bf16, wrapped
in litgpt_port.FabricModule (Fabric's conversion of the outputs to fp32, as 8641822's pinned Lightning does), AdamW
foreach on the adapters, finetune/lora.py's step (model(input_ids, lm_head_chunk_size=128), chunked_cross_entropy,
backward, optimizer.step, zero_grad) measured by MemTracker (torch 2.2+; its module tracker off, as
tests/support/litgpt_fabric_measure.py runs it) after two warm steps.

    git -C litgpt archive 8641822 lit_gpt | tar -x -C /tmp/src8641
    PYTHONPATH=src python tests/support/litgpt_full_peak.py /tmp/src8641 [WIDTH SEQ LAYERS VOCAB HEADS]

Prints, per micro-batch, the measured peak and its phase, memfit's peak and phase, and their difference: the step
alone (its logits freed when it returns), then 8641822's loop holding them (training.previous_outputs_held)."""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import warnings

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import litgpt_check  # noqa: E402
import litgpt_port  # noqa: E402
import litgpt_source_measure as source_measure  # noqa: E402
import peak_reference as ref  # noqa: E402


def measured(lora, utils, width: int, seq: int, layers: int, vocab: int, heads: int, micro_batch: int,
             hold: bool = False) -> tuple:
    """(peak bytes, phase) of the tracked step; `hold`: 8641822's train() loop, whose `logits = model(...)` stays bound
    through the backward and the optimizer step until the next micro-batch's forward returns (two tracked
    micro-batches of the same length); else the logits go when the step's function returns."""
    model = source_measure.build(lora, "8641822", "llama", heads, ("q", "v"), width=width, vocab=vocab, layers=layers,
                                 heads=heads, block_size=seq)
    model = litgpt_port.FabricModule(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    idx = torch.randint(0, vocab, (micro_batch, seq), generator=torch.Generator().manual_seed(1))

    loop = {}

    def step(tracker=None):
        if tracker is not None:
            tracker.phase = "forward"
        logits = model(idx, lm_head_chunk_size=128)
        if hold:
            loop["logits"] = logits
        logits[-1] = logits[-1][..., :-1, :]
        loss = utils.chunked_cross_entropy(logits, idx[..., 1:])
        if tracker is not None:
            tracker.phase = "backward"
        loss.backward()
        if tracker is not None:
            tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad()

    return ref.tracked(step, model, opt, idx, times=2 if hold else 1).peak()


def memfit(width: int, seq: int, layers: int, vocab: int, heads: int, micro_batch: int, hold: bool = False) -> tuple:
    cfg = litgpt_check.llama(width, heads, layers, vocab, width * 172 // 64, seq)
    peak = litgpt_check.lora_step_peak(pathlib.Path(tempfile.mkdtemp()), cfg, micro_batch, seq, rmsnorm_upcast=False,
                                       outputs_dtype="float32", **({"previous_outputs_held": True} if hold else {}))
    return peak["bytes"], peak["phase"]


if __name__ == "__main__":
    width, seq, layers, vocab, heads = (int(a) for a in (sys.argv[2:7] if len(sys.argv) > 2 else (512, 256, 2, 2048, 4)))
    lora, utils = source_measure.import_litgpt(sys.argv[1], "8641822")
    for micro_batch, hold in ((1, False), (2, False), (1, True), (2, True)):
        (m, m_phase), (f, f_phase) = (measured(lora, utils, width, seq, layers, vocab, heads, micro_batch, hold),
                                      memfit(width, seq, layers, vocab, heads, micro_batch, hold))
        print(json.dumps({"width": width, "seq": seq, "layers": layers, "vocab": vocab, "micro_batch": micro_batch,
                          "logits_held": hold,
                          "measured": m, "measured_phase": m_phase, "memfit": f, "memfit_phase": f_phase,
                          "ratio": round(f / m, 4), "memfit_minus_measured": f - m,
                          "per_token_layer_hidden": round((f - m) / (micro_batch * seq * layers * width), 3)}))
