"""`litgpt pretrain` configs (read/native/litgpt.py read_pretrain), checked in place through the real CLI: the config
hub's own pretrain files (tests/support/litgpt-hub-pretrain/: Lightning-AI/litgpt config_hub/pretrain at 26857050, PyPI
litgpt 0.5.13, copied unchanged below a first line that cites them) get a figure, read as pretrain.py runs them, and
each problem is placed on the key that causes it. The step itself is measured in tests/ledger/test_litgpt_pretrain.py."""

import shutil
from pathlib import Path

import yaml
from test_litgpt import check, memfit

ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / "tests" / "support" / "litgpt-hub-pretrain"
HEAD = "26857050fe3ff627cd714fe92f5838f51a3d5efa"


def converted(path, *flags) -> dict:
    out = memfit("convert", *flags, path)
    assert out.returncode == 0, out.stdout + out.stderr
    return yaml.safe_load(out.stdout)


def line_of(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.startswith(f"{key}:"))


def test_each_pretrain_file_is_litgpts_own_and_gets_a_figure():
    """The four hub files: read as litgpt, no error; the warnings on the keys that cause them: `torch.compile` (always
    on in pretrain.py: the eager figure is gated, on the safe side) at model_name, `devices: auto` at devices."""
    files = sorted(HUB.glob("*.yaml"))
    assert [p.stem for p in files] == ["debug", "microllama", "tinyllama", "tinystories"]
    found = check(*files)
    for path in files:
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        assert first == f"# Lightning-AI/litgpt config_hub/pretrain/{path.stem}.yaml at {HEAD}, unchanged below this line"
        entry = found[path.name]
        assert entry["input_format"] == "litgpt", path
        assert entry["footprint"]["total"] > 0 and entry["peak"]["bytes"] >= entry["footprint"]["parameters"]
        where = {(d["range"]["start"]["line"] + 1, d["code"]) for d in entry["diagnostics"] if d["severity"] != "info"}
        assert where == {(line_of(path, "model_name"), "not-modelled"), (line_of(path, "devices"), "not-modelled")}, entry["diagnostics"]


def test_the_model_and_the_step_as_pretrain_py_builds_them():
    """pythia-14m (LitGPT's config.py: Config's GPT-NeoX defaults, vocabulary 50254 padded to 50304), max_seq_length
    null -> block_size; TinyLlama's grouped-query Llama; tinystories' inline Config fields (head_size 48); bf16-mixed,
    every parameter trained, fused AdamW (main's fused=True on CUDA), accumulation 125 // 1 // 5."""
    debug = converted(HUB / "debug.yaml")
    assert debug["model"]["transformer"] == {"hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
                                             "vocab_size": 50304, "max_position_embeddings": 512, "tie_word_embeddings": False,
                                             "model_type": "gpt_neox", "intermediate_size": 512, "rotary_pct": 0.25,
                                             "use_parallel_residual": True, "hidden_act": "gelu"}
    assert debug["precision"] == "bf16-mixed" and debug["optimizer"] == "adamw"
    assert {k: debug["training"][k] for k in ("micro_batch", "gradient_accumulation", "seq_len", "checkpointing", "optimizer_impl")} == \
        {"micro_batch": 5, "gradient_accumulation": 25, "seq_len": 512, "checkpointing": "none", "optimizer_impl": "fused"}
    assert "lora" not in debug and "parallel" not in debug
    tiny = converted(HUB / "tinyllama.yaml")["model"]["transformer"]
    assert (tiny["model_type"], tiny["hidden_size"], tiny["num_hidden_layers"], tiny["num_key_value_heads"], tiny["intermediate_size"]) == ("llama", 2048, 22, 4, 5632)
    stories = converted(HUB / "tinystories.yaml")
    assert stories["model"]["transformer"]["hidden_size"] == 288 and stories["training"]["seq_len"] == 256


def test_devices_and_nodes_make_a_hybrid_sharded_layout():
    """Above one GPU pretrain.py runs FSDPStrategy(sharding_strategy="HYBRID_SHARD") without activation checkpointing:
    --gpus 8 fills devices: auto (no warning then), and the accumulation is global_batch_size // world // micro."""
    doc = converted(HUB / "tinyllama.yaml", "--gpus", "8")
    assert doc["parallel"] == {"fsdp": "hybrid_shard", "fsdp_version": 1, "data": 8, "gpus_per_node": 8}
    assert doc["training"]["gradient_accumulation"] == 512 // 8 // 4 and doc["training"]["checkpointing"] == "none"
    assert not [d for d in check(HUB / "tinyllama.yaml", flags=("--budget", "80 GiB", "--gpus", "8"))["tinyllama.yaml"]["diagnostics"] if d["code"] != "not-modelled" or "devices" in d["message"]]


def test_two_nodes_shard_within_each(tmp_path):
    text = (HUB / "tinyllama.yaml").read_text(encoding="utf-8").replace("devices: auto", "devices: 4").replace("num_nodes: 1", "num_nodes: 2")
    path = tmp_path / "tinyllama.yaml"
    path.write_text(text, encoding="utf-8")
    doc = converted(path)
    assert doc["parallel"] == {"fsdp": "hybrid_shard", "fsdp_version": 1, "data": 8, "gpus_per_node": 4}
    assert doc["training"]["gradient_accumulation"] == 512 // 8 // 4


def test_tied_embeddings_share_the_heads_weight(tmp_path):
    text = (HUB / "debug.yaml").read_text(encoding="utf-8")
    tied = tmp_path / "tied.yaml"
    tied.write_text(text.replace("  tie_embeddings:\n", "  tie_embeddings: true\n"), encoding="utf-8")
    found = check(HUB / "debug.yaml", tied)
    # bf16-mixed: fp32 weights; the head is 50304 x 128 and goes once
    assert found["debug.yaml"]["footprint"]["parameters"] - found["tied.yaml"]["footprint"]["parameters"] == 50304 * 128 * 4


def test_problems_are_placed_on_their_keys(tmp_path):
    """An unknown model_name, model_config fields memfit does not map (a mixture of experts), a sequence above the
    block size, a precision pretrain.py does not take: each an error on its key, and the other files still checked."""
    text = (HUB / "tinystories.yaml").read_text(encoding="utf-8")
    cases = {
        "name.yaml": ((HUB / "debug.yaml").read_text(encoding="utf-8").replace("model_name: pythia-14m", "model_name: pythia-13b"), "model_name", "model-not-found", "pythia-13b"),
        "moe.yaml": (text.replace("  intermediate_size: 768\n", "  intermediate_size: 768\n  n_expert: 8\n"), "model_config", "unsupported-model", "n_expert"),
        "long.yaml": (text.replace("  max_seq_length: 256", "  max_seq_length: 512"), "max_seq_length", "native-config", "block_size 256"),
        "precision.yaml": (text.replace("precision: bf16-mixed", "precision: 16-mixed"), "precision", "native-config", "16-mixed"),
    }
    paths = []
    for name, (body, _, _, _) in cases.items():
        assert body != text or name == "name.yaml"
        (tmp_path / name).write_text(body, encoding="utf-8")
        paths.append(tmp_path / name)
    found = check(*paths, HUB / "debug.yaml")
    assert found["debug.yaml"]["footprint"]["total"] > 0
    for name, (body, key, code, words) in cases.items():
        errors = [d for d in found[name]["diagnostics"] if d["severity"] == "error"]
        line = next(i for i, row in enumerate(body.splitlines(), 1) if row.lstrip().startswith(f"{key}:"))
        assert [(d["range"]["start"]["line"] + 1, d["code"]) for d in errors] == [(line, code)] and words in errors[0]["message"], (name, errors)


def test_the_settings_gpus_fill_devices_auto_and_disagreeing_flags_are_said(tmp_path):
    """`gpus = 8` in memfit.toml fills `devices: auto` as --gpus 8 does (HYBRID_SHARD, no warning at devices); a --gpus
    that is not devices x num_nodes is checked with a warning at devices; --gpus-per-node other than devices (LitGPT
    shards within each node's devices ranks) is said at devices."""
    shutil.copy(HUB / "tinyllama.yaml", tmp_path / "tinyllama.yaml")
    (tmp_path / "memfit.toml").write_text("gpus = 8\n", encoding="utf-8")
    doc = converted(tmp_path / "tinyllama.yaml")
    assert doc["parallel"] == {"fsdp": "hybrid_shard", "fsdp_version": 1, "data": 8, "gpus_per_node": 8}
    assert doc["training"]["gradient_accumulation"] == 512 // 8 // 4
    (tmp_path / "memfit.toml").unlink()
    two = tmp_path / "two.yaml"
    two.write_text((HUB / "tinyllama.yaml").read_text(encoding="utf-8").replace("devices: auto", "devices: 4").replace("num_nodes: 1", "num_nodes: 2"), encoding="utf-8")
    line = line_of(two, "devices")
    for flags, words in ((("--gpus", "16"), "--gpus 16 is not this config's devices x num_nodes = 8"),
                         (("--gpus-per-node", "8"), "--gpus-per-node 8: LitGPT's HYBRID_SHARD shards within each node's devices = 4")):
        entry = check(two, flags=("--budget", "80 GiB", *flags))["two.yaml"]
        said = [d for d in entry["diagnostics"] if d["range"]["start"]["line"] + 1 == line]
        assert len(said) == 1 and said[0]["message"].startswith(words), entry["diagnostics"]
    assert converted(two, "--gpus", "16")["parallel"] == {"fsdp": "hybrid_shard", "fsdp_version": 1, "data": 16, "gpus_per_node": 8}


def test_a_sliding_window_is_the_mask_every_layer_keeps(tmp_path):
    """model.py 26857050: a model with sliding_window_size builds each layer's (1, 1, s, s) mask, which SDPA keeps
    (training.litgpt_qkv window_mask): by model_config's field, and by model_name for LitGPT's Mistral-7B-v0.1
    (config.py 1992-2006: sliding_window_size 4096); tinystories' model has none. The mask adds one (s, s) bf16 tensor
    a layer to the peak (its price is measured in tests/ledger/test_litgpt_head.py's Phi-3 cases)."""
    text = (HUB / "tinystories.yaml").read_text(encoding="utf-8")
    windowed = tmp_path / "windowed.yaml"
    windowed.write_text(text.replace("  intermediate_size: 768\n", "  intermediate_size: 768\n  sliding_window_size: 128\n"), encoding="utf-8")
    assert converted(windowed)["training"]["litgpt_qkv"] == {"window_mask": True}
    assert converted(HUB / "tinystories.yaml")["training"]["litgpt_qkv"] is True
    named = tmp_path / "mistral.yaml"
    named.write_text((HUB / "tinyllama.yaml").read_text(encoding="utf-8").replace("model_name: tiny-llama-1.1b", "model_name: Mistral-7B-v0.1"), encoding="utf-8")
    assert converted(named)["training"]["litgpt_qkv"] == {"window_mask": True}
    found = check(HUB / "tinystories.yaml", windowed)
    # bf16-mixed: the mask in autocast's compute dtype, one 256 x 256 a layer (not a sequence), 6 layers, kept for backward
    assert found["windowed.yaml"]["peak"]["bytes"] - found["tinystories.yaml"]["peak"]["bytes"] == 6 * 256 * 256 * 2
