"""Not a test: the full peak of Lit-GPT 8641822's own LoRA step under whichever torch runs it, by torch.profiler's
memory profile (profile_memory, record_shapes, with_stack; torch.profiler._memory_profiler.MemoryProfileTimeline:
every tensor's allocation and free, the parameters, gradients and optimizer state it sees included, summed over its
categories at each instant), so that torch 2.1.0 (no MemTracker there, and its storages take no weakref finalizer) and
torch 2.2+ can be compared on the same step: which of the step's transients or saved tensors differ between versions.

The step: tests/support/litgpt_source_measure.py's build (8641822's GPT with LoRA on q and v, the Llama layout, bf16),
the outputs converted to fp32 as Fabric does (each output's .to(float32)), AdamW foreach, model(input_ids,
lm_head_chunk_size=128), chunked_cross_entropy, backward, step, zero_grad; two warm steps, then one profiled. Prints,
per micro-batch, the timeline's peak and the bytes at its start.

    /tmp/t21/bin/python tests/support/litgpt_version_peak.py /tmp/src8641 [WIDTH SEQ LAYERS VOCAB HEADS]
    python tests/support/litgpt_version_peak.py /tmp/src8641 ...   # torch 2.13"""
import json
import pathlib
import sys
import warnings

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import litgpt_source_measure as source_measure  # noqa: E402


def peak_of_step(lora, utils, width, seq, layers, vocab, heads, micro_batch):
    model = source_measure.build(lora, "8641822", "llama", heads, ("q", "v"), width=width, vocab=vocab, layers=layers,
                                 heads=heads, block_size=seq)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    idx = torch.randint(0, vocab, (micro_batch, seq), generator=torch.Generator().manual_seed(1))

    def step():
        logits = [t.to(torch.float32) for t in model(idx, lm_head_chunk_size=128)]   # Fabric's convert_output
        logits[-1] = logits[-1][..., :-1, :]
        loss = utils.chunked_cross_entropy(logits, idx[..., 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        step()
    from torch.profiler._memory_profiler import MemoryProfileTimeline
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    totals = [int(sum(s)) for s in sizes]
    return max(totals), totals[0]

if __name__ == "__main__":
    width, seq, layers, vocab, heads = (int(a) for a in (sys.argv[2:7] if len(sys.argv) > 2 else (512, 256, 2, 2048, 4)))
    lora, utils = source_measure.import_litgpt(sys.argv[1], "8641822")
    for micro_batch in (1, 2):
        peak, start = peak_of_step(lora, utils, width, seq, layers, vocab, heads, micro_batch)
        print(json.dumps({"torch": torch.__version__, "width": width, "seq": seq, "layers": layers, "vocab": vocab,
                          "micro_batch": micro_batch, "peak": peak, "at_start": start}))
