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

import json
import pathlib
import subprocess
import sys
import tempfile
import warnings

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import yaml  # noqa: E402

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

    for _ in range(2):
        micro()
        micro()
        opt.step()
        opt.zero_grad()
    tracker = ref.PhaseTracker(list(model.parameters()))
    tracker._mod_tracker = ref.NoModules()
    tracker.track_external(model, opt, idx)
    with tracker:
        micro(tracker)
        micro(tracker)
        tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad()
    return tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"], tracker.peak_phase, str(seen["dtype"])


def memfit(held: bool = True, converted: bool = False, shape: tuple = (B, T), path: pathlib.Path | None = None) -> tuple:
    """memfit check's (peak bytes, phase) on the config of that step (written into `path`, a folder, where given)."""
    tmp = path or pathlib.Path(tempfile.mkdtemp())
    cfg = {"model_type": "llama", "hidden_size": W, "num_attention_heads": H, "num_key_value_heads": H,
           "num_hidden_layers": L, "vocab_size": V, "intermediate_size": I, "tie_word_embeddings": False,
           "max_position_embeddings": max(shape[1], 256), "hidden_act": "silu", "rms_norm_eps": 1e-5}
    (tmp / "config.json").write_text(json.dumps(cfg))
    training = {"micro_batch": shape[0], "seq_len": shape[1], "gradient_accumulation": 2, "attention": "sdpa", "checkpointing": "none",
                "optimizer_impl": "foreach", "loss": {"kind": "chunked_head", "chunk_size": 128}, "litgpt_qkv": True,
                "previous_outputs_held": held, **({"outputs_dtype": "float32"} if converted else {})}
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "optimizer": "adamw", "precision": "bf16-true",
           "model": {"hf_config": "config.json"}, "training": training,
           "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "dtype": "model", "target_modules": ["q_proj", "v_proj"]}}
    (tmp / "run.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp / "run.yaml")],
                          capture_output=True, text=True, check=True)
    peak = json.loads(done.stdout)["files"][0]["peak"]
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
