"""LLaMA-Factory's v1 format (USE_V1=1, src/memfit/read/native/llamafactory_v1.py), checked through the real CLI on
examples copied unchanged from hiyouga/LLaMA-Factory at ff6d4d1 (tests/read/llamafactory_v1/SOURCE.md), with the
config.json of the models they name mapped by a memfit.toml beside them.

Each file gives the same figures as the memfit config `memfit convert` prints for it (test_native.py's central
property), and the document says what v1's code does at that commit: core/model_engine.py casts a full fine-tune to
float32 and keeps a LoRA base in the checkpoint's dtype (bfloat16 for Qwen3), with no autocast; fsdp2 wraps only
under torchrun (more than one GPU), in bfloat16 mixed precision (fsdp2.py get_mp_policy); padding_free packs the
micro-batch into one row (plugins/trainer_plugins/batching.py); BnbParams' compute_dtype is float16.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent / "llamafactory_v1"


def memfit(*args):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, timeout=120, env=dict(os.environ))


def figures(path, *flags):
    out = memfit("check", "--format", "json", *flags, path)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["files"][0], out


def same_figures_as_converted(native: Path, *flags) -> dict:
    """check the native file and its convert output (saved beside it): the same figures (as test_native.py)."""
    converted = memfit("convert", *flags, native)
    assert converted.returncode == 0, converted.stderr
    memfit_file = native.with_name(native.stem + ".memfit.yaml")
    memfit_file.write_text(converted.stdout)
    a, _ = figures(native, *flags)
    b, _ = figures(memfit_file, *flags)
    assert b["input_format"] == "memfit"
    for key in ("footprint", "peak", "budget", "host"):
        assert a.get(key) == b.get(key), key
    assert a["footprint"] is not None and a["footprint"]["total"] > 0
    return {"native": a, "doc": yaml.safe_load(converted.stdout)}


@pytest.fixture
def v1(tmp_path) -> Path:
    shutil.copytree(HERE, tmp_path / "v1")
    return tmp_path / "v1"


def test_lora_sft_reads_as_lora_on_a_bf16_base(v1):
    out = same_figures_as_converted(v1 / "train_lora_sft.yaml", "--device", "H100-80GB")
    doc = out["doc"]
    # peft_config r 16, lora_alpha 32, lora_dropout 0.05, target_modules all (peft.py _find_all_linear_modules)
    assert doc["lora"] == {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
    assert doc["precision"] == "bf16-true"  # dtype="auto": Qwen3-4B's config.json torch_dtype bfloat16
    assert doc["training"] == {"attention": "sdpa", "micro_batch": 1, "seq_len": 2048, "checkpointing": "full", "optimizer_impl": "foreach",
                               "second_loss": "log_probs"}  # compute_log_probs after the model's own loss
    assert doc["optimizer"] == "adamw" and "parallel" not in doc  # one GPU: fsdp2 wraps nothing
    assert out["native"]["input_format"] == "llama-factory"
    # the trainer's second loss is priced (training.second_loss), no longer only warned about: the step peaks at the
    # trainer's log-softmax (docs/native-llama-factory.md shows 12.29 GiB)
    assert out["native"]["diagnostics"] == []
    peak = out["native"]["peak"]
    assert peak["phase"] == "forward" and f"{peak['bytes'] / 2**30:.2f}" == "12.29", peak["bytes"]


def test_full_fsdp2_is_float32_on_one_gpu_and_bf16_mixed_sharded_on_eight(v1):
    one = same_figures_as_converted(v1 / "train_full_fsdp2.yaml", "--device", "H100-80GB")["doc"]
    assert one["precision"] == "32-true" and "parallel" not in one and "lora" not in one
    eight = same_figures_as_converted(v1 / "train_full_fsdp2.yaml", "--device", "H100-80GB", "--gpus", "8")
    assert eight["doc"]["precision"] == "bf16-mixed"
    assert eight["doc"]["parallel"] == {"fsdp": "full_shard", "fsdp_version": 2, "data": 8}
    # sharded over 8 GPUs in bfloat16 compute: below the one-GPU float32 step
    a, _ = figures(v1 / "train_full_fsdp2.yaml", "--device", "H100-80GB")
    b, _ = figures(v1 / "train_full_fsdp2.yaml", "--device", "H100-80GB", "--gpus", "8")
    assert b["footprint"]["total"] < a["footprint"]["total"]


def test_padding_free_packs_the_micro_batch_into_one_row(v1):
    doc = same_figures_as_converted(v1 / "train_full_fsdp2_padding_free.yaml", "--device", "H100-80GB")["doc"]
    # micro_batch_size 4, cutoff_len 2048, flash_attn flash_attention_2
    assert doc["training"]["micro_batch"] == 1 and doc["training"]["seq_len"] == 4 * 2048 and doc["training"]["attention"] == "flash"


def test_qlora_quantizes_in_bnb_with_a_float16_compute_dtype(v1):
    doc = same_figures_as_converted(v1 / "quantization.yaml", "--device", "H100-80GB")["doc"]
    assert doc["quantization"] == {"method": "nf4", "double_quant": True, "compute_dtype": "float16"}
    assert doc["lora"]["r"] == 16 and doc["precision"] == "bf16-true"


def test_deepspeed_reads_its_config_file_with_auto_bf16_on(v1):
    out = same_figures_as_converted(v1 / "train_full_deepspeed.yaml", "--device", "H100-80GB", "--gpus", "4")
    doc = out["doc"]
    # ds_z3_config.json: stage 3, bf16 and fp16 "auto" -> bf16 (deepspeed_utils.py infer_deepspeed_mixed_precision)
    assert doc["parallel"]["zero"] == 3 and doc["parallel"]["data"] == 4
    assert doc["precision"] == "bf16-true" and doc["master_weights"] == "float32"


def test_an_adapter_export_trains_nothing(v1):
    out = memfit("check", "--format", "json", "--device", "H100-80GB", v1 / "export_lora.yaml")
    assert out.returncode == 0, out.stdout
    [entry] = json.loads(out.stdout)["files"]
    assert entry["input_format"] == "llama-factory" and [d["code"] for d in entry["diagnostics"]] == ["not-training"]
    assert entry.get("footprint") is None


BAD = [
    ("flash_attn: flash3\n", "flash_attn is 'flash3': one of 'eager', 'sdpa', 'flash_attention_2'", "flash_attn"),
    ("peft_config:\n  r: 8\n", "peft_config has no name", "peft_config"),
    ("peft_config:\n  name: oft\n", "peft_config.name is 'oft': one of 'lora', 'freeze'", "peft_config"),
    ("peft_config:\n  name: lora\nquant_config:\n  name: bnb\n  quantization_bit: 8\n", "quantization_bit 8 in training", "quant_config"),
    ("quant_config:\n  name: bnb\n  quantization_bit: 4\n", "a quantized model trains only with LoRA", "quant_config"),
    ("batching_strategy: padding_free\n", "batching_strategy padding_free needs flash_attn: flash_attention_2", "batching_strategy"),
    ("batching_strategy: dynamic_batching\n", "dynamic_batching needs max_steps", "batching_strategy"),
    ("micro_batch_size: 3\nglobal_batch_size: 16\n", "global_batch_size 16 is not 1 data rank(s) x micro_batch_size 3", "global_batch_size"),
    ("dist_config:\n  name: fsdpturbo\n  ep_size: 16\n", "dist_config fsdpturbo", "dist_config"),
    ("dist_config:\n  name: deepspeed\n", "dist_config deepspeed needs config_file", "dist_config"),
    ("kernel_config:\n  name: auto, fused_everything\n", "kernel_config.name 'fused_everything'", "kernel_config"),
    ("micro_batch_size: two\n", "micro_batch_size is 'two': it takes an integer", "micro_batch_size"),
    ("cp_size: 2\n", "cp_size above 1 needs flash_attn: flash_attention_2", "cp_size"),
]


@pytest.mark.parametrize("extra, message, key", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_bad_values_are_positioned_errors(v1, extra, message, key):
    native = v1 / "bad.yaml"
    text = "model: Qwen/Qwen3-0.6B\nmodel_class: llm\ntrain_dataset: data/v1_sft_demo.yaml\n" + extra
    native.write_text(text)
    out = memfit("check", "--device", "H100-80GB", native)
    assert out.returncode == 1, out.stdout
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith(key))
    hits = [row for row in out.stdout.splitlines() if message in row]
    assert hits and "error[native-config]" in hits[0], out.stdout
    # at the key's line or inside its mapping
    assert int(hits[0].split(":")[1]) >= line, hits[0]


def test_unmodelled_plugins_are_warned_with_their_direction(v1):
    native = v1 / "warned.yaml"
    native.write_text("model: Qwen/Qwen3-0.6B\nmodel_class: llm\nkernel_config:\n  name: liger_kernel\noptim_config:\n  name: muon\n"
                      "peft_config:\n  name: freeze\n  freeze_trainable_layers: 2\nflash_attn: flash_attention_2\ncp_size: 2\n")
    out = memfit("check", "--device", "H100-80GB", "--gpus", "2", native)
    text = out.stdout
    assert f"{native}:4:9: warning[not-modelled] kernel_config liger_kernel: in training (require_logits) v1 turns Liger's fused linear cross-entropy off" in text
    assert "the figures are high, on the safe side" in text
    assert f"{native}:6:9: warning[not-modelled] optim_config muon" in text and "the figures are high" in text
    assert f"{native}:8:9: warning[not-modelled] peft_config freeze" in text
    assert f"{native}:11:10: warning[not-modelled] cp_size 2: Ulysses sequence parallelism" in text
    # kernel_config auto on a CUDA device applies nothing (interface.py _AUTO_KERNELS: NPU only): no diagnostic
    native.write_text("model: Qwen/Qwen3-0.6B\nmodel_class: llm\nkernel_config:\n  name: auto\n")
    out = memfit("check", "--device", "H100-80GB", native)
    assert out.returncode == 0 and "kernel_config" not in out.stdout, out.stdout


def test_a_v0_file_reads_as_before(v1):
    native = v1 / "v0.yaml"
    native.write_text("model_name_or_path: Qwen/Qwen3-0.6B\nstage: sft\nfinetuning_type: lora\nbf16: true\nper_device_train_batch_size: 1\n")
    doc = same_figures_as_converted(native, "--device", "H100-80GB")["doc"]
    # v0's defaults (hparams/finetuning_args.py): lora_rank 8, alpha 16, dropout 0.0; no v1 warning
    assert doc["lora"] == {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
    assert "second_loss" not in doc.get("training", {})  # v0's Trainer: the model's loss only


def test_a_fix_edits_v1_keys_not_v0_ones(v1):
    """check --suggest on a v1 file: the micro-batch fix replaces micro_batch_size (read/native/edits.py
    llama-factory-v1), never inserts v0's per_device_train_batch_size, gradient_accumulation_steps or optim."""
    native = v1 / "near.yaml"
    native.write_text("model: Qwen/Qwen3-0.6B\nmodel_class: llm\nkernel_config:\n  name: auto\ntrain_dataset: data/v1_sft_demo.yaml\n"
                      "micro_batch_size: 2\ncutoff_len: 2048\n")
    out = memfit("check", "--suggest", "--device", "T4", native)
    assert f"{native}:6:19: replace with '1'" in out.stdout, out.stdout
    for v0 in ("per_device_train_batch_size", "gradient_accumulation_steps", "optim:"):
        assert v0 not in out.stdout, out.stdout


def test_liger_kernel_is_the_model_types_default_kernels(v1):
    """examples/v1/train_full/train_full_liger_kernel.yaml (copied unchanged): kernel_config liger_kernel on Qwen3 is
    liger_kernel_ops.py LigerKernel._apply with use_kernels "auto" (apply_kernels passes none): apply_liger_kernel_to_qwen3's
    defaults rope, rms_norm and swiglu (liger-kernel monkey_patch.py), training.liger_kernels as the Trainer's
    use_liger_kernel reads them; in training require_logits turns the fused cross-entropy off (no training.fused_loss)
    and Liger's cross_entropy on, warned at the key. The converted config gives the same figures; the RMSNorm and SwiGLU
    save less than the same file without kernel_config (Liger's RMSNorm keeps no normalized copy for the final norm)."""
    native = v1 / "train_full_liger_kernel.yaml"
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    assert out["doc"]["training"]["liger_kernels"] == ["rope", "rms_norm", "swiglu"] and "fused_loss" not in out["doc"]["training"]
    text = native.read_text()
    plain = v1 / "plain.yaml"
    plain.write_text(text.replace("kernel_config:\n  name: liger_kernel\n", ""))
    assert plain.read_text() != text
    without, _ = figures(plain, "--device", "H100-80GB")
    assert out["native"]["footprint"]["activations"] < without["footprint"]["activations"]
    line = text.splitlines().index("  name: liger_kernel")
    warned = [d for d in out["native"]["diagnostics"] if d["code"] == "not-modelled" and d["message"].startswith("kernel_config liger_kernel: in training")]
    assert len(warned) == 1 and warned[0]["severity"] == "warning" and warned[0]["range"]["start"] == {"line": line, "character": 8}
    # require_logits false: the fused loss returns no logits, and v1's trainer reads them: an error at that key
    refused = v1 / "no_logits.yaml"
    refused.write_text(text.replace("  name: liger_kernel\n", "  name: liger_kernel\n  require_logits: false\n"))
    entry, done = figures(refused, "--device", "H100-80GB")
    errors = [d for d in entry["diagnostics"] if d["severity"] == "error"]
    assert done.returncode == 1 and [(d["code"], d["range"]["start"]["line"]) for d in errors] == [("native-config", line + 1)]
    assert errors[0]["message"].startswith("kernel_config.require_logits false: Liger's fused linear cross-entropy returns no logits in training")


def test_liger_kernel_on_a_model_type_v1_does_not_patch_is_the_models_own_run(v1):
    """A model type liger_kernel_ops.py's _LIGER_FN_BY_MODEL_TYPE does not list (Llama) runs unpatched ("Current model
    does not support liger kernel"): a note at the key, no training.liger_kernels, the figures of the file without it."""
    config = json.loads((v1 / "models" / "qwen3-0.6b.json").read_text())
    (v1 / "models" / "llama.json").write_text(json.dumps({**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    native, plain = v1 / "llama.yaml", v1 / "llama_plain.yaml"
    body = "model: ./models/llama.json\nmodel_class: llm\nmicro_batch_size: 1\ncutoff_len: 1024\n"
    native.write_text(body + "kernel_config:\n  name: liger_kernel\n")
    plain.write_text(body)
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    assert "liger_kernels" not in out["doc"]["training"]
    notes = [d for d in out["native"]["diagnostics"] if d["message"].startswith("liger_kernel: LLaMA-Factory v1 patches qwen3")]
    assert len(notes) == 1 and notes[0]["severity"] == "information"
    without, _ = figures(plain, "--device", "H100-80GB")
    assert out["native"]["footprint"] == without["footprint"]
