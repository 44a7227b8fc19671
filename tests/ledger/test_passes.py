"""The passes beside a run's training step (ledger/passes.py), measured through `memfit check` on configs a user
writes:

- the evaluation pass (`training.eval_batch`; Axolotl's eval_batch_size, the Trainer's and LLaMA-Factory's
  per_device_eval_batch_size): MemTracker around a transformers model's training step then its evaluation forward
  (labels, under no_grad, as the Trainer's prediction_step runs it) at the evaluation batch, the weights and the
  optimizer state resident;
- torchtune's knowledge distillation (`teacher_model`, `kd_loss`): MemTracker around torchtune 0.6.1's own KD step
  (tests/support/torchtune_kd_step.py, in torchtune's interpreter: MEMFIT_TORCHTUNE_PYTHON)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

SUPPORT = Path(__file__).resolve().parents[1] / "support"
BAND = 0.05


def memfit(*args, cwd):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


# --- the evaluation pass -------------------------------------------------------------------------------------------
def measured_with_evaluation(cfg: dict, micro: int, eval_batch: int, seq: int) -> dict:
    """MemTracker's peak over a training step (AdamW foreach, fp32) and then the evaluation forward at `eval_batch`
    (model.eval(), torch.no_grad(), the labels given: the Trainer's prediction_step with prediction_loss_only), and
    which of the two held it."""
    import hf_measure
    import peak_reference as ref
    import torch

    model = hf_measure.build(cfg)
    train, evaluation = hf_measure.inputs(cfg, micro, seq), hf_measure.inputs(cfg, eval_batch, seq, seed=2)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)

    def step():
        model.train()
        model(**train).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            model(**evaluation).loss.item()

    for _ in range(2):
        step()
    # two trackers, one per pass (MemTracker follows one call of the model per context): what persists between the
    # passes (the weights, the optimizer state, the batches) is tracked by both, so the run's peak is the larger
    peaks = {}
    for name in ("train", "evaluation"):
        tracker = ref.PhaseTracker(list(model.parameters()))
        tracker.track_external(model, optimizer, *train.values(), *evaluation.values())
        with tracker:
            if name == "train":
                model.train()
                model(**train).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                model.eval()
                with torch.no_grad():
                    model(**evaluation).loss.item()
        peaks[name] = tracker.get_tracker_snapshot("peak")[ref.CPU]["Total"]
    total = max(peaks.values())
    return {"bytes": total, "train": peaks["train"], "evaluation": peaks["evaluation"], "evaluation_held_it": peaks["evaluation"] > peaks["train"]}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("eval_batch", [2, 16])
def test_the_evaluation_pass_through_each_reader_matches_memtracker(tmp_path, eval_batch):
    """An evaluation batch 8x the training batch's holds the run's peak (the evaluation forward's logits and their
    fp32 copies); one at the training batch's size does not. memfit's figure through the memfit config and through
    each native reader is the measured peak within the band; without the eval key the figure is the step's."""
    needs.module("torch")
    needs.module("transformers")
    import hf_measure

    cfg = {**hf_measure.without_attention_dropout(hf_measure.tiny("llama")), "vocab_size": 4096}
    micro, seq = 2, 64
    measured = measured_with_evaluation(cfg, micro, eval_batch, seq)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    run = {"micro_batch": micro, "seq_len": seq, "optimizer_impl": "foreach", "eval_batch": eval_batch}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": "32-true",
                                                       "model": {"hf_config": "config.json"}, "training": run}))
    (tmp_path / "args.json").write_text(json.dumps({"model_name_or_path": "./config.json", "output_dir": "o", "per_device_train_batch_size": micro,
                                                    "do_eval": True, "per_device_eval_batch_size": eval_batch, "max_seq_length": seq, "optim": "adamw_torch"}))
    (tmp_path / "ax.yml").write_text(f"base_model: ./config.json\nmicro_batch_size: {micro}\nsequence_len: {seq}\nval_set_size: 0.05\n"
                                     f"eval_batch_size: {eval_batch}\noptimizer: adamw_torch\nbf16: false\n")
    (tmp_path / "lf.yaml").write_text(f"model_name_or_path: ./config.json\nstage: pt\nfinetuning_type: full\ncutoff_len: {seq}\n"
                                      f"per_device_train_batch_size: {micro}\ndo_eval: true\nper_device_eval_batch_size: {eval_batch}\noptim: adamw_torch\n"
                                      "disable_gradient_checkpointing: true\n")
    out = memfit("check", "--format", "json", "--budget", "1TiB", "run.yaml", "args.json", "ax.yml", "lf.yaml", cwd=tmp_path)
    files = json.loads(out.stdout)["files"]
    for file in files:
        peak = file["peak"]
        assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (file["path"], peak["bytes"], measured)
        assert (peak["phase"] == "evaluation") is measured["evaluation_held_it"], (file["path"], peak["phase"], measured)
        assert not [d for d in file["diagnostics"] if "eval" in d["message"]], file["diagnostics"]
    assert measured["evaluation_held_it"] is (eval_batch > 8)
    if eval_batch > 8:  # the key is what moved the figure: without it the peak is the training step's
        (tmp_path / "plain.yaml").write_text((tmp_path / "run.yaml").read_text().replace(f"eval_batch: {eval_batch}", "micro_batch: 2"))
        plain = json.loads(memfit("check", "--format", "json", "--budget", "1TiB", "plain.yaml", cwd=tmp_path).stdout)["files"][0]
        assert abs(plain["peak"]["bytes"] - measured["train"]) <= BAND * measured["train"]
        assert plain["peak"]["bytes"] < measured["bytes"] * (1 - BAND)


def test_the_evaluation_pass_is_the_timelines_last_event_and_its_peak(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"memfit": 1, "device": {"preset": "H100"}, "optimizer": "adamw", "model": {"transformer": TINY},
                                                       "training": {"micro_batch": 2, "seq_len": 64, "eval_batch": 64}}))
    file = json.loads(memfit("explain", "--format", "json", "run.yaml", cwd=tmp_path).stdout)["files"][0]
    last = file["timeline"][-1]
    assert file["peak"]["phase"] == "evaluation" and last["phase"] == "evaluation"
    assert last["bytes"] == file["peak"]["bytes"] == max(e["bytes"] for e in file["timeline"])
    assert file["peak"]["live"]["gradients"] == 0 < file["peak"]["live"]["optimizer_state"]  # freed by zero_grad, kept
    text = memfit("explain", "run.yaml", cwd=tmp_path).stdout
    assert re.search(r"evaluation +\[#+\.*\] +[0-9.]+ [KMG]iB  <- peak", text) and "the peak is in the evaluation pass (the loss):" in text, text


TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096}


def test_suggest_and_fit_lower_the_evaluation_batch_where_it_holds_the_peak(tmp_path):
    """Where the evaluation pass holds the run's peak, --suggest lowers the evaluation batch (an edit of the native
    key) and fit --vary eval_batch finds the largest that fits; the edited file passes."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    native = tmp_path / "lf.yaml"
    native.write_text("model_name_or_path: ./config.json\nstage: pt\nfinetuning_type: full\ncutoff_len: 64\nper_device_train_batch_size: 2\n"
                      "do_eval: true\nper_device_eval_batch_size: 64\ndisable_gradient_checkpointing: true\n")
    budget = "40MiB"
    out = memfit("check", "--suggest", "--budget", budget, "lf.yaml", cwd=tmp_path)
    assert out.returncode == 1 and "during the evaluation pass exceeds the budget" in out.stdout, out.stdout
    found = re.search(r"eval_batch 64 → (\d+) \(the evaluation pass on fewer sequences; the training step unchanged\)", out.stdout)
    assert found and f"lf.yaml:7:29: replace with '{found.group(1)}'" in out.stdout, out.stdout
    fit = memfit("fit", "--vary", "eval_batch", "--budget", budget, "lf.yaml", cwd=tmp_path)
    assert f"lf.yaml: eval_batch ≤ {found.group(1)} fits" in fit.stdout, fit.stdout
    native.write_text(native.read_text().replace("per_device_eval_batch_size: 64", f"per_device_eval_batch_size: {found.group(1)}"))
    assert memfit("check", "--budget", budget, "lf.yaml", cwd=tmp_path).returncode == 0


def test_an_evaluation_batch_under_a_layout_is_still_a_warning(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "ax.yml").write_text("base_model: ./config.json\nmicro_batch_size: 2\nsequence_len: 64\nval_set_size: 0.05\neval_batch_size: 32\n")
    out = memfit("check", "--device", "H100", "--gpus", "8", "ax.yml", cwd=tmp_path)
    assert "ax.yml:5:1: warning[not-modelled] eval_batch_size 32 is larger than the training micro-batch 2" in out.stdout, out.stdout
    assert "under a parallel layout" in out.stdout


# --- knowledge distillation ----------------------------------------------------------------------------------------
STUDENT = {"vocab_size": 4096, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 112, "max_seq_len": 256,
           "lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": False, "apply_lora_to_output": False, "lora_rank": 8, "lora_alpha": 16}
# the teacher wider and deeper than the student, as 8B to 1B is
TEACHER = {"vocab_size": 4096, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 256, "intermediate_dim": 512, "max_seq_len": 256}
KD = [("bf16", 8), ("bf16", 0), ("fp32", 8)]


def kd_config(dtype: str, chunks: int, teacher: bool = True) -> dict:
    config = {"model": {"_component_": "torchtune.models.llama3.lora_llama3", **STUDENT}}
    if teacher:
        config["teacher_model"] = {"_component_": "torchtune.models.llama3.llama3", **TEACHER}
    config.update({"tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/tokenizer.model", "max_seq_len": 64},
                   "batch_size": 2, "optimizer": {"_component_": "torch.optim.AdamW", "fused": True}, "dtype": dtype})
    if chunks:
        config["loss"] = {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss", "num_output_chunks": chunks}
        config["kd_loss"] = {"_component_": "torchtune.modules.loss.ForwardKLWithChunkedOutputLoss", "num_output_chunks": chunks}
    else:
        config["loss"] = {"_component_": "torch.nn.CrossEntropyLoss"}
        config["kd_loss"] = {"_component_": "torchtune.modules.loss.ForwardKLLoss"}
    config["kd_ratio"] = 0.5
    return config


_KD: dict = {}


def measured_kd(dtype: str, chunks: int) -> dict:
    if not _KD:
        python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
        if not python:
            needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
        specs = [{"dtype": d, "chunks": c, "student": STUDENT, "teacher": TEACHER, "batch_size": 2, "seq_len": 64} for d, c in KD]
        done = subprocess.run([python, str(SUPPORT / "torchtune_kd_step.py"), json.dumps(specs)], capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        for key, line in zip(KD, done.stdout.strip().splitlines()[-len(KD):]):
            _KD[key] = json.loads(line)
    return _KD[(dtype, chunks)]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, chunks", KD)
def test_knowledge_distillation_matches_torchtunes_kd_step(tmp_path, dtype, chunks):
    measured = measured_kd(dtype, chunks)
    (tmp_path / "kd_single_device.yaml").write_text(yaml.safe_dump(kd_config(dtype, chunks), sort_keys=False))
    (tmp_path / "student_single_device.yaml").write_text(yaml.safe_dump(kd_config(dtype, chunks, teacher=False), sort_keys=False))
    out = memfit("check", "--format", "json", "--budget", "1GiB", "kd_single_device.yaml", "student_single_device.yaml", cwd=tmp_path)
    kd, student = json.loads(out.stdout)["files"]
    assert abs(kd["peak"]["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (kd["peak"]["bytes"], measured)
    assert kd["peak"]["phase"] == measured["phase"]
    assert not [d for d in kd["diagnostics"] if "teacher" in d["message"] or "kd_loss" in d["message"]], kd["diagnostics"]
    # the teacher's weights are resident beside the student's (with its rotary buffer, memfit's: 256 B here); without
    # the teacher the figure is far below the run's
    added = kd["peak"]["live"]["parameters"] - student["peak"]["live"]["parameters"]
    assert 0 <= added - measured["teacher_bytes"] <= 0.001 * measured["teacher_bytes"], (added, measured["teacher_bytes"])
    assert student["peak"]["bytes"] < measured["bytes"] * (1 - BAND)


def test_the_upstream_kd_config_counts_the_teacher(tmp_path):
    """torchtune's recipes/configs/llama3_2/8B_to_1B_KD_lora_single_device.yaml (0.6.1) against a 16 GiB card: the
    two models' bf16 weights alone are over 16 GiB, so it cannot fit (issue 33: it used to "fit" at 8.93 GiB)."""
    text = (Path(__file__).resolve().parents[1] / "read" / "torchtune_configs" / "llama3_2_8B_to_1B_KD_lora_single_device.yaml").read_text()
    (tmp_path / "8B_to_1B_KD_lora_single_device.yaml").write_text(text)
    out = memfit("check", "--format", "json", "--budget", "16GiB", "8B_to_1B_KD_lora_single_device.yaml", cwd=tmp_path)
    assert out.returncode == 1, out.stdout
    file = json.loads(out.stdout)["files"][0]
    teacher = 8_030_261_248 * 2  # Llama 3.1 8B's parameters (transformers' count), bf16
    assert file["peak"]["live"]["parameters"] > teacher > 16 * 2**30 * 0.9
    assert any(d["code"] == "budget-exceeded" for d in file["diagnostics"])
    distributed = text.replace("batch_size: 4", "batch_size: 4")
    (tmp_path / "8B_to_1B_KD_lora_distributed.yaml").write_text(distributed)
    out = memfit("check", "--budget", "80GiB", "--gpus", "2", "8B_to_1B_KD_lora_distributed.yaml", cwd=tmp_path)
    assert "warning[not-modelled] teacher_model over 2 GPUs" in out.stdout, out.stdout


def test_another_kd_loss_and_a_lora_teacher_are_warned_at_their_keys(tmp_path):
    config = kd_config("bf16", 8)
    config["kd_loss"] = {"_component_": "torchtune.modules.loss.ReverseKLWithChunkedOutputLoss"}
    config["teacher_model"]["_component_"] = "torchtune.models.llama3.lora_llama3"
    (tmp_path / "kd.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    lines = (tmp_path / "kd.yaml").read_text().splitlines()
    teacher = next(i for i, row in enumerate(lines, 1) if row.startswith("teacher_model:")) + 1
    kd = next(i for i, row in enumerate(lines, 1) if row.startswith("kd_loss:")) + 1
    out = memfit("check", "--budget", "1GiB", "kd.yaml", cwd=tmp_path).stdout
    assert f"kd.yaml:{kd}:16: warning[not-modelled] kd_loss ReverseKLWithChunkedOutputLoss: memfit models the forward KL" in out, out
    assert f"kd.yaml:{teacher}:16: warning[not-modelled] teacher_model lora_llama3: memfit counts the teacher as its base model" in out, out
