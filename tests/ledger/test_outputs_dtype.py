"""Outputs converted to fp32 after the forward (`training.outputs_dtype: float32`, ledger/techniques/outputs_dtype.py):
LitGPT 3ba6da40's LoRA step (tests/support/litgpt_port.py: a tiny Llama whose logits dominate, hidden 64, vocabulary
4,096, LoRA r 8 on q and v, gradient accumulation 2) through Lightning Fabric's `_FabricModule.forward` at bf16-true,
its `convert_output` ported (litgpt_port.FabricModule, lines cited there; on `lightning==2.3.0.dev20240318` itself the
same steps peaked at the same bytes: 29,280,920 B and 48,986,768 B, tests/support/litgpt_fabric_measure.py, whose
output docs/accuracy.md gives), measured with MemTracker, against `memfit check` on the config of that step."""

from __future__ import annotations

import json
import subprocess
import sys

import needs
import pytest

BAND = 0.05


@pytest.mark.filterwarnings("ignore")
def test_fabric_hands_litgpts_loss_fp32_logits(tmp_path):
    """2 x 256 tokens, two chunks, the logits let go after the backward: the peak is the loss's backward, on fp32
    chunks, beside the fp32 logits; without the key memfit prices bf16 ones (beyond the band)."""
    needs.module("torch")
    import litgpt_fabric_measure as litgpt

    measured = litgpt.measured(fabric=False, port=True)
    mine = litgpt.memfit(held=True, converted=True, path=tmp_path)
    without = litgpt.memfit(held=True)
    assert measured[2] == "torch.float32", measured
    assert abs(mine[0] - measured[0]) <= BAND * measured[0], (mine, measured)
    assert mine[1] == measured[1] == "backward", (mine, measured)
    assert measured[0] - without[0] > BAND * measured[0], (without, measured)


@pytest.mark.filterwarnings("ignore")
def test_the_conversion_beside_the_previous_fp32_logits(tmp_path):
    """1 x 1,024 tokens, eight chunks, `fit`'s loop (the previous micro-batch's logits bound until the forward
    returns): the peak is the conversion, the whole logits in bf16 and in fp32 beside the previous fp32 ones."""
    needs.module("torch")
    import litgpt_fabric_measure as litgpt

    shape = (1, 1024)
    measured = litgpt.measured(fabric=False, hold=True, port=True, shape=shape)
    mine = litgpt.memfit(held=True, converted=True, shape=shape, path=tmp_path)
    without = litgpt.memfit(held=True, shape=shape)
    assert abs(mine[0] - measured[0]) <= BAND * measured[0], (mine, measured)
    assert mine[1] == measured[1] == "forward", (mine, measured)
    assert measured[0] - without[0] > BAND * measured[0], (without, measured)
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", str(tmp_path / "train.yaml")], capture_output=True,
                          text=True, timeout=120, check=True)
    assert "the peak is in forward, at head" in done.stdout, done.stdout


def test_the_key_without_a_transformer_is_refused(tmp_path):
    (tmp_path / "run.yaml").write_text("memfit: 1\ndevice: {memory: 80 GB}\noptimizer: adamw\n"
                                       "model:\n  input_shape: [4]\n  batch_size: 2\n  layers:\n    - {type: Dense, units: 3}\n"
                                       "training:\n  outputs_dtype: float32\n")
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "run.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(done.stdout)["files"][0]["diagnostics"]
    assert any(d["code"] == "needs-transformer" for d in diagnostics), diagnostics


def _last_stage_forward(outputs_dtype: str) -> int:
    """The last pipeline stage's forward worst, for llama-2-7b's config at bf16-true, 1 x 4,096, pipeline 2."""
    from pathlib import Path

    from memfit.check.pipeline import check
    from memfit.ledger import ranks

    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "llama-2-7b.json"
    result = check(f"memfit: 1\ndevice: {{memory: 80 GB}}\nprecision: bf16-true\noptimizer: adamw\n"
                   f"model:\n  hf_config: {model}\ntraining:\n  micro_batch: 1\n  seq_len: 4096\n"
                   f"  outputs_dtype: {outputs_dtype}\nparallel:\n  pipeline: 2\n")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    config = result.config
    assert config.placement.peak["per_rank"][-1]["stage"] == 1
    walked = ranks.stage_peak(config.step, 1, config.parallel, config.granule, ranks.holding(config.placement, 1))
    return walked["phases"]["forward"]["bytes"]


def test_a_pipelines_last_stage_keeps_the_fp32_logits():
    """Under pipeline parallelism the last stage's loss dropped its first forward term as the logits the stage holds
    as its output; after the conversion that term is the fp32 copy, beside the 16-bit logits: the forward's worst
    with the key was 262,176,780 B under the one without (33,620,828,160 B against 33,883,004,940 B)."""
    assert _last_stage_forward("float32") >= _last_stage_forward("model")


def _check_json(path) -> dict:
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    return json.loads(done.stdout)["files"][0]


def test_an_encoder_decoder_is_left_as_the_model_makes_it(tmp_path):
    """On an encoder-decoder the key is not modelled: the warning says which way the figure is off and the figure is
    the one without the key (flan-t5-base, bf16-true, 2 x 512: it used to move 3,787,509,250 -> 3,983,339,012 B)."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "flan-t5-base.json"
    found = {}
    for dtype in ("model", "float32"):
        (tmp_path / f"{dtype}.yaml").write_text(
            f"memfit: 1\ndevice: {{memory: 80 GB}}\nprecision: bf16-true\noptimizer: adamw\nmodel:\n  hf_config: {model}\n"
            f"training:\n  micro_batch: 2\n  seq_len: 512\n  outputs_dtype: {dtype}\n")
        found[dtype] = _check_json(tmp_path / f"{dtype}.yaml")
    assert found["float32"]["peak"]["bytes"] == found["model"]["peak"]["bytes"]
    assert found["float32"]["footprint"] == found["model"]["footprint"]
    warned = [d["message"] for d in found["float32"]["diagnostics"] if d["code"] == "not-modelled"]
    assert warned and "low" in warned[0], warned


def _step(model: str, outputs_dtype: str):
    from pathlib import Path

    from memfit.check.pipeline import check

    path = Path(__file__).resolve().parents[2] / "examples" / "models" / f"{model}.json"
    result = check(f"memfit: 1\ndevice: {{memory: 80 GB}}\nprecision: bf16-true\noptimizer: adamw\nmodel:\n  hf_config: {path}\n"
                   f"training:\n  micro_batch: 2\n  seq_len: 128\n  outputs_dtype: {outputs_dtype}\n")
    return result.config.step


@pytest.mark.parametrize("model, upcast", [("llama-2-7b", True), ("roberta-base", False)])
def test_the_default_loss_names_its_terms(model, upcast):
    """The default loss's `forward` is the logits it reads, its own fp32 copy of them (Loss.upcast: a causal LM's
    logits.float(); none for RoBERTa's masked-LM loss, on the 16-bit logits) and what the model's forward holds unsaved
    (Loss.held); converted to fp32 it reads the fp32 logits with no copy of its own, what is held unchanged, and a loss
    that computed in bf16 keeps its log-softmax in fp32 (twice the bytes)."""
    made, converted = _step(model, "model"), _step(model, "float32")
    logits = made.tensors[made.rows[-1].output]
    assert made.loss.forward == (logits, *([logits * 2] if upcast else []), *made.loss.held)
    assert bool(made.loss.upcast) == upcast
    assert converted.loss.forward == (logits * 2, *made.loss.held) and converted.loss.upcast == 0
    assert converted.loss.backward == (logits * 2, logits * 2)
    log_softmax = made.loss_kept[0]
    assert made.tensors[log_softmax] == (logits * 2 if upcast else logits)
    assert converted.tensors[log_softmax] == logits * 2
