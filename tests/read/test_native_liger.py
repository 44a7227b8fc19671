"""Liger-Kernel's RMSNorm and SwiGLU read from the native formats that switch them on: Axolotl's `liger_rms_norm` and
`liger_glu_activation` (its LigerPlugin listed), LLaMA-Factory's `enable_liger_kernel` (tests/read/
test_native_fused_loss.py) and the Trainer's `use_liger_kernel` (+ `liger_kernel_config`): training.liger_kernels
(ledger/techniques/liger_kernels.py, measured in tests/ledger/test_liger_kernels.py), the same figures as the
conversion, and a footprint below the same run without them (Llama 3 8B, full checkpointing off: every layer's
norms and MLP activations saved)."""

from __future__ import annotations

import json
import shutil

from test_native import MODELS, figures, same_figures_as_converted

AXOLOTL = ("base_model: ./llama-3-8b.json\nsequence_len: 2048\nmicro_batch_size: 1\nbf16: true\n"
           "adapter: lora\nlora_r: 16\nlora_target_linear: true\n")
PLUGIN = "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"


def _saved(entry: dict) -> int:
    return entry["footprint"]["activations"]


def test_axolotl_liger_rms_norm_and_glu_activation(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    plain = tmp_path / "plain.yml"
    plain.write_text(AXOLOTL)
    whole, _ = figures(plain, "--device", "H100-80GB")
    saved = {}
    for kernels, text in ((["rms_norm"], "liger_rms_norm: true\n"), (["swiglu"], "liger_glu_activation: true\n"),
                          (["rms_norm", "swiglu"], "liger_rms_norm: true\nliger_glu_activation: true\n")):
        native = tmp_path / f"{'_'.join(kernels)}.yml"
        native.write_text(AXOLOTL + PLUGIN + text)
        out = same_figures_as_converted(native, "--device", "H100-80GB")
        assert out["doc"]["training"]["liger_kernels"] == kernels
        assert not [d for d in out["native"]["diagnostics"] if "liger" in d["message"].lower()], out["native"]["diagnostics"]
        saved[tuple(kernels)] = _saved(out["native"])
        assert saved[tuple(kernels)] < _saved(whole), (kernels, saved[tuple(kernels)], _saved(whole))
    assert saved[("rms_norm", "swiglu")] < min(saved[("rms_norm",)], saved[("swiglu",)])
    # without its plugin Axolotl applies none of them: the eager figure, and a warning at the key
    bare = tmp_path / "bare.yml"
    bare.write_text(AXOLOTL + "liger_rms_norm: true\n")
    entry, _ = figures(bare, "--device", "H100-80GB")
    assert _saved(entry) == _saved(whole)
    warned = [d for d in entry["diagnostics"] if "plugin" in d["message"]]
    assert warned and warned[0]["range"]["start"]["line"] == 7, entry["diagnostics"]


def test_the_trainer_use_liger_kernel(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    args = {"model_name_or_path": "./llama-3-8b.json", "output_dir": "out", "do_train": True, "block_size": 1024, "bf16": True}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(args))
    whole, _ = figures(plain, "--device", "H100-80GB")
    native = tmp_path / "liger.json"
    native.write_text(json.dumps({**args, "use_liger_kernel": True}))
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    # _apply_liger_kernel_to_instance's defaults for Llama: rope (noted, not priced), rms_norm, swiglu and the fused loss
    assert out["doc"]["training"]["liger_kernels"] == ["rope", "rms_norm", "swiglu"]
    assert out["doc"]["training"]["fused_loss"] == "liger"
    assert _saved(out["native"]) < _saved(whole)
    assert [d for d in out["native"]["diagnostics"] if d["code"] == "not-modelled" and "rope" in d["message"]]
    native.write_text(json.dumps({**args, "use_liger_kernel": True,
                                  "liger_kernel_config": {"rope": False, "swiglu": False, "fused_linear_cross_entropy": False}}))
    out = same_figures_as_converted(native, "--device", "H100-80GB")
    assert out["doc"]["training"]["liger_kernels"] == ["rms_norm"]
    assert "fused_loss" not in out["doc"]["training"]
    assert not [d for d in out["native"]["diagnostics"] if "liger" in d["message"].lower()], out["native"]["diagnostics"]


def test_liger_on_a_model_type_it_does_not_patch_is_the_models_own_run(tmp_path):
    """Liger patches only the model types it lists (liger-kernel 0.6.4 MODEL_TYPE_TO_APPLY_LIGER_FN, for the Trainer's
    use_liger_kernel; LLaMA-Factory's apply_liger_kernel its own list): Starcoder2 under the Trainer and SmolLM3 under
    LLaMA-Factory run their own modules, so the figure is the plain run's, with a warning at the key."""
    for model in ("starcoder2-7b.json", "smollm3-3b.json"):
        shutil.copy(MODELS / model, tmp_path / model)
    args = {"model_name_or_path": "./starcoder2-7b.json", "output_dir": "out", "do_train": True, "block_size": 1024, "bf16": True}
    factory = ("model_name_or_path: ./smollm3-3b.json\nstage: sft\nfinetuning_type: lora\ncutoff_len: 2048\n"
               "per_device_train_batch_size: 1\nbf16: true\n")
    for name, plain_text, liger_text in (("trainer.json", json.dumps(args), json.dumps({**args, "use_liger_kernel": True})),
                                         ("factory.yaml", factory, factory + "enable_liger_kernel: true\n")):
        plain, native = tmp_path / f"plain-{name}", tmp_path / name
        plain.write_text(plain_text)
        native.write_text(liger_text)
        whole, _ = figures(plain, "--device", "H100-80GB")
        out = same_figures_as_converted(native, "--device", "H100-80GB")
        assert "liger_kernels" not in out["doc"].get("training", {}) and "fused_loss" not in out["doc"].get("training", {}), out["doc"]
        assert out["native"]["peak"]["bytes"] == whole["peak"]["bytes"]
        assert [d for d in out["native"]["diagnostics"] if "Liger" in d["message"] and d["severity"] == "warning"], out["native"]["diagnostics"]


def test_axolotl_refuses_liger_swiglu_beside_liger_glu_activation(tmp_path):
    """LigerArgs.check_deprecated_swiglu (axolotl 067b021 integrations/liger/args.py): with the Liger plugin listed, the
    deprecated liger_swiglu beside liger_glu_activation is a ValueError whatever their values (`is not None`): an error
    at liger_swiglu quoting it, exit 1; without the plugin Axolotl never validates them (the plugin's warnings instead),
    and one of them alone is read."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    message = ("liger_swiglu: Axolotl refuses this config (integrations/liger/args.py LigerArgs.check_deprecated_swiglu, the Liger plugin listed: "
               "\"You cannot have both `liger_swiglu` and `liger_glu_activation` set.\")")
    for values in (("true", "true"), ("false", "true")):
        both = tmp_path / "both.yml"
        both.write_text(AXOLOTL + PLUGIN + f"liger_swiglu: {values[0]}\nliger_glu_activation: {values[1]}\n")
        entry, out = figures(both, "--device", "H100-80GB")
        assert out.returncode == 1 and entry["footprint"] is None
        assert [(d["code"], d["message"], d["range"]["start"]) for d in entry["diagnostics"]] == [("native-config", message, {"line": 9, "character": 0})]
    unlisted = tmp_path / "unlisted.yml"
    unlisted.write_text(AXOLOTL + "liger_swiglu: true\nliger_glu_activation: true\n")
    entry, out = figures(unlisted, "--device", "H100-80GB")
    assert out.returncode == 0 and not [d for d in entry["diagnostics"] if d["severity"] == "error"]
    alone = tmp_path / "alone.yml"
    alone.write_text(AXOLOTL + PLUGIN + "liger_swiglu: true\n")
    assert same_figures_as_converted(alone, "--device", "H100-80GB")["doc"]["training"]["liger_kernels"] == ["swiglu"]


def test_axolotl_refuses_liger_kernels_its_validators_refuse(tmp_path):
    """LigerArgs' other validators (axolotl 067b021 integrations/liger/args.py, the plugin listed): liger_glu_activation
    with tiled_mlp unless tiled_mlp_use_original_mlp (check_tiled_mlp_conflict), liger_rms_norm or Liger's fused loss
    under tensor_parallel_size > 1 (check_liger_rms_norm_tensor_parallel, check_tensor_parallel_size_liger_fused_linear_
    cross_entropy): an error at the key quoting Axolotl, exit 1, no figure; the original-MLP switch lets it through."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    cases = {
        "tiled.yml": ("liger_glu_activation: true\ntiled_mlp: true\n", "tiled_mlp", "check_tiled_mlp_conflict",
                      "You cannot have both `liger_glu_activation` and `tiled_mlp` set without `tiled_mlp_use_original_mlp: true`."),
        "scaling.yml": ("liger_use_token_scaling: true\n", "liger_use_token_scaling", "check_liger_use_token_scaling_flce",
                        "`liger_use_token_scaling: true` requires `liger_fused_linear_cross_entropy` enabled."),
        "norm_tp.yml": ("liger_rms_norm: true\ntensor_parallel_size: 2\n", "liger_rms_norm", "check_liger_rms_norm_tensor_parallel",
                        "`liger_rms_norm` is incompatible with tensor parallelism, see https://github.com/linkedin/Liger-Kernel/issues/826"),
        "flce_tp.yml": ("liger_fused_linear_cross_entropy: true\ntensor_parallel_size: 2\n", "liger_fused_linear_cross_entropy",
                        "check_tensor_parallel_size_liger_fused_linear_cross_entropy", "Tensor parallelism is not compatible with liger losses."),
    }
    for name, (keys, key, validator, quoted) in cases.items():
        path = tmp_path / name
        path.write_text(AXOLOTL + PLUGIN + keys)
        entry, out = figures(path, "--device", "H100-80GB")
        errors = [d for d in entry["diagnostics"] if d["severity"] == "error"]
        line = (AXOLOTL + PLUGIN + keys).splitlines().index(next(row for row in keys.splitlines() if row.startswith(f"{key}:"))) + 1
        assert out.returncode == 1 and entry["footprint"] is None, entry["diagnostics"]
        assert [(d["code"], d["range"]["start"]["line"] + 1) for d in errors] == [("native-config", line)], errors
        assert validator in errors[0]["message"] and quoted in errors[0]["message"], errors[0]["message"]
    through = tmp_path / "through.yml"
    through.write_text(AXOLOTL + PLUGIN + "liger_glu_activation: true\ntiled_mlp: true\ntiled_mlp_use_original_mlp: true\n")
    entry, out = figures(through, "--device", "H100-80GB")
    assert out.returncode == 0 and not [d for d in entry["diagnostics"] if d["severity"] == "error"], entry["diagnostics"]
