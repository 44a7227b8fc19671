"""torchtune's shipped configs through the CLI (issue 32): where the sequence length is left to the data
(`tokenizer.max_seq_len: null`) memfit gates a stated length (2,048 tokens, or the setting `data_seq_len`), never the
model's maximum context, and says so at the key with the longest sequence that fits (what `memfit fit --vary seq_len`
answers); `packed: true` without a length is torchtune's own error. The builders memfit maps (gemma2, code_llama2,
phi4) give the parameters of torchtune 0.6.1's own build; llama3_2_vision is refused, saying why (what torchtune's model trains and keeps apart from transformers' mllama).

The configs in tests/read/torchtune_configs/ are torchtune's, verbatim: recipes/configs/ at pytorch/torchtune
bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 (code_llama2's at v0.6.1, a6290a5b4075, the last release that has it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path


CONFIGS = Path(__file__).resolve().parent / "torchtune_configs"
SUPPORT = Path(__file__).resolve().parents[1] / "support"
LEFT_TO_DATA = {  # config -> (the model's max_seq_len, the line:column of tokenizer.max_seq_len's value)
    "llama3_1_8B_full_single_device.yaml": (131072, "29:16"),
    "llama3_2_3B_full_single_device.yaml": (131072, "29:16"),
    "phi4_14B_lora_single_device.yaml": (16384, "35:16"),
    "code_llama2_7B_lora_single_device.yaml": (16384, "34:16"),
}


def memfit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, timeout=300, check=False, cwd=cwd)


def entries(*args, cwd=None) -> list[dict]:
    out = memfit(*args, cwd=cwd)
    return json.loads(out.stdout)["files"]


def written(tmp_path: Path, name: str, seq) -> Path:
    """The shipped config with tokenizer.max_seq_len written (the text edited in place, nothing else changed)."""
    text = (CONFIGS / name).read_text(encoding="utf-8")
    text, count = re.subn(r"(?m)^(  max_seq_len:) null", rf"\1 {seq}", text)
    assert count == 1
    path = tmp_path / f"{seq}-{name}"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_length_left_to_the_data_gates_the_stated_default_and_names_the_longest_that_fits(tmp_path):
    names = sorted(LEFT_TO_DATA)
    shipped = entries("check", "--format", "json", "--device", "H100-80GB", *[CONFIGS / n for n in names])
    at_default = entries("check", "--format", "json", "--device", "H100-80GB", *[written(tmp_path, n, 2048) for n in names])
    at_most = entries("check", "--format", "json", "--device", "H100-80GB", *[written(tmp_path, n, LEFT_TO_DATA[n][0]) for n in names])
    fits = entries("fit", "--vary", "seq_len", "--format", "json", "--device", "H100-80GB", *[CONFIGS / n for n in names])
    text = memfit("check", "--device", "H100-80GB", *[CONFIGS / n for n in names]).stdout
    for name, entry, default, most, fit in zip(names, shipped, at_default, at_most, fits):
        (warning,) = [d for d in entry["diagnostics"] if "tokenizer.max_seq_len is not set" in d["message"]]
        assert f"memfit gates 2,048 tokens" in warning["message"] and f"the model allows {LEFT_TO_DATA[name][0]:,} tokens" in warning["message"]
        # the gated figure is the run at 2,048 tokens, and not the one at the model's maximum context
        assert entry["peak"] == default["peak"], name
        assert entry["peak"]["bytes"] < most["peak"]["bytes"], name
        # the longest that fits, in the message, is fit's answer on the same file
        longest = int(re.search(r"the longest sequence that fits is ([\d,]+) tokens", warning["message"])[1].replace(",", ""))
        assert longest == fit["max"] and longest > 2048, (name, longest, fit["max"])
        assert (", beyond the model's" in warning["message"]) == (longest >= LEFT_TO_DATA[name][0])
        assert f"{CONFIGS / name}:{LEFT_TO_DATA[name][1]}: warning[not-modelled] tokenizer.max_seq_len is not set" in text
    # Llama 3.1 8B full at its 131,072 tokens would not fit an H100; at the gated length it does
    assert any(d["code"] == "budget-exceeded" for d in at_most[names.index("llama3_1_8B_full_single_device.yaml")]["diagnostics"])
    assert not any(d["code"] == "budget-exceeded" for d in shipped[names.index("llama3_1_8B_full_single_device.yaml")]["diagnostics"])


def test_the_setting_changes_the_gated_length(tmp_path):
    name = "llama3_2_3B_full_single_device.yaml"
    (tmp_path / name).write_text((CONFIGS / name).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "memfit.toml").write_text('device = "H100-80GB"\ndata_seq_len = 4096\n', encoding="utf-8")
    (entry,) = entries("check", "--format", "json", name, cwd=tmp_path)
    (at_4096,) = entries("check", "--format", "json", "--device", "H100-80GB", written(tmp_path, name, 4096))
    (warning,) = [d for d in entry["diagnostics"] if "tokenizer.max_seq_len is not set" in d["message"]]
    assert "memfit gates 4,096 tokens (data_seq_len in memfit.toml)" in warning["message"]
    assert entry["peak"] == at_4096["peak"]
    (tmp_path / "memfit.toml").write_text('data_seq_len = "long"\n', encoding="utf-8")
    out = memfit("check", name, cwd=tmp_path)
    assert "memfit.toml:1:1: error[native-config] settings: data_seq_len is 'long': a positive integer" in out.stdout, out.stdout


def test_without_a_device_the_message_says_why_no_length_is_given():
    (entry,) = entries("check", "--format", "json", "--no-settings", CONFIGS / "phi4_14B_lora_single_device.yaml")
    (warning,) = [d for d in entry["diagnostics"] if "tokenizer.max_seq_len is not set" in d["message"]]
    assert warning["message"].endswith("no budget to find the longest sequence that fits (set a device)")


def test_packed_without_a_length_is_torchtunes_error(tmp_path):
    name = "llama3_2_3B_full_single_device.yaml"
    text = (CONFIGS / name).read_text(encoding="utf-8").replace("  packed: False  # True increases speed", "  packed: True")
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    out = memfit("check", "--device", "H100-80GB", path)
    assert out.returncode == 1
    assert f"{path}:34:11: error[native-config] dataset packed: true needs tokenizer.max_seq_len" in out.stdout, out.stdout
    # with a length, packing fills every sequence to it: the figure at that length, no warning about the length
    packed = written(tmp_path, name, 4096)
    packed.write_text(packed.read_text(encoding="utf-8").replace("  packed: False  # True increases speed", "  packed: True"), encoding="utf-8")
    (entry,) = entries("check", "--format", "json", "--device", "H100-80GB", packed)
    (tmp_path / "plain").mkdir()
    (plain,) = entries("check", "--format", "json", "--device", "H100-80GB", written(tmp_path / "plain", name, 4096))
    assert entry["peak"] == plain["peak"] and not [d for d in entry["diagnostics"] if "max_seq_len" in d["message"]]


def test_llama3_2_vision_is_refused_at_its_builder_saying_why():
    path = CONFIGS / "llama3_2_vision_11B_lora_single_device.yaml"
    out = memfit("check", "--device", "H100-80GB", path)
    assert out.returncode == 1
    assert f"{path}:20:16: error[unsupported-model] torchtune builder 'torchtune.models.llama3_2_vision.lora_llama3_2_vision_11b': Llama 3.2 Vision" in out.stdout
    assert "torchtune builds 10,640,652,835 parameters and the LoRA recipe trains 11,468,800 of them" in out.stdout
    assert "mllama" in out.stdout and "TransformerSelfAttentionLayer" in out.stdout


def test_a_builder_torchtune_does_not_have_names_the_nearest_it_does():
    """The shipped Qwen2.5 KD config (bd2a0fc) names `lora_qwen2_5_7b`; torchtune's qwen2_5/_model_builders.py has
    lora_qwen2_5_7b_base and lora_qwen2_5_7b_instruct only."""
    path = CONFIGS / "qwen2_5_14B_to_7B_KD_lora_single_device.yaml"
    out = memfit("check", "--device", "H100-80GB", path)
    assert out.returncode == 1
    assert (f"{path}:22:16: error[unsupported-model] torchtune builder 'torchtune.models.qwen2_5.lora_qwen2_5_7b': not one memfit knows "
            "(the nearest memfit knows: torchtune.models.qwen2_5.lora_qwen2_5_7b_base, torchtune.models.qwen2_5.lora_qwen2_5_7b_instruct; "
            "memfit knows the builders of code_llama2, gemma, gemma2, llama2, llama3, llama3_1, llama3_2, mistral, phi3, phi4, qwen2, qwen2_5, qwen3") in out.stdout, out.stdout


BUILDERS = ["gemma2.gemma2_2b", "gemma2.gemma2_9b", "gemma2.gemma2_27b", "code_llama2.code_llama2_7b", "code_llama2.code_llama2_13b",
            "code_llama2.code_llama2_70b", "phi4.phi4_14b"]


def memfit_parameters(tmp_path: Path) -> dict[str, int]:
    """Each builder's parameters as memfit counts them: `memfit check` on a torchtune config naming it, a full fine-tune
    in fp32, by its gradients (4 bytes each; the registered buffers memfit keeps under `parameters` have none)."""
    paths = []
    for builder in BUILDERS:
        path = tmp_path / f"{builder}.yaml"
        path.write_text(f"model:\n  _component_: torchtune.models.{builder}\ntokenizer:\n  max_seq_len: 16\nbatch_size: 1\ndtype: fp32\n", encoding="utf-8")
        paths.append(path)
    out = {}
    for builder, entry in zip(BUILDERS, entries("check", "--format", "json", "--budget", "10TiB", *paths)):
        assert entry["footprint"]["gradients"] % 4 == 0, builder
        out[builder] = entry["footprint"]["gradients"] // 4
    return out


def test_the_new_builders_are_torchtunes_own_build(tmp_path):
    """torchtune 0.6.1 builds each on the meta device (tests/support/torchtune_count.py): the same parameter count."""
    python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
    if not python:
        import needs

        needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
    done = subprocess.run([python, str(SUPPORT / "torchtune_count.py"), *BUILDERS, *LORA_BUILDERS], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert memfit_parameters(tmp_path) == {b: theirs[b] for b in BUILDERS}
    # the LoRA builders' adapters (q, v, output, MLP at rank 8): memfit's gradients in fp32, 4 bytes each
    ours = memfit_adapters(tmp_path)
    for builder in ("gemma2.lora_gemma2_2b", "gemma2.lora_gemma2_27b", "code_llama2.lora_code_llama2_7b"):
        assert ours[builder] == theirs[builder], builder
    # Phi-4 (torchtune's Phi-3 builder) adapts q, k, v, gate and up separately; memfit's fused qkv_proj / gate_up_proj
    # carry one lora_a each: fewer elements, as the warning at lora_attn_modules says with these two figures
    assert (ours["phi4.lora_phi4_14b"], theirs["phi4.lora_phi4_14b"]) == (27_852_800, 30_720_000)


LORA_BUILDERS = ["gemma2.lora_gemma2_2b", "gemma2.lora_gemma2_27b", "code_llama2.lora_code_llama2_7b", "phi4.lora_phi4_14b"]


def memfit_adapters(tmp_path: Path) -> dict[str, int]:
    paths = []
    for builder in LORA_BUILDERS:
        path = tmp_path / f"{builder}.yaml"
        path.write_text(f"model:\n  _component_: torchtune.models.{builder}\n  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n"
                        "  apply_lora_to_mlp: True\n  lora_rank: 8\n  lora_alpha: 16\ntokenizer:\n  max_seq_len: 16\nbatch_size: 1\ndtype: fp32\n", encoding="utf-8")
        paths.append(path)
    found = entries("check", "--format", "json", "--budget", "10TiB", *paths)
    phi4 = found[LORA_BUILDERS.index("phi4.lora_phi4_14b")]
    assert any("27,852,800 against 30,720,000" in d["message"] for d in phi4["diagnostics"])
    return {b: e["footprint"]["gradients"] // 4 for b, e in zip(LORA_BUILDERS, found)}


def test_the_new_builders_are_the_published_models(tmp_path):
    """Without torchtune: the parameter counts of the models these builders load (Gemma 2 2B/9B/27B, CodeLlama
    7B/13B/70B, Phi-4), from transformers' own classes built on the meta device from the published config.json values."""
    import torch
    import transformers

    def count(config) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())

    gemma2 = dict(vocab_size=256000, max_position_embeddings=8192)
    llama = dict(vocab_size=32016, max_position_embeddings=16384, rope_theta=1e6)
    theirs = {
        "gemma2.gemma2_2b": count(transformers.Gemma2Config(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256, **gemma2)),
        "gemma2.gemma2_9b": count(transformers.Gemma2Config(hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8, head_dim=256, **gemma2)),
        "gemma2.gemma2_27b": count(transformers.Gemma2Config(hidden_size=4608, intermediate_size=36864, num_hidden_layers=46, num_attention_heads=32, num_key_value_heads=16, head_dim=128, **gemma2)),
        "code_llama2.code_llama2_7b": count(transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, **llama)),
        "code_llama2.code_llama2_13b": count(transformers.LlamaConfig(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40, **llama)),
        "code_llama2.code_llama2_70b": count(transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, **llama)),
        "phi4.phi4_14b": count(transformers.Phi3Config(hidden_size=5120, intermediate_size=17920, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=10, vocab_size=100352,
                                                       max_position_embeddings=16384, pad_token_id=None)),
    }
    assert memfit_parameters(tmp_path) == theirs


def test_trls_max_length_null_is_left_to_the_data_the_same_way(tmp_path):
    """The same length and the same message for every format: TRL's SFTConfig `max_length: null` (no truncation) in a
    Trainer argument file gates 2,048 tokens with fit's longest, not the model's 8,192."""
    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "llama-3-8b.json"
    (tmp_path / "llama-3-8b.json").write_text(model.read_text(encoding="utf-8"), encoding="utf-8")
    body = "model_name_or_path: ./llama-3-8b.json\nper_device_train_batch_size: 2\noutput_dir: out\nmax_length: {}\nbf16: true\ntorch_dtype: bfloat16\n"
    (tmp_path / "sft.yaml").write_text(body.format("null"), encoding="utf-8")
    (tmp_path / "sft-2048.yaml").write_text(body.format(2048), encoding="utf-8")
    left, fixed = entries("check", "--format", "json", "--device", "H100-80GB", "sft.yaml", "sft-2048.yaml", cwd=tmp_path)
    (fit,) = entries("fit", "--vary", "seq_len", "--format", "json", "--device", "H100-80GB", "sft.yaml", cwd=tmp_path)
    (warning,) = [d for d in left["diagnostics"] if d["message"].startswith("max_length is null")]
    assert warning["range"]["start"] == {"line": 3, "character": 12}
    assert "the model allows 8,192 tokens); memfit gates 2,048 tokens" in warning["message"]
    assert f"the longest sequence that fits is {fit['max']:,} tokens" in warning["message"]
    assert left["peak"] == fixed["peak"]


def test_a_distributed_recipes_key_without_gpus_says_the_world_is_the_launchs(tmp_path):
    """A key only torchtune's distributed recipes read (here fsdp_cpu_offload, as 70B_full.yaml writes it) and no
    --gpus: memfit checks a world of one and says at that key that the world size is the launch's; with --gpus the
    warning is gone and the figure is one rank's."""
    text = (CONFIGS / "llama3_1_8B_full_single_device.yaml").read_text(encoding="utf-8")
    text = re.sub(r"(?m)^(  max_seq_len:) null", r"\1 2048", text) + "fsdp_cpu_offload: False\n"
    line = text.count("\n")  # the appended key's line, counted from 1
    path = tmp_path / "8B_full.yaml"
    path.write_text(text, encoding="utf-8")
    out = memfit("check", "--device", "H100-80GB", path)
    assert f"{path}:{line}:1: warning[not-modelled] fsdp_cpu_offload: a distributed recipe's key" in out.stdout, out.stdout
    assert "pass --gpus N" in out.stdout
    (one,) = entries("check", "--format", "json", "--device", "H100-80GB", path)
    (two,) = entries("check", "--format", "json", "--device", "H100-80GB", "--gpus", "2", path)
    assert not [d for d in two["diagnostics"] if "distributed recipe" in d["message"]], two["diagnostics"]
    (said,) = entries("check", "--format", "json", "--device", "H100-80GB", "--gpus", "1", path)  # the user said one
    assert not [d for d in said["diagnostics"] if "distributed recipe" in d["message"]], said["diagnostics"]
    assert two["peak"]["bytes"] < one["peak"]["bytes"]
