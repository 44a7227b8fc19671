"""What Lightning Fabric adds to LitGPT's step: the peak of LitGPT 3ba6da40's LoRA step (tests/support/litgpt_port.py, a
tiny Llama whose logits dominate: hidden 64, 4 heads, 2 layers, vocabulary 4,096, LoRA r 8 on q and v, 2 x 256 tokens,
gradient accumulation 2, the loop of litgpt/finetune/lora.py `fit`) measured with MemTracker (without its module
tracker, tests/ledger/test_previous_outputs_held.py) run plainly, through `lightning==2.3.0.dev20240318`'s Fabric
(`precision="bf16-true"` on the CPU: `_FabricModule.forward` converts the output to `torch.get_default_dtype()`, so
the logits chunks come back in fp32) and through litgpt_port.FabricModule (that conversion ported), beside `memfit
check` on the config of that step, with and without `training.outputs_dtype: float32`; then 1 x 1,024 tokens with
`fit`'s `logits` held through the next forward (the conversion beside the previous fp32 logits is the peak). Not a
test: Lightning is not a test dependency (run it with that wheel on the path: `PYTHONPATH=src:<site> python
tests/support/litgpt_fabric_measure.py`; docs/peak.md gives what it printed: the port's bytes equal Fabric's);
tests/ledger/test_outputs_dtype.py runs the port, tests/ledger/test_previous_outputs_held.py the plain step."""

from __future__ import annotations

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
import peak_reference as ref  # noqa: E402

W, H, L, V, B, T, I = 64, 4, 2, 4096, 2, 256, 176


def measured(fabric: bool, hold: bool = False, port: bool = False, shape: tuple = (B, T)) -> tuple:
    """(peak bytes, its phase, the logits' dtype as the loop gets them): LitGPT's step plainly, through Lightning's
    Fabric (`fabric`), or through litgpt_port.FabricModule, its conversion ported (`port`, no Lightning needed);
    `hold`: `fit`'s `logits = model(...)`, the previous micro-batch's logits rebound only once the next forward
    returned (else they go when the micro-batch's function returns, after its backward); `shape`: (sequences,
    tokens) of each micro-batch."""
    model = litgpt_port.build(n_embd=W, n_head=H, n_query_groups=H, n_layer=L, vocab_size=V, intermediate_size=I, r=8,
                              alpha=16, enable_lora=(True, False, True), block_size=max(shape[1], 256))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    if fabric:
        import lightning

        model, opt = lightning.Fabric(accelerator="cpu", devices=1, precision="bf16-true").setup(model, opt)
    elif port:
        model = litgpt_port.FabricModule(model)
    idx = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(1))
    seen, loop = {}, {}

    def micro(tracker=None):
        if tracker is not None:
            tracker.phase = "forward"
        logits = model(idx, lm_head_chunk_size=128)
        if hold:
            loop["logits"] = logits
        seen["dtype"] = logits[0].dtype
        logits[-1] = logits[-1][..., :-1, :]
        loss = litgpt_port.chunked_cross_entropy(logits, idx[..., 1:])
        if tracker is not None:
            tracker.phase = "backward"
        loss.backward()

    def step(tracker=None):   # gradient accumulation 2
        micro(tracker)
        micro(tracker)
        if tracker is not None:
            tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad()

    return (*ref.tracked(step, model, opt, idx).peak(), str(seen["dtype"]))


def memfit(held: bool = True, converted: bool = False, shape: tuple = (B, T), path: pathlib.Path | None = None) -> tuple:
    """memfit check's (peak bytes, phase) on the config of that step (written into `path`, a folder, where given:
    train.yaml)."""
    cfg = litgpt_check.llama(W, H, L, V, I, max(shape[1], 256))
    peak = litgpt_check.lora_step_peak(path or pathlib.Path(tempfile.mkdtemp()), cfg, *shape, gradient_accumulation=2,
                                       previous_outputs_held=held, **({"outputs_dtype": "float32"} if converted else {}))
    return peak["bytes"], peak["phase"]


if __name__ == "__main__":
    print("LitGPT's step:", measured(False))
    print("through Fabric:", measured(True))
    print("memfit:", memfit(), "without training.previous_outputs_held:", memfit(False))
    print("through Fabric, fit's loop:", measured(True, hold=True))
    print("the port's conversion:", measured(False, port=True), "fit's loop:", measured(False, hold=True, port=True))
    print("memfit with training.outputs_dtype float32:", memfit(converted=True))
    print("1 x 1,024 tokens through Fabric, fit's loop:", measured(True, hold=True, shape=(1, 1024)),
          "the port's:", measured(False, hold=True, port=True, shape=(1, 1024)),
          "memfit:", memfit(converted=True, shape=(1, 1024)))
