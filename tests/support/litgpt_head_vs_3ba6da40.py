"""Not a test: the step of tests/support/litgpt_head_step.py (LitGPT 0.5.13 = HEAD 26857050) run on LitGPT 3ba6da40's
own source (the commit whose step memfit's LitGPT reader prices; its lightning imports stubbed by
litgpt_source_measure.import_litgpt), the same tiny model (the model_config.yaml tests/ledger/test_litgpt_head.py
writes; keys 3ba6da40's Config lacks, Phi-3's sliding_window_size, dropped), the same step (finetune/full.py or
lora.py's, chunked_cross_entropy from 3ba6da40's utils.py, LoRA's dropout through torch.native_dropout), bf16 with
Fabric's fp32 outputs (a wrapper doing what _FabricModule does at bf16-true: the module in bf16, the forward under a
bf16 default dtype, each floating output `.to(float32)`), AdamW foreach, two warm-up steps then two under MemTracker.
Prints the peak, its phase and MemTracker's categories at the peak.

    git --git-dir=<litgpt mirror> archive 3ba6da4012fa880294ae4557cc16e5182591a73d litgpt | tar -x -C /tmp/src3ba6
    PYTHONPATH=src python tests/support/litgpt_head_vs_3ba6da40.py /tmp/src3ba6 CHECKPOINT_DIR full|lora MICRO_BATCH

(CHECKPOINT_DIR: one test_litgpt_head.checkpoint wrote.) Under torch 2.13 (2 layers, width 256, 8 heads, vocabulary
4,096, 256 tokens; test_litgpt_head.py's shapes): Llama full 1 x 256 40,270,412 B, 2 x 256 59,610,700; Phi-3 full
1 x 256 41,974,348; Llama LoRA q, v r 32 2 x 256 42,364,440; Phi-3 LoRA everywhere r 8 2 x 256 48,361,568; each
in the backward. LitGPT 0.5.13's own step: 40,932,944, 60,930,640, 42,899,024, 42,377,756, 48,631,908."""
import dataclasses
import importlib
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

import litgpt_source_measure as source_measure  # noqa: E402
import peak_reference as ref  # noqa: E402

QV = dict(r=32, alpha=16, dropout=0.05, query=True, key=False, value=True, projection=False, mlp=False, head=False)
EVERY = dict(r=8, alpha=16, dropout=0.05, query=True, key=True, value=True, projection=True, mlp=True, head=True)


class Fabric(torch.nn.Module):
    """_FabricModule at bf16-true for a tensor or a list of tensors (full.py's logits, lora.py's chunks)."""

    def __init__(self, module):
        super().__init__()
        self.module = module.to(dtype=torch.bfloat16)

    def forward(self, *args, **kwargs):
        torch.set_default_dtype(torch.bfloat16)
        try:
            out = self.module(*args, **kwargs)
        finally:
            torch.set_default_dtype(torch.float32)
        return out.to(torch.float32) if torch.is_tensor(out) else [t.to(torch.float32) for t in out]


def native_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


def main(source: str, checkpoint: str, script: str, micro: int, seq: int = 256) -> dict:
    lora_mod, utils = source_measure.import_litgpt(source, "3ba6da40")
    model_mod = importlib.import_module("litgpt.model")
    raw = yaml.safe_load((pathlib.Path(checkpoint) / "model_config.yaml").read_text())
    config_cls = model_mod.Config if script == "full" else lora_mod.Config
    fields = {f.name for f in dataclasses.fields(config_cls)}
    kwargs = {k: v for k, v in raw.items() if k in fields}
    if script == "lora":
        kwargs.update({f"lora_{k}": v for k, v in (QV if raw["n_query_groups"] != raw["n_head"] else EVERY).items()})
    config = config_cls(**kwargs)
    torch.manual_seed(0)
    model = (model_mod.GPT if script == "full" else lora_mod.GPT)(config)
    if script == "lora":
        lora_mod.mark_only_lora_as_trainable(model)
    model = Fabric(model)
    opt = torch.optim.AdamW(list(model.parameters()), foreach=True)
    idx = torch.randint(0, config.padded_vocab_size, (micro, seq), generator=torch.Generator().manual_seed(1))
    loop = {}

    def step(tracker=None):
        if tracker is not None:
            tracker.phase = "forward"
        if script == "full":
            logits = loop["logits"] = model(idx)
            loss = utils.chunked_cross_entropy(logits[..., :-1, :], idx[..., 1:])
        else:
            logits = loop["logits"] = model(idx, lm_head_chunk_size=128)
            logits[-1] = logits[-1][..., :-1, :]
            loss = utils.chunked_cross_entropy(logits, idx[..., 1:])
        if tracker is not None:
            tracker.phase = "backward"
        loss.backward()
        if tracker is not None:
            tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad()

    original, F.dropout = F.dropout, native_dropout
    try:
        tracker = ref.tracked(step, model, opt, idx, times=2)
    finally:
        F.dropout = original
    peak, phase = tracker.peak()
    categories = {str(k): v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items() if v}
    return {"script": script, "micro_batch": micro, "dropped": sorted(set(raw) - fields), "bytes": peak, "phase": phase,
            "categories": categories}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
