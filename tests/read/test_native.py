"""Native configs (read/native/): Axolotl, LLaMA-Factory, the Trainer's argument files, DeepSpeed
JSON and accelerate launch configs, checked in place through the real CLI on files written here.

The central property: a native file and the memfit config `memfit convert` prints for it give the
same figures in `--format json` (positions aside). Defaults are checked against the frameworks'
own code where it is installed (transformers' TrainingArguments and its DeepSpeed integration),
otherwise against the source cited in docs/native-*.md.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"


def memfit(*args, cwd=None, env=None):
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=120, env=full)


def figures(path, *flags, env=None):
    out = memfit("check", "--format", "json", *flags, path, env=env)
    assert out.returncode in (0, 1), out.stderr
    entry = json.loads(out.stdout)["files"][0]
    return entry, out


def same_figures_as_converted(native: Path, *flags, env=None) -> dict:
    """check the native file and its convert output (saved beside it): the same figures."""
    converted = memfit("convert", *flags, native, env=env)
    assert converted.returncode == 0, converted.stderr
    memfit_file = native.with_name(native.stem + ".memfit.yaml")
    memfit_file.write_text(converted.stdout)
    a, _ = figures(native, *flags, env=env)
    b, _ = figures(memfit_file, *flags, env=env)
    assert b["input_format"] == "memfit"
    for key in ("footprint", "peak", "budget", "host"):
        assert a.get(key) == b.get(key), key
    assert a["footprint"] is not None and a["footprint"]["total"] > 0
    return {"native": a, "doc": yaml.safe_load(converted.stdout)}


@pytest.fixture
def model(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    return tmp_path / "llama-3-8b.json"


def test_axolotl_qlora_same_figures_as_its_conversion(tmp_path, model):
    native = tmp_path / "qlora.yml"
    native.write_text(
        "base_model: ./llama-3-8b.json\nload_in_4bit: true\nadapter: qlora\nlora_r: 16\nlora_alpha: 32\nlora_dropout: 0.05\n"
        "lora_target_linear: true\nsequence_len: 4096\nmicro_batch_size: 2\ngradient_accumulation_steps: 4\n"
        "optimizer: paged_adamw_8bit\nbf16: auto\ngradient_checkpointing: true\nflash_attention: true\n"
        "datasets:\n  - path: somewhere\n    type: alpaca\nlearning_rate: 0.0002\n"
    )
    out = same_figures_as_converted(native, "--device", "RTX-4090")
    assert out["native"]["input_format"] == "axolotl"
    doc = out["doc"]
    # loaders/model.py _set_quantization_config: qlora + load_in_4bit -> nf4, double quant, compute dtype torch_dtype
    assert doc["quantization"] == {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    assert doc["lora"] == {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
    assert doc["training"]["micro_batch"] == 2 and doc["training"]["seq_len"] == 4096 and doc["training"]["attention"] == "flash"
    assert doc["optimizer"] == "paged_adamw8bit" and doc["precision"] == "bf16-true"


def test_axolotl_defaults(tmp_path, model):
    """A minimal file takes Axolotl's schema defaults (schemas/training.py micro_batch_size 1,
    gradient_accumulation_steps 1, optimizer adamw_torch_fused; schemas/config.py sequence_len 512,
    bf16 auto, gradient_checkpointing false)."""
    native = tmp_path / "min.yml"
    native.write_text("base_model: ./llama-3-8b.json\ndatasets: []\n")
    doc = same_figures_as_converted(native, "--device", "H100-80GB")["doc"]
    assert doc["training"] == {"micro_batch": 1, "seq_len": 512, "checkpointing": "none", "attention": "sdpa", "optimizer_impl": "fused"}
    assert doc["optimizer"] == "adamw" and doc["precision"] == "bf16-true"
    # bf16: auto on a card without bf16 (resolve_dtype: fp16 when is_torch_bf16_gpu_available() is false)
    converted = yaml.safe_load(memfit("convert", "--device", "T4", native).stdout)
    assert converted["precision"] == "16-true"


def test_the_trainer_defaults_come_from_transformers(tmp_path, model):
    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    native = tmp_path / "args.json"
    native.write_text(json.dumps({"model_name_or_path": "./llama-3-8b.json", "output_dir": "out", "do_train": True, "block_size": 1024}))
    doc = same_figures_as_converted(native, "--device", "H100-80GB")["doc"]
    assert doc["training"]["micro_batch"] == defaults["per_device_train_batch_size"]
    assert "gradient_accumulation" not in doc["training"] and defaults["gradient_accumulation_steps"] == 1
    assert defaults["optim"] == "adamw_torch_fused" and doc["training"]["optimizer_impl"] == "fused" and doc["optimizer"] == "adamw"
    assert doc["precision"] == "32-true" and defaults["bf16"] is False and defaults["fp16"] is False


def test_deepspeed_auto_resolved_as_the_trainer_integration_does(tmp_path, model):
    """The DeepSpeed JSON's "auto" values, resolved by transformers' own HfTrainerDeepSpeedConfig,
    agree with what memfit reads."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    ds = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "offload_optimizer": {"device": "cpu"}},
    }
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=2))
    native = tmp_path / "lf.yaml"
    native.write_text(
        "model_name_or_path: ./llama-3-8b.json\nstage: sft\nfinetuning_type: full\ndeepspeed: ds.json\n"
        "per_device_train_batch_size: 3\ngradient_accumulation_steps: 5\ncutoff_len: 2048\nbf16: true\n"
    )
    out = same_figures_as_converted(native, "--device", "H100-80GB", "--gpus", "4", "--host-memory", "512GiB")
    doc = out["doc"]
    args = SimpleNamespace(
        world_size=4, per_device_train_batch_size=3, gradient_accumulation_steps=5, max_grad_norm=1.0, learning_rate=1e-5,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, save_on_each_node=False,
        fp16=False, fp16_full_eval=False, bf16=True, bf16_full_eval=False, get_warmup_steps=lambda steps: 0,
    )
    hf = HfTrainerDeepSpeedConfig(json.loads((tmp_path / "ds.json").read_text()))
    hf.trainer_config_process(args)
    hidden = json.loads(model.read_text())["hidden_size"]
    hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=hidden)), 100)
    resolved = hf.config
    assert doc["training"]["micro_batch"] == resolved["train_micro_batch_size_per_gpu"]
    assert doc["training"]["gradient_accumulation"] == resolved["gradient_accumulation_steps"]
    assert doc["parallel"]["buckets"]["reduce"] == resolved["zero_optimization"]["reduce_bucket_size"]
    assert resolved["bf16"]["enabled"] is True and doc["precision"] == "bf16-true" and doc["master_weights"] == "float32"
    assert doc["parallel"]["zero"] == 2 and doc["parallel"]["data"] == 4 and doc["parallel"]["offload"] == {"optimizer": "cpu"}
    assert out["native"]["input_format"] == "llama-factory"


def test_llama_factory_lora_defaults(tmp_path, model):
    """hparams/finetuning_args.py: finetuning_type lora, lora_rank 8, lora_alpha = 2 x rank,
    lora_target all; model_args.py disable_gradient_checkpointing false (so it checkpoints);
    data_args.py cutoff_len 2048; quantization_bit 4 -> nf4 with double quantization."""
    native = tmp_path / "lf.yaml"
    native.write_text("model_name_or_path: ./llama-3-8b.json\nstage: sft\ntemplate: llama3\nquantization_bit: 4\nbf16: true\nper_device_train_batch_size: 1\n")
    doc = same_figures_as_converted(native, "--device", "RTX-4090")["doc"]
    assert doc["lora"] == {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
    assert doc["training"]["checkpointing"] == "full" and doc["training"]["seq_len"] == 2048
    assert doc["quantization"] == {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}


def test_deepspeed_alone_and_a_launch_config(tmp_path, model):
    ds = tmp_path / "zero3.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}))
    out = same_figures_as_converted(ds, "--model", str(model), "--device", "H100-80GB", "--gpus", "8")
    assert out["native"]["input_format"] == "deepspeed" and out["doc"]["parallel"] == {"zero": 3, "data": 8}
    # no sequence length in a DeepSpeed JSON: the model's longest, with a warning
    assert out["doc"]["training"]["seq_len"] == json.loads(model.read_text())["max_position_embeddings"]
    assert any(d["code"] == "not-modelled" and "no sequence length" in d["message"] for d in out["native"]["diagnostics"])

    launch = tmp_path / "accelerate.yaml"
    launch.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\nmixed_precision: bf16\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: false\n")
    native = tmp_path / "ax.yml"
    native.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 2048\ngradient_checkpointing: true\n")
    out = same_figures_as_converted(native, "--device", "H100-80GB", "--launch", launch)
    # accelerate's fsdp_version left out: 1, FSDP1 (FullyShardedDataParallelPlugin's default)
    assert out["doc"]["parallel"] == {"fsdp": "full_shard", "fsdp_version": 1, "data": 16, "gpus_per_node": 8}
    launch.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n")
    out = same_figures_as_converted(native, "--device", "H100-80GB", "--launch", launch)
    assert out["doc"]["parallel"] == {"fsdp": "full_shard", "fsdp_version": 2, "data": 16, "gpus_per_node": 8}
    launch.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\nmixed_precision: bf16\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: false\n")
    alone = memfit("check", launch)
    assert alone.returncode == 1 and "model-not-found" in alone.stdout


def test_bad_input_is_positioned(tmp_path, model):
    native = tmp_path / "bad.yml"
    native.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: two\nbf16: true\nfp16: true\ndeepspeed: nowhere.json\n")
    out = memfit("check", "--device", "H100-80GB", native)
    assert out.returncode == 1
    assert f"{native}:2:19: error[native-config] micro_batch_size is 'two': it takes an integer" in out.stdout
    assert f"{native}:4:7: error[native-config] bf16 and fp16 are both true" in out.stdout
    assert f"{native}:5:12: error[missing-reference] the DeepSpeed config 'nowhere.json' not found; looked at {tmp_path / 'nowhere.json'}" in out.stdout

    missing = tmp_path / "missing.yml"
    missing.write_text("sequence_len: 1024\nbase_model: nobody/no-such-model\nmicro_batch_size: 1\n")
    out = memfit("check", "--device", "H100-80GB", missing, env={"HF_HUB_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 1
    assert f"{missing}:2:13: error[model-not-found] model 'nobody/no-such-model' not found" in out.stdout
    assert str(tmp_path / "cache" / "models--nobody--no-such-model") in out.stdout
    assert "or pass --online to fetch its config.json alone from the Hub" in out.stdout  # a Hub name: the way to fetch it

    assert memfit("check", "--input-format", "nope", native).returncode == 2
    assert memfit("check", "--reserve", "12XB", native).returncode == 2 and memfit("check", "--gpus", "0", native).returncode == 2
    forced = memfit("check", "--input-format", "llama-factory", native)  # read as LLaMA-Factory: no model_name_or_path
    assert forced.returncode == 1 and "model-not-found" in forced.stdout

    ds = tmp_path / "ds.json"
    ds.write_text('{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 7}\n}\n')
    trainer = tmp_path / "args.yaml"
    trainer.write_text("model_name_or_path: ./llama-3-8b.json\nper_device_train_batch_size: 2\ndeepspeed: ds.json\n")
    out = memfit("check", "--device", "H100-80GB", trainer)
    assert out.returncode == 1
    # the problems inside the DeepSpeed JSON are placed there, linked from the key naming it
    lines = ds.read_text().splitlines()
    assert f"{ds}:2:{lines[1].index('4') + 1}: error[native-config] train_micro_batch_size_per_gpu is 4 but the Trainer's micro batch is 2" in out.stdout
    assert f"(referenced from {trainer}:3:12)" in out.stdout
    assert f"{ds}:3:{lines[2].index('7') + 1}: error[native-config] zero_optimization.stage is 7" in out.stdout


def test_the_model_from_the_hugging_face_cache(tmp_path, model):
    snapshot = tmp_path / "hub" / "models--acme--llama" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    shutil.copy(model, snapshot / "config.json")
    (tmp_path / "hub" / "models--acme--llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--llama" / "refs" / "main").write_text("0123abc")
    native = tmp_path / "ax.yml"
    native.write_text("base_model: acme/llama\nmicro_batch_size: 1\nsequence_len: 1024\n")
    local = tmp_path / "local.yml"
    local.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 1024\n")
    a, out = figures(native, "--device", "H100-80GB", env={"HF_HOME": str(tmp_path)})
    assert out.returncode in (0, 1) and not any(d["code"] == "model-not-found" for d in a["diagnostics"])
    b, _ = figures(local, "--device", "H100-80GB")
    assert a["footprint"] == b["footprint"]


def test_settings_and_directory_walks(tmp_path, model):
    (tmp_path / "models").mkdir()
    shutil.copy(model, tmp_path / "models" / "m.json")
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "run.yml").write_text("base_model: meta/Llama-Three\nmicro_batch_size: 1\nsequence_len: 2048\n")
    (configs / "plain.yaml").write_text("memfit: 1\noptimizer: adam\nparameters: [[1024, 1024]]\n")
    # without settings: a folder is checked like its files, the native file too (its model unknown: an error, not a skip)
    walk = memfit("check", "--skip-unrecognized", "--device", "H100-80GB", configs)
    assert walk.returncode == 1 and "run.yml:1:13: error[model-not-found]" in walk.stdout and "skipped" not in walk.stdout
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.memfit]\ndevice = "A100-40GB"\ninclude = ["configs/*.yml"]\n\n[tool.memfit.models]\n"meta/Llama-Three" = "models/m.json"\n'
    )
    out = memfit("check", "--format", "json", configs)
    files = {Path(f["path"]).name: f for f in json.loads(out.stdout)["files"]}
    assert files["run.yml"]["input_format"] == "axolotl" and files["plain.yaml"]["input_format"] == "memfit"
    a100 = files["run.yml"]["budget"]
    assert files["plain.yaml"]["budget"] == a100  # the settings' device fills a memfit config without one
    # the command line wins over the settings; a memfit.toml wins over pyproject.toml in one directory
    h100 = json.loads(memfit("check", "--format", "json", "--device", "H100-80GB", configs / "run.yml").stdout)["files"][0]["budget"]
    assert h100 > a100
    (tmp_path / "memfit.toml").write_text('device = "H100-80GB"\n[models]\n"meta/Llama-Three" = "models/m.json"\n')
    assert json.loads(memfit("check", "--format", "json", configs / "run.yml").stdout)["files"][0]["budget"] == h100
    # per-glob overrides: the later matching entry wins, the command line over all
    (tmp_path / "memfit.toml").write_text('device = "A100-40GB"\n[models]\n"meta/Llama-Three" = "models/m.json"\n[[overrides]]\nfiles = ["configs/run*.yml"]\ndevice = "H100-80GB"\n')
    assert json.loads(memfit("check", "--format", "json", configs / "run.yml").stdout)["files"][0]["budget"] == h100
    assert json.loads(memfit("check", "--format", "json", configs / "plain.yaml").stdout)["files"][0]["budget"] == a100
    (tmp_path / "memfit.toml").write_text('device = "H100-80GB"\ngpus = "eight"\n')
    bad = memfit("check", configs / "run.yml")
    assert bad.returncode == 1 and f"{tmp_path / 'memfit.toml'}:2:1: error[native-config] settings: gpus is 'eight': a positive integer" in bad.stdout


TORCHTUNE_QLORA = """\
model:
  _component_: torchtune.models.llama3.qlora_llama3_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  lora_rank: 16
  lora_alpha: 32
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/tokenizer.model
  max_seq_len: 2048
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  lr: 3e-4
epochs: 1
dtype: bf16
enable_activation_checkpointing: True
"""


def test_torchtune_builders_match_the_published_config_json(tmp_path, model):
    """The builder table's llama3_8b (torchtune/models/llama3/_model_builders.py) is the model of
    Meta's config.json: the same parameters, gradients and optimizer state through the pipeline."""
    native = tmp_path / "full.yaml"
    native.write_text(TORCHTUNE_QLORA.replace("qlora_llama3_8b", "llama3_8b").split("  lora_attn_modules")[0] + TORCHTUNE_QLORA.split("lora_alpha: 32\n")[1])
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    assert out["native"]["input_format"] == "torchtune"
    reference = tmp_path / "reference.yaml"
    reference.write_text(
        "memfit: 1\ndevice: {preset: H100-80GB}\nprecision: bf16-true\noptimizer: adamw\nmodel: {hf_config: llama-3-8b.json}\n"
        "training: {micro_batch: 2, seq_len: 2048, checkpointing: full, attention: sdpa, optimizer_impl: fused}\n"
    )
    ref, _ = figures(reference)
    for category in ("parameters", "gradients", "optimizer_state"):
        assert out["native"]["footprint"][category] == ref["footprint"][category], category


def test_torchtune_qlora_and_torchao_nf4(tmp_path):
    native = tmp_path / "qlora.yaml"
    native.write_text(TORCHTUNE_QLORA)
    out = same_figures_as_converted(native, "--device", "RTX-4090")
    doc = out["doc"]
    assert doc["quantization"] == {"method": "nf4-torchao"}
    assert doc["lora"]["target_modules"] == ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert doc["lora"]["r"] == 16 and doc["training"]["seq_len"] == 2048 and doc["training"]["checkpointing"] == "full"


def test_nf4_torchao_layout_is_torchaos():
    """What memfit counts for a torchao NF4 weight is what torchao's to_nf4 keeps, tensor by tensor."""
    import torch

    from needs import module
    from memfit.recipe import quant

    nf4 = module("torchao.dtypes.nf4tensor")
    weight = torch.zeros(1024, 4096, dtype=torch.bfloat16)
    stored = nf4.to_nf4(weight)
    theirs = {name: getattr(stored, name).numel() * getattr(stored, name).element_size() for name in ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4")}
    ours = {name: (1 if not shape else __import__("math").prod(shape)) * {"uint8": 1, "int8": 1, "bfloat16": 2}[dtype] for name, shape, dtype in quant.weight_tensors(4096, 1024, "nf4-torchao", base_dtype="bfloat16")}
    assert sorted(ours.values()) == sorted(theirs.values()) and sum(ours.values()) == sum(theirs.values())


def test_suggest_edits_the_native_keys(tmp_path, model):
    native = tmp_path / "ax.yml"
    native.write_text("base_model: ./llama-3-8b.json\nsequence_len: 4096\nmicro_batch_size: 8\ngradient_accumulation_steps: 2\nbf16: true\ngradient_checkpointing: true\n")
    tight = figures(native, "--device", "H100-80GB")[0]["peak"]["bytes"] * 3 // 4
    out = memfit("check", "--suggest", "--budget", f"{tight}B", native)
    assert out.returncode == 1
    # the batch fix rewrites micro_batch_size's and gradient_accumulation_steps' values, where they are written
    import re

    batch = re.search(rf"{re.escape(str(native))}:3:19: replace with '(\d+)'", out.stdout)
    accum = re.search(rf"{re.escape(str(native))}:4:30: replace with '(\d+)'", out.stdout)
    assert batch and accum, out.stdout
    assert int(batch[1]) < 8 and int(accum[1]) > 2  # a smaller micro-batch, more accumulation: where the native keys are written


def test_the_readme_and_the_native_page_show_what_memfit_prints():
    """The README's first example after the quick start (an Axolotl file) and docs/native.md's
    convert output are the program's output, run from the repository root."""
    import re

    check = memfit("check", "examples/native/axolotl-llama3-8b-qlora.yml", cwd=ROOT)
    convert = memfit("convert", "examples/native/axolotl-llama3-8b-qlora.yml", cwd=ROOT)
    assert check.returncode == 0 and convert.returncode == 0, check.stdout + convert.stderr
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = readme[readme.index("## Quick start") :]
    first = first[first.index("\n## ") + 1 :]
    assert first.startswith("## Check the config that launches the run")
    assert f"$ memfit check examples/native/axolotl-llama3-8b-qlora.yml\n{check.stdout}```" in first
    page = (ROOT / "docs" / "native.md").read_text(encoding="utf-8")
    assert f"$ memfit convert examples/native/axolotl-llama3-8b-qlora.yml\n{convert.stdout}```" in page
    assert re.search(r"input_format", page)


def test_the_editor_hovers_a_native_key_with_the_memfit_key_it_sets():
    from memfit.check.pipeline import Options, check
    from memfit.editor.editor import Analysis

    path = ROOT / "examples" / "native" / "axolotl-llama3-8b-qlora.yml"
    text = path.read_text(encoding="utf-8")
    analysis = Analysis(text, check(text, str(path), Options(skip_unrecognized=True)), 1)
    line = next(i for i, row in enumerate(text.splitlines()) if row.startswith("micro_batch_size:"))
    hover = analysis.hover(line, 3)
    assert hover is not None and "**training.micro_batch** = 2" in hover.markdown and "the largest that fits is" in hover.markdown
    assert analysis.result.input_format == "axolotl" and not analysis.result.diagnostics
    # inlay hints: the summary on the main key, the training keys' what-ifs on the native keys
    rows = text.splitlines()
    hints = {rows[h.line].split(":")[0]: h.label for h in analysis.hints(0, len(rows))}
    assert hints["base_model"].startswith("memfit: total") and "micro_batch_size" in hints and "gradient_checkpointing" in hints
    assert analysis.summary_range().start_line == rows.index(next(r for r in rows if r.startswith("base_model:")))


def test_a_referenced_file_rechecks_the_configs_that_read_it(tmp_path, model):
    """--skip-unrecognized (the hook) on a staged config.json or DeepSpeed JSON checks the configs
    that read it (through hf_config, the settings' models table, or `deepspeed:`), and no others."""
    (tmp_path / "models").mkdir()
    shutil.copy(model, tmp_path / "models" / "m.json")
    (tmp_path / "configs").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.memfit]\ndevice = "H100-80GB"\ninclude = ["configs/*.yml"]\n[tool.memfit.models]\n"meta/L3" = "models/m.json"\n')
    (tmp_path / "configs" / "ax.yml").write_text("base_model: meta/L3\nmicro_batch_size: 1\nsequence_len: 1024\nbf16: true\ndeepspeed: configs/ds.json\n")
    (tmp_path / "configs" / "ds.json").write_text('{"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 0}}\n')
    (tmp_path / "configs" / "plain.yaml").write_text("memfit: 1\ndevice: {memory: 1 TiB}\noptimizer: adamw\nmodel: {hf_config: ../models/m.json}\ntraining: {micro_batch: 1, seq_len: 512}\n")
    (tmp_path / "configs" / "other.yaml").write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters: [[10, 10]]\n")
    model_edit = json.loads(memfit("check", "--skip-unrecognized", "--format", "json", "models/m.json", cwd=tmp_path).stdout)["files"]
    assert sorted(f["path"] for f in model_edit) == ["configs/ax.yml", "configs/plain.yaml"]
    ds_edit = json.loads(memfit("check", "--skip-unrecognized", "--format", "json", "configs/ds.json", cwd=tmp_path).stdout)["files"]
    assert [f["path"] for f in ds_edit] == ["configs/ax.yml"]


def test_online_fetches_config_json_alone_from_the_endpoint(tmp_path, model):
    """--online: the model's config.json, and nothing else, with the standard library from HF_ENDPOINT (a local
    server here) into the cache; without --online nothing is fetched. huggingface_hub is not needed: the memfit
    process runs with it made unimportable."""
    import http.server
    import threading

    body = model.read_bytes()
    blocked = tmp_path / "no_hub"
    blocked.mkdir()
    (blocked / "huggingface_hub.py").write_text("raise ImportError('huggingface_hub is not installed here')\n")
    asked = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def _answer(self, send_body):
            asked.append((self.command, self.path))
            if not self.path.endswith("/resolve/main/config.json"):
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            for key, value in (("Content-Length", str(len(body))), ("ETag", '"0123456789abcdef"'), ("X-Repo-Commit", "a" * 40)):
                self.send_header(key, value)
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def do_HEAD(self):
            self._answer(False)

        def do_GET(self):
            self._answer(True)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = os.pathsep.join(p for p in (str(blocked), os.environ.get("PYTHONPATH", "")) if p)
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": path}
        native = tmp_path / "ax.yml"
        native.write_text("base_model: acme/remote-llama\nmicro_batch_size: 1\nsequence_len: 1024\n")
        offline = memfit("check", "--device", "H100-80GB", native, env=env)
        assert offline.returncode == 1 and "model-not-found" in offline.stdout and not asked
        online, _ = figures(native, "--device", "H100-80GB", "--online", env=env)
        assert not any(d["code"] == "model-not-found" for d in online["diagnostics"])
        assert {path for _, path in asked} == {"/acme/remote-llama/resolve/main/config.json"}
        local = tmp_path / "local.yml"
        local.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 1024\n")
        assert online["footprint"] == figures(local, "--device", "H100-80GB")[0]["footprint"]
    finally:
        server.shutdown()


def test_diff_compares_a_native_config_the_settings_include(tmp_path, model):
    def git(*args):
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
        assert done.returncode == 0, done.stderr
        return done

    (tmp_path / "configs").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.memfit]\ndevice = "H100-80GB"\ninclude = ["configs/*.yml"]\n')
    run = tmp_path / "configs" / "run.yml"
    run.write_text("base_model: ../llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 2048\nbf16: true\ngradient_checkpointing: true\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    before, _ = figures(run)
    run.write_text(run.read_text().replace("micro_batch_size: 1", "micro_batch_size: 4"))
    after, _ = figures(run)
    out = memfit("diff", "HEAD", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (entry,) = json.loads(out.stdout)["files"]
    assert entry["path"] == "configs/run.yml"
    assert entry["before"] == before["footprint"] and entry["after"] == after["footprint"] and entry["delta"]["activations"] > 0
    # only the model's config.json changes: the revision's side reads it as it was there
    git("checkout", "-q", "configs/run.yml")
    (tmp_path / "llama-3-8b.json").write_text(json.dumps({**json.loads(model.read_text()), "num_hidden_layers": 40}))
    out = memfit("diff", "HEAD", "--format", "json", cwd=tmp_path)
    (entry,) = json.loads(out.stdout)["files"]
    assert entry["before"] == before["footprint"] and entry["delta"]["parameters"] > 0


@pytest.mark.parametrize("module, page", [("axolotl", "native-axolotl"), ("llamafactory", "native-llama-factory"), ("llamafactory_v1", "native-llama-factory"), ("hftrainer", "native-hf-trainer"), ("torchtune", "native-torchtune"), ("deepspeed", "native-deepspeed"), ("litgpt", "native-litgpt")])
def test_each_format_page_lists_the_keys_its_reader_reads_and_warns_about(module, page):
    import importlib

    reader = importlib.import_module(f"memfit.read.native.{module}")
    text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
    keys = list(getattr(reader, "KEYS", {})) + list(getattr(reader, "UNMODELLED", {})) + list(getattr(reader, "ZERO_UNMODELLED", {})) + list(getattr(reader, "BUILDERS", {}))
    keys += list(getattr(reader, "CONDITIONAL", {}))
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"docs/{page}.md does not list {missing}"


def test_a_referenced_device_or_fifo_is_refused_not_read(tmp_path, model):
    """A native config may name any path: a DeepSpeed JSON that is /dev/zero or a FIFO is an
    error at the key, found by a stat, never a read that blocks or never ends."""
    fifo = tmp_path / "ds.json"
    os.mkfifo(fifo)
    for target, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        native = tmp_path / "ax.yml"
        native.write_text(f"base_model: ./llama-3-8b.json\nmicro_batch_size: 1\ndeepspeed: {target}\n")
        out = memfit("check", "--device", "H100-80GB", native)
        assert out.returncode == 1 and f"{native}:3:12: error[missing-reference]" in out.stdout and kind in out.stdout


def test_sharding_and_target_keys_of_each_format(tmp_path, model):
    """Axolotl's fsdp_config (schemas/fsdp.py: reshard_after_forward false is SHARD_GRAD_OP,
    offload_params), the Trainer's `fsdp` option string (FSDPOption), LLaMA-Factory's comma lists
    (lora_target, additional_target): each read into the memfit keys, same figures as converted."""
    ax = tmp_path / "ax.yml"
    ax.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 1024\nbf16: true\nfsdp_config:\n  fsdp_version: 2\n  reshard_after_forward: false\n  offload_params: true\n  activation_checkpointing: true\n")
    doc = same_figures_as_converted(ax, "--device", "H100-80GB", "--gpus", "8", "--host-memory", "1TiB")["doc"]
    assert doc["parallel"] == {"fsdp": "shard_grad_op", "offload": {"optimizer": "cpu", "parameters": "cpu"}, "data": 8}
    assert doc["training"]["checkpointing"] == "full"

    hf = tmp_path / "args.yaml"
    hf.write_text("model_name_or_path: ./llama-3-8b.json\noutput_dir: out\nper_device_train_batch_size: 2\nblock_size: 2048\nbf16: true\nfsdp: full_shard auto_wrap\ngradient_checkpointing: true\n")
    doc = same_figures_as_converted(hf, "--device", "H100-80GB", "--gpus", "4")["doc"]
    assert doc["parallel"] == {"fsdp": "full_shard", "data": 4} and doc["precision"] == "bf16-mixed"

    # FSDP1 stated: parallel.fsdp_version 1 (the Trainer's fsdp_config version, its default 2; axolotl's fsdp_version)
    hf.write_text("model_name_or_path: ./llama-3-8b.json\noutput_dir: out\nper_device_train_batch_size: 2\nblock_size: 2048\nbf16: true\nfsdp: full_shard auto_wrap\nfsdp_config:\n  version: 1\ngradient_checkpointing: true\n")
    doc = same_figures_as_converted(hf, "--device", "H100-80GB", "--gpus", "4")["doc"]
    assert doc["parallel"] == {"fsdp": "full_shard", "fsdp_version": 1, "data": 4}
    ax.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 1024\nbf16: true\nfsdp_version: 1\nfsdp_config:\n  activation_checkpointing: true\n")
    doc = same_figures_as_converted(ax, "--device", "H100-80GB", "--gpus", "8")["doc"]
    assert doc["parallel"] == {"fsdp": "full_shard", "fsdp_version": 1, "data": 8}
    # axolotl's fsdp_version unset: FSDP1 (schemas/validation.py check_fsdp_version_in_fsdp_config pins it to 1)
    ax.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 1024\nbf16: true\nfsdp_config:\n  activation_checkpointing: true\n")
    doc = same_figures_as_converted(ax, "--device", "H100-80GB", "--gpus", "8")["doc"]
    assert doc["parallel"] == {"fsdp": "full_shard", "fsdp_version": 1, "data": 8}

    lf = tmp_path / "lf.yaml"
    lf.write_text("model_name_or_path: ./llama-3-8b.json\nstage: sft\nlora_target: q_proj,v_proj\nadditional_target: lm_head\nlora_rank: 4\nbf16: true\nper_device_train_batch_size: 1\ncutoff_len: 512\n")
    doc = same_figures_as_converted(lf, "--device", "H100-80GB")["doc"]
    assert doc["lora"] == {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]}


@pytest.mark.parametrize("stage, precision, accum_dtype, offload, bf16_optimizer", [
    (1, "bf16", "fp32", None, True),  # DeepSpeed's BF16_Optimizer (engine.py _do_optimizer_sanity_check)
    (1, "bf16", None, None, False),  # grad_accum_dtype unset: the model's dtype, bf16: stage_1_and_2.py
    (1, "bf16", "bf16", None, False),
    (2, "bf16", "fp32", None, False),  # ZeRO-2: stage_1_and_2.py, its gradient partition in fp32
    (1, "fp16", "fp32", None, False),
    (1, "bf16", "fp32", "cpu", False),  # optimizer offload: stage_1_and_2.py
])
def test_deepspeed_bf16_optimizer_where_deepspeed_picks_it(tmp_path, model, stage, precision, accum_dtype, offload, bf16_optimizer):
    """ZeRO stage 1 with bf16, data_types.grad_accum_dtype fp32 and no optimizer offload is DeepSpeed's BF16_Optimizer:
    the reader says so (`parallel.bf16_optimizer: true`), at the key that makes it, without a not-modelled warning."""
    zero = {"stage": stage, **({"offload_optimizer": {"device": offload}} if offload else {})}
    ds = {"train_micro_batch_size_per_gpu": 1, precision: {"enabled": True}, "zero_optimization": zero}
    if accum_dtype:
        ds["data_types"] = {"grad_accum_dtype": accum_dtype}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    out = same_figures_as_converted(path, "--model", str(model), "--device", "H100-80GB", "--gpus", "2", "--host", "1TiB")
    assert out["doc"]["parallel"].get("bf16_optimizer", False) is bf16_optimizer, out["doc"]["parallel"]
    assert not [d for d in out["native"]["diagnostics"] if d["code"] == "not-modelled" and "grad_accum_dtype" in d["message"]]


@pytest.mark.parametrize("kwargs, impl", [("", "foreach"), ("  foreach: False\n", "for_loop"), ("  fused: True\n", "fused"), ("  foreach: True\n", "foreach")])
def test_torchtune_optimizer_keyword_arguments_choose_the_step(tmp_path, kwargs, impl):
    """torchtune passes the optimizer block's keys to torch.optim.AdamW: `foreach: False` steps one parameter at a
    time (torch/optim/adam.py _single_tensor_adam: two temporaries of the largest parameter), `fused: True` in one kernel
    (no temporaries); without either, CUDA's default is foreach (a temporary as large as every parameter)."""
    native = tmp_path / "full.yaml"
    native.write_text(TORCHTUNE_QLORA.replace("qlora_llama3_8b", "llama3_8b").split("  lora_attn_modules")[0]
                      + TORCHTUNE_QLORA.split("lora_alpha: 32\n")[1].replace("  fused: True\n", kwargs))
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    assert out["doc"]["training"]["optimizer_impl"] == impl


def test_litgpt_optimizer_init_args_choose_the_step(tmp_path):
    """A later LitGPT release's `optimizer: {class_path, init_args}`: init_args reach torch.optim.AdamW as keywords."""
    peaks = {}
    for name, init_args in (("default", ""), ("for_loop", "    foreach: false\n"), ("fused", "    fused: true\n")):
        native = tmp_path / f"{name}.yaml"
        native.write_text("checkpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\nprecision: bf16-true\n"
                          "train:\n  max_seq_length: 512\n  global_batch_size: 1\n  micro_batch_size: 1\n"
                          f"optimizer:\n  class_path: torch.optim.AdamW\n  init_args:\n    lr: 0.0002\n{init_args}")
        out = same_figures_as_converted(native, "--device", "H100-80GB")
        assert out["doc"]["training"]["optimizer_impl"] == {"default": "foreach"}.get(name, name)
        peaks[name] = out["native"]["peak"]["bytes"]
    # foreach's temporary is as large as every parameter, the loop's two as large as the largest one, fused has none
    assert peaks["default"] > peaks["for_loop"] >= peaks["fused"], peaks


def test_fsdp1_forward_prefetch_is_a_positioned_warning(tmp_path, model):
    """FSDP1's forward_prefetch gathers the next unit during the current one's forward (not modelled: low), said at
    the key in accelerate's launch config and in the Trainer's fsdp_config; FSDP2 has no such key."""
    launch = tmp_path / "fsdp.yaml"
    launch.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 1\nnum_processes: 8\n"
                      "mixed_precision: bf16\nfsdp_config:\n  fsdp_forward_prefetch: true\n")
    out = memfit("convert", launch)
    assert f"{launch}:7:26: warning[not-modelled] fsdp_forward_prefetch: FSDP1 all-gathers the next unit" in out.stderr + out.stdout
    args = tmp_path / "args.yaml"
    args.write_text("model_name_or_path: ./llama-3-8b.json\noutput_dir: out\nper_device_train_batch_size: 1\nblock_size: 1024\n"
                    "bf16: true\nfsdp: full_shard auto_wrap\nfsdp_config:\n  version: 1\n  forward_prefetch: true\n")
    entry, _ = figures(args, "--device", "H100-80GB", "--gpus", "8")
    assert [(d["range"]["start"]["line"], d["code"]) for d in entry["diagnostics"] if "forward_prefetch" in d["message"]] == [(8, "not-modelled")]  # 0-based: line 9
    args.write_text(args.read_text().replace("  version: 1\n", "  version: 2\n"))
    entry, _ = figures(args, "--device", "H100-80GB", "--gpus", "8")
    assert not [d for d in entry["diagnostics"] if "forward_prefetch" in d["message"]]
