"""LitGPT's finetune configs (read/native/litgpt.py), checked in place through the real CLI: the config hub's own
files (tests/support/litgpt-hub/: Lightning-AI/litgpt config_hub/finetune at 3ba6da4012fa880294ae4557cc16e5182591a73d,
copied unchanged below a first line that cites them) give the peak of the hand-written memfit configs of the same runs
(tests/support/published/litgpt-hub-*.yaml, which tests/project/test_published_rows.py compares with LitGPT's
published measurement), and each problem is placed on the key that causes it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / "tests" / "support" / "litgpt-hub"
PUBLISHED = ROOT / "tests" / "support" / "published"
COMMIT = "3ba6da4012fa880294ae4557cc16e5182591a73d"
HEAD = "26857050fe3ff627cd714fe92f5838f51a3d5efa"  # the config hub's HEAD, whose later files are copied here too
LATER = ("gemma2-2b-lora", "gemma2-2b-qlora", "gemma2-9b-lora", "gemma2-9b-qlora", "llama-3-8b-full", "llama-3-8b-lora",
         "llama-3-8b-qlora", "llama-3.1-8b-full", "llama-3.1-8b-lora", "llama-3.1-8b-qlora", "llama-3.2-1B-full",
         "llama-3.2-1B-lora", "llama-3.2-1B-qlora", "llama-3.2-3B-full", "llama-3.2-3B-lora", "llama-3.2-3B-qlora",
         "mistral-7b-v0.2-lora", "mistral-7b-v0.2-qlora", "phi-3-full", "phi-3-lora", "phi-3-qlora")
MEASURED = ("gemma-2b-lora", "gemma-2b-qlora", "llama-2-7b-lora", "llama-2-7b-qlora", "mistral-7b-lora", "mistral-7b-qlora",
            "tiny-llama-full", "tiny-llama-lora", "tiny-llama-qlora")


def memfit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=300, env=os.environ)


def check(*paths, flags=("--budget", "80 GiB")) -> dict:
    out = memfit("check", "--format", "json", *flags, *paths)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    return {Path(entry["path"]).name: entry for entry in json.loads(out.stdout)["files"]}


def test_each_hub_file_is_litgpts_own():
    """The copies are the config hub's files: the cited commit's path on their first line, the original's blank line
    (the 19 of 3ba6da40, and the 21 the hub's HEAD added that name a model LitGPT's table had no entry for then)."""
    files = sorted(HUB.glob("*.yaml"))
    assert len(files) == 19 + len(LATER)
    for path in files:
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        model, kind = path.stem.rsplit("-", 1)
        commit = HEAD if path.stem in LATER else COMMIT
        assert first == f"# Lightning-AI/litgpt config_hub/finetune/{model}/{kind}.yaml at {commit}, unchanged below this line", path


def test_the_later_hub_configs_are_read_or_refused_at_checkpoint_dir():
    """Each config the hub's HEAD added gives a figure with no problem found (the paged-state note aside), read with
    LitGPT's shapes of its model (models/litgpt_configs.py); Gemma 2's are refused at checkpoint_dir with the reason:
    LitGPT's soft-capped attention is its own, not what memfit prices."""
    found = check(*(HUB / f"{name}.yaml" for name in LATER))
    for name in LATER:
        entry = found[f"{name}.yaml"]
        assert entry["input_format"] == "litgpt", name
        codes = [d["code"] for d in entry["diagnostics"] if d["code"] != "paged-state"]
        if name.startswith("gemma2-"):
            (problem,) = entry["diagnostics"]
            assert problem["code"] == "unsupported-model" and problem["range"]["start"]["line"] == 2, (name, problem)
            assert "soft-capped attention" in problem["message"] and not entry.get("peak"), name
        else:
            assert codes == [] and entry["peak"]["bytes"] > 0, (name, entry["diagnostics"])
    doc = yaml.safe_load(memfit("convert", HUB / "phi-3-lora.yaml").stdout)
    # LitGPT's Phi-3: LLaMAMLP (fc_1, fc_2, proj apart), 32 query groups, vocab padded to 32064, lm_head untied
    assert doc["model"]["transformer"] == {"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 32,
                                           "num_attention_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
                                           "tie_word_embeddings": False, "intermediate_size": 8192, "num_key_value_heads": 32}
    assert doc["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    doc = yaml.safe_load(memfit("convert", HUB / "llama-3.2-1B-qlora.yaml").stdout)
    assert doc["model"]["transformer"]["vocab_size"] == 128256 and doc["model"]["transformer"]["tie_word_embeddings"] is False
    assert doc["model"]["transformer"]["num_key_value_heads"] == 8


def test_the_hub_configs_give_the_published_rows_peak():
    """`memfit check` on LitGPT's own config gives, byte for byte, the peak of the hand-written memfit config whose
    published row docs/accuracy.md holds, with no problem found in the LitGPT file (the paged-state note aside)."""
    hub = check(*(HUB / f"{name}.yaml" for name in MEASURED))
    hand = check(*(PUBLISHED / f"litgpt-hub-{name}.yaml" for name in MEASURED))
    for name in MEASURED:
        ours, theirs = hub[f"{name}.yaml"], hand[f"litgpt-hub-{name}.yaml"]
        assert ours["input_format"] == "litgpt", name
        assert [d["code"] for d in ours["diagnostics"] if d["code"] != "paged-state"] == [], (name, ours["diagnostics"])
        assert ours["peak"]["bytes"] == theirs["peak"]["bytes"] > 0, (name, ours["peak"]["bytes"], theirs["peak"]["bytes"])
        assert ours["footprint"] == theirs["footprint"], name


# the later files whose published single-GPU row docs/accuracy.md holds (their configs in tests/support/published); not
# Gemma 2's (refused) nor Llama 3 and 3.1 8B's full.yaml (the README: OOM, on 4 and on 1 A10G)
LATER_MEASURED = tuple(name for name in LATER if not name.startswith("gemma2-") and name not in ("llama-3-8b-full", "llama-3.1-8b-full"))


def test_the_later_hub_configs_give_their_rows_peak(tmp_path):
    """The same for the config hub's later rows, but for what 0.5.13's model keeps: LitGPT's own file at HEAD is read
    as 0.5.13 runs it (at its `optimizer` key), its RMSNorm multiplying by weight.float() in fp32 (training.
    rmsnorm_upcast fp32_weight) and Phi-3's layers each building a sliding-window mask that SDPA keeps (its
    sliding_window_size at 26857050: training.litgpt_qkv window_mask), where the memfit config of the published run
    keeps 3ba6da40's model (litgpt/model.py 3ba6da40:409-420, and f247be87's, Phi-3's row: the normalized input cast
    back first, no window). With those two keys added the published config gives the hub file's peak, byte for byte;
    without them, less (never more)."""
    hub = check(*(HUB / f"{name}.yaml" for name in LATER_MEASURED))
    hand = check(*(PUBLISHED / f"litgpt-hub-{name}.yaml" for name in LATER_MEASURED))
    paths = []
    for name in LATER_MEASURED:
        training = yaml.safe_load(memfit("convert", HUB / f"{name}.yaml").stdout)["training"]
        assert training["rmsnorm_upcast"] == "fp32_weight", name
        assert training["litgpt_qkv"] == ({"window_mask": True} if name.startswith("phi-3-") else True), name
        doc = yaml.safe_load((PUBLISHED / f"litgpt-hub-{name}.yaml").read_text(encoding="utf-8"))
        doc["model"]["hf_config"] = str(PUBLISHED / doc["model"]["hf_config"])
        doc["training"].update(rmsnorm_upcast=training["rmsnorm_upcast"], litgpt_qkv=training["litgpt_qkv"])
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(doc), encoding="utf-8")
    head = check(*paths)
    for name in LATER_MEASURED:
        ours, theirs, same = hub[f"{name}.yaml"], hand[f"litgpt-hub-{name}.yaml"], head[f"{name}.yaml"]
        assert [d["code"] for d in same["diagnostics"] if d["code"] != "paged-state"] == [], (name, same["diagnostics"])
        assert ours["peak"]["bytes"] == same["peak"]["bytes"] > 0, (name, ours["peak"]["bytes"], same["peak"]["bytes"])
        assert ours["footprint"] == same["footprint"], name
        assert theirs["peak"]["bytes"] < ours["peak"]["bytes"], (name, ours["peak"]["bytes"], theirs["peak"]["bytes"])


def test_what_the_reader_makes_of_the_hub_configs():
    """qlora.yaml: bitsandbytes' nf4 under BitsandbytesPrecision, PagedAdamW's fp32 paged state, the 4-bit matmul's kept
    input; lora.yaml's flags as target modules; full.yaml over 4 devices: FSDP full shard with every block checkpointed
    (FSDPStrategy(activation_checkpointing_policy={Block})), global_batch_size / devices / micro_batch_size accumulated;
    every Linear 4-bit, lm_head's too, quantized from float16; StableLM's and Falcon's fused qkv: LoRAQKVLinear's parts
    as litgpt_qkv's list."""
    doc = yaml.safe_load(memfit("convert", HUB / "gemma-2b-qlora.yaml").stdout)
    assert doc["quantization"] == {"method": "nf4", "double_quant": False, "compute_dtype": "bfloat16", "quantized_from": "float16",
                                   "skip_modules": []}   # Lightning quantizes each weight from float16
    assert doc["optimizer"] == "adamw" and doc["dtypes"] == {"optimizer_state": "float32"}
    assert doc["training"]["paged_optimizer"] is True and doc["training"]["quantized_saves_input"] is True
    assert doc["training"]["previous_outputs_held"] is True  # fit() keeps the last logits through the next forward
    assert doc["training"]["outputs_dtype"] == "float32"  # Fabric's _FabricModule.forward: convert_output to fp32
    assert doc["training"]["loss"] == {"kind": "chunked_head", "chunk_size": 128} and doc["training"]["gradient_accumulation"] == 3
    assert doc["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    assert doc["model"]["transformer"]["tie_word_embeddings"] is False
    doc = yaml.safe_load(memfit("convert", HUB / "llama-2-7b-full.yaml").stdout)
    assert doc["parallel"] == {"fsdp": "full_shard", "fsdp_version": 1, "data": 4} and doc["training"]["checkpointing"] == "full"
    assert doc["training"]["gradient_accumulation"] == 64 // 4 // 4 and "lora" not in doc
    # full.py: model(input_ids), chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]) at its chunk_size 128
    assert doc["training"]["loss"] == {"kind": "chunked_rows", "chunk_size": 128}
    assert doc["training"]["outputs_dtype"] == "float32"  # full.py's fabric.setup(model) too
    doc = yaml.safe_load(memfit("convert", HUB / "stablelm-base-alpha-3b-qlora.yaml").stdout)
    assert doc["lora"]["target_modules"] == ["query_key_value"] and doc["training"]["litgpt_qkv"] == {"lora": ["query", "value"]}
    doc = yaml.safe_load(memfit("convert", HUB / "falcon-7b-lora.yaml").stdout)
    assert doc["model"]["transformer"]["model_type"] == "falcon" and doc["training"]["micro_batch"] == 1


def test_problems_are_placed_on_their_keys(tmp_path):
    """An unknown checkpoint directory (named with the models memfit knows), phi-2 (no family), quantize over more
    devices (LitGPT raises), a batch too small to accumulate, train.tie_embeddings (validate_args), a length left to
    the data: each at its key's line:column in the text output."""
    hub = (HUB / "phi-2-lora.yaml").read_text(encoding="utf-8")
    phi = tmp_path / "phi.yaml"
    phi.write_text(hub)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(hub.replace("checkpoints/microsoft/phi-2", "checkpoints/acme/llama-9b"))
    bad = tmp_path / "bad.yaml"
    bad.write_text((HUB / "tiny-llama-qlora.yaml").read_text(encoding="utf-8").replace("devices: 1", "devices: 2")
                   .replace("global_batch_size: 8", "global_batch_size: 4").replace("max_seq_length: 512", "max_seq_length:")
                   .replace("tie_embeddings:", "tie_embeddings: true"))
    out = memfit("check", "--budget", "80 GiB", phi, unknown, bad)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()

    def at(path, code):
        found = [line for line in lines if line.startswith(f"{path}:") and f"[{code}]" in line]
        assert found, (code, out.stdout)
        return ":".join(found[0].split(":")[:3])

    assert at(phi, "unsupported-model") == f"{phi}:3:17"
    assert at(unknown, "model-not-found") == f"{unknown}:3:17"
    assert "Llama-2-7b-hf" in next(line for line in lines if "[model-not-found]" in line)
    assert f"{bad}:15:10: error[native-config] quantize over more than one device" in out.stdout
    assert f"{bad}:65:22: error[native-config] global_batch_size 4 over 2 device(s)" in out.stdout
    assert f"{bad}:83:18: warning[not-modelled] train.max_seq_length is not set" in out.stdout
    assert f"{bad}:86:19: error[native-config] train.tie_embeddings" in out.stdout


def test_detected_by_its_keys_and_the_same_figures_as_converted(tmp_path):
    """A LitGPT config is told apart by checkpoint_dir with its script's keys; `memfit convert` prints the memfit config
    that checks to the same figures."""
    native = tmp_path / "lora.yaml"
    native.write_text("checkpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\nprecision: bf16-true\nlora_r: 16\nlora_mlp: true\n"
                      "train:\n  micro_batch_size: 2\n  global_batch_size: 16\n  max_seq_length: 1024\n")
    converted = memfit("convert", native)
    assert converted.returncode == 0, converted.stderr
    memfit_file = tmp_path / "lora.memfit.yaml"
    memfit_file.write_text(converted.stdout)
    found = check(native, memfit_file)
    a, b = found["lora.yaml"], found["lora.memfit.yaml"]
    assert a["input_format"] == "litgpt" and b["input_format"] == "memfit"
    assert a["peak"] == b["peak"] and a["footprint"] == b["footprint"]
    doc = yaml.safe_load(converted.stdout)
    assert doc["lora"] == {"r": 16, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], "dtype": "model"}
    assert doc["training"]["gradient_accumulation"] == 8 and doc["training"]["seq_len"] == 1024


@pytest.mark.parametrize("optimizer, expected", [
    ("optimizer: SGD\n", ("sgd", "foreach", None)),
    ("optimizer:\n  class_path: torch.optim.AdamW\n  init_args:\n    lr: 0.0002\n", ("adamw", "foreach", None)),
])
def test_a_later_releases_optimizer_key(tmp_path, optimizer, expected):
    native = tmp_path / "full.yaml"
    native.write_text(f"checkpoint_dir: checkpoints/google/gemma-2b\nprecision: bf16-true\n{optimizer}")
    doc = yaml.safe_load(memfit("convert", native).stdout)
    assert (doc["optimizer"], doc["training"].get("optimizer_impl"), doc.get("dtypes", {}).get("optimizer_state")) == expected


def test_a_fix_edits_the_micro_batch_and_keeps_the_global_batch():
    """--suggest's micro-batch fix in LitGPT's own keys: train.micro_batch_size changes; the accumulation is derived
    (global_batch_size // devices // micro_batch_size), so global_batch_size is left as the run's."""
    path = HUB / "llama-2-7b-lora.yaml"
    (entry,) = check(path, flags=("--suggest", "--budget", "16 GiB")).values()
    fix = next(f for f in entry["fixes"] if f["kind"] == "micro_batch")
    assert [c["key"] for c in fix["changes"]] == ["training.micro_batch", "training.gradient_accumulation"]
    line = path.read_text(encoding="utf-8").splitlines().index("  micro_batch_size: 2")
    assert fix["edits"] == [{"range": {"start": {"line": line, "character": 20}, "end": {"line": line, "character": 21}}, "new_text": "1"}]


def test_precision_as_lightning_names_it(tmp_path):
    """Lightning's short names (bf16: bf16-mixed) and LitGPT's default (null: bf16-mixed on a bfloat16 GPU); another
    value is an error at the key, and quantize under a mixed precision is LitGPT's ValueError, at quantize."""
    names = {"bf16": "bf16-mixed", "32": "32-true", "16-true": "16-true"}
    for given, expected in names.items():
        native = tmp_path / f"p{given}.yaml"
        native.write_text(f"checkpoint_dir: checkpoints/google/gemma-2b\nprecision: '{given}'\ntrain:\n  max_seq_length: 256\n")
        assert yaml.safe_load(memfit("convert", native).stdout)["precision"] == expected, given
    native = tmp_path / "bad.yaml"
    native.write_text("checkpoint_dir: checkpoints/google/gemma-2b\nprecision: fp8\n")
    assert f"{native}:2:12: error[native-config] precision is 'fp8'" in memfit("check", "--budget", "80 GiB", native).stdout
    native.write_text("checkpoint_dir: checkpoints/google/gemma-2b\nquantize: bnb.nf4\n")
    assert f"{native}:2:11: error[native-config] quantize bnb.nf4 with precision bf16-mixed" in memfit("check", "--budget", "80 GiB", native).stdout


def test_a_model_mapped_in_the_settings_wins_and_keeps_litgpts_untied_head(tmp_path):
    """The settings' models table maps a checkpoint directory LitGPT's table does not know to its config.json; the
    model is read with LitGPT's head apart from the embedding, whatever the config.json says."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "x.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 2,
                                                 "num_attention_heads": 8, "vocab_size": 1000, "tie_word_embeddings": True}))
    (tmp_path / "memfit.toml").write_text('[models]\n"checkpoints/acme/x" = "x.json"\n')
    native = tmp_path / "lora.yaml"
    native.write_text("checkpoint_dir: checkpoints/acme/x\nprecision: bf16-true\ntrain:\n  micro_batch_size: 1\n  global_batch_size: 1\n  max_seq_length: 128\n")
    (entry,) = check(native).values()
    assert entry["input_format"] == "litgpt" and entry["diagnostics"] == [], entry["diagnostics"]
    doc = yaml.safe_load(memfit("convert", native).stdout)
    assert doc["model"]["transformer"]["hidden_size"] == 512 and doc["model"]["transformer"]["tie_word_embeddings"] is False


def test_lora_head_adapts_gpt_neox_head_and_int8_sets_no_4bit_keys(tmp_path):
    """lora_head adapts StableLM's (GPT-NeoX's) output head, which memfit names lm_head; bnb.int8-training is not 4-bit:
    no kept 4-bit input, no quantized_from; an empty file is one positioned error, no traceback."""
    text = (HUB / "stablelm-base-alpha-3b-lora.yaml").read_text()
    peaks = {}
    for flag in ("false", "true"):
        path = tmp_path / f"head-{flag}.yaml"
        path.write_text(text.replace("lora_head: false", f"lora_head: {flag}"))
        peaks[flag] = check(path)[path.name]["footprint"]["parameters"]
    assert peaks["true"] > peaks["false"], peaks
    int8 = tmp_path / "int8.yaml"
    int8.write_text((HUB / "tiny-llama-qlora.yaml").read_text().replace("bnb.nf4", "bnb.int8-training"))
    doc = yaml.safe_load(memfit("convert", int8).stdout)
    assert doc["quantization"]["method"] == "int8" and "quantized_from" not in doc["quantization"]
    assert "quantized_saves_input" not in doc["training"]
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    done = memfit("check", "--input-format", "litgpt", "--format", "json", empty)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert [(d["code"], d["range"]["start"]["line"]) for d in json.loads(done.stdout)["files"][0]["diagnostics"]] == [("model-not-found", 0)]


@pytest.mark.parametrize("window, optimizer, expected", [(2048, True, {"window_mask": True}), (None, True, True),
                                                          (2048, False, True)])
def test_a_later_release_prices_the_checkpoints_sliding_window(tmp_path, window, optimizer, expected):
    """A local checkpoint directory's model_config.yaml (what LitGPT builds the model from) with sliding_window_size
    makes a later release's file (the `optimizer` key) keep each layer's mask (training.litgpt_qkv window_mask);
    without the window, or in a 3ba6da40 file, the attention is as it was."""
    folder = tmp_path / "checkpoints" / "tiny" / "tiny-phi"
    folder.mkdir(parents=True)
    (folder / "model_config.yaml").write_text(yaml.safe_dump({"name": "tiny-phi", "n_embd": 256, "sliding_window_size": window}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
                                                    "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 4096,
                                                    "intermediate_size": 688, "max_position_embeddings": 256}))
    doc = {"checkpoint_dir": "checkpoints/tiny/tiny-phi", "precision": "bf16-true",
           "train": {"global_batch_size": 1, "micro_batch_size": 1, "max_seq_length": 256}}
    if optimizer:
        doc["optimizer"] = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.0002}}
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    training = yaml.safe_load(memfit("convert", tmp_path / "full.yaml").stdout)["training"]
    assert training["litgpt_qkv"] == expected
    assert training.get("rmsnorm_upcast") == ("fp32_weight" if optimizer else None)


def test_a_later_mistral_v01_file_keeps_its_window_mask(tmp_path):
    """LitGPT 26857050's Mistral-7B-v0.1 sets sliding_window_size 4096 (config.py 1992-2006): a file read as 0.5.13's
    (the `optimizer` key) gets training.litgpt_qkv window_mask; the hub's 3ba6da40 file (no `optimizer`, no window
    then) does not."""
    text = (HUB / "mistral-7b-lora.yaml").read_text(encoding="utf-8")
    later = tmp_path / "mistral-7b-lora.yaml"
    later.write_text(text + "optimizer: AdamW\n", encoding="utf-8")
    qkv = yaml.safe_load(memfit("convert", later).stdout)["training"]["litgpt_qkv"]
    assert isinstance(qkv, dict) and qkv.get("window_mask") is True, qkv
    assert "window_mask" not in str(yaml.safe_load(memfit("convert", HUB / "mistral-7b-lora.yaml").stdout)["training"]["litgpt_qkv"])
