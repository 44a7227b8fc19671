"""ledger/rewrites.py loads a technique's module only where the config's `training` section may switch it on (a
check of a plain config imports none but the one on by default): its table of each technique's keys is the module's
own KEYS, and no technique applies by a key that is not its own."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import yaml

from memfit.ledger import rewrites

ROOT = Path(__file__).resolve().parents[2]
# a value of each technique's key that switches it on
ON = {"checkpoint_every": 2, "checkpoint_offset": 1, "keep_gradients": True, "quantized_saves_input": True,
      "litgpt_qkv": True, "loss": {"kind": "chunked"}, "fused_loss": "liger", "optimizer_in_backward": True,
      "activation_offloading": True, "paged_optimizer": True, "previous_outputs_held": True, "outputs_dtype": "float32",
      "liger_kernels": ["rms_norm"], "second_loss": "log_probs"}


def test_the_table_is_every_technique_with_its_modules_keys():
    folder = ROOT / "src" / "memfit" / "ledger" / "techniques"
    assert sorted(rewrites.TECHNIQUES) == sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    for name, keys in rewrites.TECHNIQUES.items():
        assert tuple(import_module(f"memfit.ledger.techniques.{name}").KEYS) == keys, name
    assert set(ON) == {key for keys in rewrites.TECHNIQUES.values() for key in keys}


@pytest.mark.parametrize("name", list(rewrites.TECHNIQUES))
def test_a_technique_applies_by_its_own_keys_only(name):
    module = import_module(f"memfit.ledger.techniques.{name}")
    own = rewrites.TECHNIQUES[name]
    others = {key: value for key, value in ON.items() if key not in own}
    assert module.applies(others) is (name in rewrites.ON_BY_DEFAULT)
    assert module.applies({}) is (name in rewrites.ON_BY_DEFAULT)
    assert module.applies({**others, **{key: ON[key] for key in own}})
    assert [m.__name__.rsplit(".", 1)[1] for m in rewrites.modules(others)].count(name) == (name in rewrites.ON_BY_DEFAULT)


@pytest.mark.parametrize("training, loaded", [
    ({}, ["paged_optimizer"]),
    ({"keep_gradients": True}, ["keep_gradients", "paged_optimizer"]),
    ({"checkpoint_every": 2, "checkpointing": "full"}, ["paged_optimizer", "partial_checkpointing"]),
])
def test_a_check_loads_the_techniques_its_training_section_may_switch_on(tmp_path, training, loaded):
    doc = {"memfit": 1, "device": {"memory": "80 GB"}, "optimizer": "adamw",
           "model": {"transformer": {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
                                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}},
           "training": {"micro_batch": 1, "seq_len": 16, **training}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    probe = ("import sys\nfrom memfit.cli.main import main\nstatus = main(['check', sys.argv[1]])\n"
             "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('memfit.ledger.techniques.')), status)")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run.yaml")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stdout.strip().splitlines()[-1] == f"{loaded} 0", done.stdout + done.stderr
