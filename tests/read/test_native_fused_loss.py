"""The fused linear cross-entropies read from the native formats that switch them on: Axolotl's
`liger_fused_linear_cross_entropy` and `cut_cross_entropy` (with their plugins listed), LLaMA-Factory's
`enable_liger_kernel` (pt and sft stages): training.fused_loss, the same figures as the conversion, and a peak below
the same run without it (a LoRA Llama 3 8B, its 128,256-token vocabulary at 4,096 tokens: the whole logits are the peak)."""

from __future__ import annotations

import shutil

from test_native import MODELS, figures, same_figures_as_converted

AXOLOTL = ("base_model: ./llama-3-8b.json\nsequence_len: 4096\nmicro_batch_size: 1\nbf16: true\ngradient_checkpointing: true\n"
           "adapter: lora\nlora_r: 16\nlora_target_linear: true\n")
LIGER = "plugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_fused_linear_cross_entropy: true\n"
CCE = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\ncut_cross_entropy: true\n"
FACTORY = ("model_name_or_path: ./llama-3-8b.json\nstage: sft\nfinetuning_type: lora\ncutoff_len: 4096\n"
           "per_device_train_batch_size: 1\nbf16: true\npure_bf16: true\n")


def test_axolotl_liger_and_cut_cross_entropy(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    plain = tmp_path / "plain.yml"
    plain.write_text(AXOLOTL)
    whole, _ = figures(plain, "--device", "H100-80GB")
    peaks = {}
    for kind, text in (("liger", LIGER), ("cut_cross_entropy", CCE)):
        native = tmp_path / f"{kind}.yml"
        native.write_text(AXOLOTL + text)
        out = same_figures_as_converted(native, "--device", "H100-80GB")
        assert out["doc"]["training"]["fused_loss"] == kind
        assert not [d for d in out["native"]["diagnostics"] if d["code"] == "not-modelled" and "cross" in d["message"].lower()]
        peaks[kind] = out["native"]["peak"]["bytes"]
        assert peaks[kind] < whole["peak"]["bytes"], (kind, peaks[kind], whole["peak"]["bytes"])
    # Liger keeps the output weight's gradient from the forward on; Cut Cross-Entropy makes it in the backward
    assert peaks["cut_cross_entropy"] <= peaks["liger"]


def test_axolotl_fused_loss_without_its_plugin_counts_the_logits(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    plain = tmp_path / "plain.yml"
    plain.write_text(AXOLOTL)
    whole, _ = figures(plain, "--device", "H100-80GB")
    bare = tmp_path / "bare.yml"
    bare.write_text(AXOLOTL + "liger_fused_linear_cross_entropy: true\n")
    entry, _ = figures(bare, "--device", "H100-80GB")
    assert entry["peak"]["bytes"] == whole["peak"]["bytes"]
    warned = [d for d in entry["diagnostics"] if "plugin" in d["message"]]   # (lines count from 0: the key's own line)
    assert warned and warned[0]["range"]["start"]["line"] == 8, entry["diagnostics"]
    both = tmp_path / "both.yml"
    both.write_text(AXOLOTL + LIGER + "cut_cross_entropy: true\n")
    entry, _ = figures(both, "--device", "H100-80GB")
    assert [d for d in entry["diagnostics"] if d["severity"] == "error" and "cut_cross_entropy" in d["message"]], entry["diagnostics"]


def test_axolotl_cut_cross_entropy_plugin_alone_switches_it_on(tmp_path):
    """CutCrossEntropyArgs.cut_cross_entropy defaults to True (axolotl 53dbf97d8, kept at 067b021): listing the plugin
    is enough (67 of the YAML files under examples/ at 067b021 list it without the key), and `cut_cross_entropy: false` turns it
    off again."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    plugin = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
    explicit, alone, off, plain = (tmp_path / f"{n}.yml" for n in ("explicit", "alone", "off", "plain"))
    explicit.write_text(AXOLOTL + CCE)
    alone.write_text(AXOLOTL + plugin)
    off.write_text(AXOLOTL + plugin + "cut_cross_entropy: false\n")
    plain.write_text(AXOLOTL)
    out = same_figures_as_converted(alone, "--device", "H100-80GB")
    assert out["doc"]["training"]["fused_loss"] == "cut_cross_entropy"
    assert not [d for d in out["native"]["diagnostics"] if d["code"] == "not-modelled"], out["native"]["diagnostics"]
    on, _ = figures(explicit, "--device", "H100-80GB")
    assert out["native"]["peak"]["bytes"] == on["peak"]["bytes"]
    whole, _ = figures(plain, "--device", "H100-80GB")
    disabled, _ = figures(off, "--device", "H100-80GB")
    assert disabled["peak"]["bytes"] == whole["peak"]["bytes"] > on["peak"]["bytes"]
    assert not [d for d in disabled["diagnostics"] if d["code"] == "not-modelled"], disabled["diagnostics"]


def test_axolotl_cut_cross_entropy_plugin_beside_liger_fused_loss(tmp_path):
    """Both plugins listed, liger_fused_linear_cross_entropy true and cut_cross_entropy unset: Axolotl's conflict check
    (utils/schemas/validation.py check_cross_entropy_conflicts) reads the raw keys and passes, then both patch the
    forward; memfit counts Liger's and says so at the plugin."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    both = tmp_path / "both.yml"
    both.write_text(AXOLOTL + "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
                    "  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\nliger_fused_linear_cross_entropy: true\n")
    entry, _ = figures(both, "--device", "H100-80GB")
    warned = [d for d in entry["diagnostics"] if "both patch" in d["message"]]
    assert warned and warned[0]["range"]["start"]["line"] == 10, entry["diagnostics"]
    liger = tmp_path / "liger.yml"
    liger.write_text(AXOLOTL + LIGER)
    alone, _ = figures(liger, "--device", "H100-80GB")
    assert entry["peak"]["bytes"] == alone["peak"]["bytes"]


def test_llama_factory_enable_liger_kernel(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    plain = tmp_path / "plain.yaml"
    plain.write_text(FACTORY)
    whole, _ = figures(plain, "--device", "H100-80GB")
    native = tmp_path / "liger.yaml"
    native.write_text(FACTORY + "enable_liger_kernel: true\n")
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    assert out["doc"]["training"]["fused_loss"] == "liger"
    assert out["native"]["peak"]["bytes"] < whole["peak"]["bytes"]
    # apply_liger_kernel_to_llama's defaults: its RMSNorm and SwiGLU priced (training.liger_kernels), its RoPE noted
    assert out["doc"]["training"]["liger_kernels"] == ["rope", "rms_norm", "swiglu"]
    assert [d for d in out["native"]["diagnostics"] if d["code"] == "not-modelled" and "rope" in d["message"]]
    assert not [d for d in out["native"]["diagnostics"] if "RMSNorm" in d["message"] or "swiglu" in d["message"]]
    dpo = tmp_path / "dpo.yaml"
    dpo.write_text(FACTORY.replace("stage: sft", "stage: dpo") + "enable_liger_kernel: true\n")
    entry, _ = figures(dpo, "--device", "H100-80GB")
    assert [d for d in entry["diagnostics"] if "keeps the logits" in d["message"]]



CCE_PLUGIN = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
REFUSALS = [  # (extra keys, the key at fault, Axolotl 067b021's validator, its ValueError's message)
    (CCE_PLUGIN + "chunked_cross_entropy: true\n", "chunked_cross_entropy",
     "integrations/cut_cross_entropy/args.py CutCrossEntropyArgs.check_chunked_cross_entropy_not_set, the plugin listed",
     "Cut Cross Entropy does not support chunked cross entropy. Please set `chunked_cross_entropy` to `False` or disable Cut Cross Entropy."),
    # the plugin's check reads chunked_cross_entropy alone: cut_cross_entropy false does not let it through
    (CCE_PLUGIN + "cut_cross_entropy: false\nchunked_cross_entropy: true\n", "chunked_cross_entropy",
     "integrations/cut_cross_entropy/args.py CutCrossEntropyArgs.check_chunked_cross_entropy_not_set, the plugin listed",
     "Cut Cross Entropy does not support chunked cross entropy. Please set `chunked_cross_entropy` to `False` or disable Cut Cross Entropy."),
    # the base config's check runs before the plugin's (pydantic runs the plugin class's validators last)
    (CCE_PLUGIN + "cut_cross_entropy: true\nchunked_cross_entropy: true\n", "chunked_cross_entropy",
     "utils/schemas/validation.py check_cross_entropy_conflicts",
     "Only one cross entropy optimization can be enabled at a time. Found 2 enabled: cut_cross_entropy, chunked_cross_entropy. Please disable all but one."),
    (LIGER + "cut_cross_entropy: true\n", "liger_fused_linear_cross_entropy",
     "utils/schemas/validation.py check_cross_entropy_conflicts",
     "Only one cross entropy optimization can be enabled at a time. Found 2 enabled: cut_cross_entropy, liger_fused_linear_cross_entropy. Please disable all but one."),
]


def test_axolotls_own_cross_entropy_refusals_are_errors_at_the_key(tmp_path):
    """Axolotl's validation refuses these configs (its ValueError, quoted): memfit says so at the key, exit 1, with no
    figure. The messages are Axolotl 067b021's, as its validators raise them on these keys (pydantic, run on the raw
    keys)."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    for i, (extra, key, where, message) in enumerate(REFUSALS):
        native = tmp_path / f"refused{i}.yml"
        native.write_text(AXOLOTL + extra)
        entry, out = figures(native, "--device", "H100-80GB")
        line = AXOLOTL.count("\n") + extra.splitlines().index(next(row for row in extra.splitlines() if row.startswith(f"{key}:")))
        errors = [d for d in entry["diagnostics"] if d["severity"] == "error"]
        assert out.returncode == 1 and entry["footprint"] is None, (extra, entry["diagnostics"])
        assert [(d["code"], d["message"], d["range"]["start"]) for d in errors] == [
            ("native-config", f"{key}: Axolotl refuses this config ({where}: \"{message}\")", {"line": line, "character": 0})], (extra, errors)


def test_cut_cross_entropy_without_a_half_precision_is_axolotls_refusal(tmp_path):
    """CutCrossEntropyArgs.check_dtype_is_half: cut_cross_entropy true with neither bf16 nor fp16 set (the raw keys;
    Axolotl's bf16 default `auto` is not in the raw config) is refused; `bf16: auto` passes."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    base = "base_model: ./llama-3-8b.json\nsequence_len: 1024\nmicro_batch_size: 1\n" + CCE
    bare, auto = tmp_path / "bare.yml", tmp_path / "auto.yml"
    bare.write_text(base)
    auto.write_text(base + "bf16: auto\n")
    entry, out = figures(bare, "--device", "H100-80GB")
    assert out.returncode == 1 and [(d["code"], d["range"]["start"]["line"]) for d in entry["diagnostics"]] == [("native-config", 5)]  # cut_cross_entropy (0-based line 5)
    assert "CutCrossEntropyArgs.check_dtype_is_half: \"Cut Cross Entropy requires fp16/bf16 training for backward pass." in entry["diagnostics"][0]["message"]
    entry, out = figures(auto, "--device", "H100-80GB")
    assert out.returncode == 0 and entry["footprint"] is not None, entry["diagnostics"]


def test_chunked_cross_entropy_alone_is_a_not_modelled_warning(tmp_path):
    """Without the Cut Cross-Entropy plugin chunked_cross_entropy runs (monkeypatch/loss/chunked.py): memfit counts the
    whole logits upcast, a warning at the key says the figure is high; the figures are the plain run's."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    plain, chunked = tmp_path / "plain.yml", tmp_path / "chunked.yml"
    plain.write_text(AXOLOTL)
    chunked.write_text(AXOLOTL + "chunked_cross_entropy: true\n")
    whole, _ = figures(plain, "--device", "H100-80GB")
    entry, out = figures(chunked, "--device", "H100-80GB")
    assert out.returncode == 0 and entry["peak"] == whole["peak"]
    [d] = entry["diagnostics"]
    assert d["code"] == "not-modelled" and d["range"]["start"]["line"] == AXOLOTL.count("\n") and "high, on the safe side" in d["message"]
