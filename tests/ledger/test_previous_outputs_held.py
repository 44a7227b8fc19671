"""A loop that keeps the previous micro-batch's outputs bound through the next forward (`training.previous_outputs_held`,
ledger/techniques/previous_outputs_held.py), as LitGPT's `logits = model(...)` does: a QLoRA step on a tiny Llama with
bitsandbytes' 0.43.1 MatMul4Bit line put back (test_quantized_saves_input), two micro-batches of gradient accumulation
run the way litgpt/finetune/lora.py (3ba6da40) runs them, measured with MemTracker without its module hooks
(ModTracker's backward hooks hold each module's outputs, so a graph whose nodes hold tensors as attributes would
outlive the loop's last reference to it), against `memfit check` with the key."""

from __future__ import annotations

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


def measured(cfg: dict, hold: bool, shapes: tuple = (SHAPE, SHAPE)) -> dict:
    """The peak of one step of two micro-batches of `shapes` (sequences, tokens) each."""

    import hf_measure
    import peak_reference as ref
    from test_quantized_saves_input import bitsandbytes_0_43_1

    model = hf_measure.build(cfg, precision="bf16-true", lora=LORA, quantization=QUANT)
    batches = [(d["input_ids"], d["labels"]) for d in (hf_measure.inputs(cfg, *shape) for shape in shapes)]
    opt = ref.OPTIMIZERS["adamw"]([p for p in model.parameters() if p.requires_grad], **ref.IMPLS["foreach"])
    loop = {}

    def micro(tracker=None, n=0):
        x, y = batches[n]
        logits = model(input_ids=x).logits
        if hold:
            loop["logits"] = logits   # the previous micro-batch's logits (and their graph) rebound only now
        loss = model.base_model.model.loss_function(logits, y, vocab_size=cfg["vocab_size"])
        if tracker is not None:
            tracker.phase = "backward"
        loss.backward()

    def step(tracker=None):
        for n in range(2):   # gradient accumulation 2: the second micro-batch runs beside the first's outputs
            if tracker is not None:
                tracker.phase = "forward"
            micro(tracker, n)
        if tracker is not None:
            tracker.phase = "optimizer_step"
        opt.step()
        opt.zero_grad()

    with bitsandbytes_0_43_1(), hf_measure.cuda_dropout():
        peak, phase = ref.tracked(step, model, opt, *batches[0], *batches[1]).peak()
    return {"bytes": peak, "phase": phase}


def ours(tmp_path, cfg: dict, hold) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    training = {"micro_batch": SHAPE[0], "seq_len": SHAPE[1], "gradient_accumulation": 2, "checkpointing": "none",
                "optimizer_impl": "foreach", "attention": "sdpa", "quantized_saves_input": True}
    if hold:
        training["previous_outputs_held"] = hold
    doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "precision": "bf16-true", "quantization": QUANT, "lora": LORA, "training": training}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]["peak"]


@pytest.mark.filterwarnings("ignore")
def test_the_previous_graph_holds_each_4bit_input_through_the_next_forward(tmp_path):
    needs.module("bitsandbytes")
    needs.module("peft")
    from test_peak_transformers import hf_tiny

    cfg = {**hf_tiny("llama"), "num_hidden_layers": 4}
    held, dropped = measured(cfg, True), measured(cfg, False)
    mine, without = ours(tmp_path, cfg, True), ours(tmp_path, cfg, False)
    assert abs(mine["bytes"] - held["bytes"]) <= BAND * held["bytes"], (mine["bytes"], held["bytes"])
    assert mine["phase"] == held["phase"] == "forward", (mine["phase"], held["phase"])
    # a loop that drops its outputs first peaks lower, in the backward, and memfit without the key says that loop
    assert held["bytes"] > dropped["bytes"] and dropped["phase"] == without["phase"] == "backward"
    assert abs(without["bytes"] - dropped["bytes"]) <= BAND * dropped["bytes"], (without["bytes"], dropped["bytes"])
    assert held["bytes"] - without["bytes"] > BAND * held["bytes"]  # what the key adds is beyond the band


@pytest.mark.filterwarnings("ignore")
def test_longest_first_holds_the_outputs_through_their_own_step_only(tmp_path):
    """`previous_outputs_held: longest_first` (Lit-GPT 8641822's loop: the longest sample in the first batch, each
    later batch padded to its own longest): the same QLoRA step with the loop holding the logits and the graph, its
    second micro-batch 8 tokens a sequence where the first has 64: the peak is the first micro-batch's own backward,
    its logits held, and memfit with longest_first (every micro-batch priced at 64 tokens) is within the band of it;
    `true` (a second forward of 64 tokens beside the first's 4-bit inputs and logits) is above the band."""
    needs.module("bitsandbytes")
    needs.module("peft")
    from test_peak_transformers import hf_tiny

    cfg = {**hf_tiny("llama"), "num_hidden_layers": 4}
    held = measured(cfg, True, (SHAPE, (SHAPE[0], 8)))
    mine, equal = ours(tmp_path, cfg, "longest_first"), ours(tmp_path, cfg, True)
    assert held["phase"] == mine["phase"] == "backward", (held, mine)
    assert abs(mine["bytes"] - held["bytes"]) <= BAND * held["bytes"], (mine["bytes"], held["bytes"])
    assert equal["bytes"] - held["bytes"] > BAND * held["bytes"], (equal["bytes"], held["bytes"])


def test_the_key_without_a_transformer_is_refused(tmp_path):
    (tmp_path / "run.yaml").write_text("memfit: 1\ndevice: {memory: 80 GB}\noptimizer: adamw\n"
                                       "model:\n  input_shape: [4]\n  batch_size: 2\n  layers:\n    - {type: Dense, units: 3}\n"
                                       "training:\n  previous_outputs_held: true\n")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(done.stdout)["files"][0]["diagnostics"]
    assert any(d["code"] == "needs-transformer" for d in diagnostics), diagnostics


@pytest.mark.filterwarnings("ignore")
def test_litgpts_loop_holds_its_logits_through_the_backward():
    """LitGPT 3ba6da40's step (litgpt_port: its code for a tiny Llama whose logits dominate) as `fit` runs it, `logits`
    bound from the forward through the backward into the next forward: the key says it; without it memfit lets the
    logits go at the loss, as a loop dropping them would."""
    needs.module("torch")
    import litgpt_fabric_measure as litgpt

    measured = litgpt.measured(fabric=False)
    mine, without = litgpt.memfit(held=True), litgpt.memfit(held=False)
    assert abs(mine[0] - measured[0]) <= BAND * measured[0], (mine, measured)
    assert mine[1] == measured[1] == "backward", (mine, measured)
    assert measured[0] - without[0] > BAND * measured[0], (without, measured)
