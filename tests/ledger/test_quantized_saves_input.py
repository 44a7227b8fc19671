"""bitsandbytes before 0.43.2 kept each 4-bit matmul's input (`training.quantized_saves_input`,
ledger/techniques/quantized_saves_input.py). The installed bitsandbytes (0.50.2) keeps `ctx.tensors = (None, B)`; the
older forward is its own line put back (0.43.1 bitsandbytes/autograd/_functions.py MatMul4Bit.forward:
`if any(ctx.needs_input_grad[:2]): ctx.tensors = (A, B)`), and a QLoRA step on a tiny Llama is measured with
MemTracker against `memfit check` with the key (and without it, against the unpatched step)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import needs
import pytest
import yaml

BAND = 0.05
SHAPE = (2, 64)
QUANT = {"method": "nf4", "compute_dtype": "bfloat16"}
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}


@contextlib.contextmanager
def bitsandbytes_0_43_1():
    """MatMul4Bit.forward as 0.43.1 ended it: the input A kept on the node with the packed weight."""
    import bitsandbytes.autograd._functions as functions

    original = functions.MatMul4Bit.forward

    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        output = original(ctx, A, B, out, bias, quant_state)
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])
        return output

    functions.MatMul4Bit.forward = staticmethod(forward)
    try:
        yield
    finally:
        functions.MatMul4Bit.forward = staticmethod(original)


def measured(cfg: dict, precision: str, old: bool) -> dict:
    import torch

    import hf_measure
    import peak_reference as ref

    model = hf_measure.build(cfg, precision="bf16-true" if precision == "bf16-true" else "32-true", lora=LORA,
                             quantization=QUANT)
    data = hf_measure.inputs(cfg, *SHAPE)
    opt = ref.OPTIMIZERS["adamw"]([p for p in model.parameters() if p.requires_grad], **ref.IMPLS["foreach"])
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()

    def loss(m, x, y):
        with autocast:
            return m(input_ids=x, labels=y).loss

    with (bitsandbytes_0_43_1() if old else contextlib.nullcontext()), hf_measure.cuda_dropout():
        return ref.measure(model, (data["input_ids"], data["labels"]), loss, opt)


def ours(tmp_path, cfg: dict, precision: str, old: bool) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    training = {"micro_batch": SHAPE[0], "seq_len": SHAPE[1], "checkpointing": "none", "optimizer_impl": "foreach", "attention": "sdpa"}
    if old:
        training["quantized_saves_input"] = True
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "precision": precision, "quantization": QUANT, "lora": LORA, "training": training}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
def test_old_bitsandbytes_keeps_each_4bit_input(tmp_path, precision):
    needs.module("bitsandbytes")
    needs.module("peft")
    from test_peak_transformers import hf_tiny

    cfg = {**hf_tiny("llama"), "num_hidden_layers": 4}
    old, new = measured(cfg, precision, True), measured(cfg, precision, False)
    mine_old, mine_new = ours(tmp_path, cfg, precision, True)["peak"], ours(tmp_path, cfg, precision, False)["peak"]
    assert abs(mine_old["bytes"] - old["bytes"]) <= BAND * old["bytes"], (mine_old["bytes"], old["bytes"])
    # what the key adds is what the older forward keeps more, measured
    assert old["bytes"] > new["bytes"] and mine_old["bytes"] > mine_new["bytes"]
    added, kept_more = mine_old["bytes"] - mine_new["bytes"], old["bytes"] - new["bytes"]
    assert abs(added - kept_more) <= BAND * old["bytes"], (added, kept_more)


def test_the_key_without_a_4bit_model_is_ignored(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 112,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}))
    (tmp_path / "run.yaml").write_text("memfit: 1\ndevice: {memory: 80 GB}\noptimizer: adamw\nmodel: {hf_config: config.json}\n"
                                       "training:\n  micro_batch: 1\n  seq_len: 512\n  quantized_saves_input: true\n")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(done.stdout)["files"][0]["diagnostics"]
    ignored = [d for d in diagnostics if d["code"] == "ignored-key"]
    assert ignored and ignored[0]["range"]["start"]["line"] == 7, diagnostics
