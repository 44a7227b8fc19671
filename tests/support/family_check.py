"""A transformers family through the front door: its config.json beside a memfit config a user could write, run
by `memfit check --format json`; and the real class's parameter count on the meta device (no weights)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def run_check(tmp_path: Path, cfg: dict, memory: str = "1 TiB", precision: str | None = None, device_type: str = "cpu",
              sections: dict | None = None, **training) -> dict:
    """The file entry of `memfit check --format json` (AdamW, micro_batch 2 x 16 tokens unless `training` says
    otherwise; `sections`: further document keys, such as lora, quantization or another optimizer); the check must
    pass without a diagnostic. `device_type` cpu: the measurements these configs are compared with run on the CPU,
    under CPU autocast (memfit's default is cuda's)."""
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    doc = {"memfit": 1, "device": {"memory": memory, "type": device_type}, **({"precision": precision} if precision else {}),
           "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "training": {"micro_batch": 2, "seq_len": 16, **training}, **(sections or {})}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)["files"][0]
    assert result["diagnostics"] == []
    return result


def check_all(tmp_path: Path, cases: dict, device: dict | None = None) -> dict:
    """name -> (config.json dict, training section[, extra document keys]): one `memfit check --format json` over
    all their configs (AdamW on `device`, 1 TiB of memfit's default type unless given); name -> its file entry."""
    paths = []
    for name, (cfg, training, *extra) in cases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg, indent=2))
        doc = {"memfit": 1, "device": device or {"memory": "1 TiB"}, "optimizer": "adamw", **(extra[0] if extra else {}),
               "model": {"hf_config": f"{name}.json"}, "training": training}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(str(tmp_path / f"{name}.yaml"))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *paths], capture_output=True,
                          text=True, timeout=600, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return {Path(f["path"]).stem: f for f in json.loads(done.stdout)["files"]}


def fallback_disagreements(tmp_path: Path, cases: dict, device: dict | None = None) -> dict:
    """A family's activations against the traced fallback's on the same model (check_all's `cases`, each priced
    by its family: no diagnostic): name -> (family, fallback) where they differ by more than 5 %."""
    from memfit.models import traced

    files = check_all(tmp_path, cases, device)
    wrong = {}
    for name, (cfg, training, *_) in cases.items():
        assert files[name]["diagnostics"] == [], name   # a family: no trace
        family = files[name]["footprint"]["activations"]
        fallback = traced.measure(cfg, micro_batch=training["micro_batch"], seq_len=training["seq_len"],
                                  attention=training["attention"], checkpointing=training["checkpointing"]).peak
        if abs(family - fallback) > 0.05 * fallback:
            wrong[name] = (family, fallback)
    return wrong


def check_json(tmp_path: Path, cfg: dict, **training) -> dict:
    """The file entry of `memfit check --format json` on the config.json and an AdamW config of `training` on 1 TiB
    of memfit's default device type; a check that reports errors (exit 1) is returned too."""
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "model": {"hf_config": "config.json"},
           "training": training}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


def buffer_bytes(model) -> int:
    """The bytes of a model's registered buffers (model.buffers(), each tensor once): memfit counts them under
    `parameters` (models/buffers.py), as they sit on the device beside the weights."""
    seen, total = set(), 0
    for b in model.buffers():
        if id(b) not in seen:
            seen.add(id(b))
            total += b.numel() * b.element_size()
    return total


def meta_buffer_bytes(cfg: dict) -> int:
    """buffer_bytes of the class the config names, built on the meta device in fp32 (as meta_elements builds it)."""
    return buffer_bytes(_meta_model(cfg))


def _meta_model(cfg: dict):
    """The class the config names on the meta device: architectures[0], else AutoModelForCausalLM, else (an encoder
    without a causal LM: DeBERTa-v2) the class transformers' masked-LM Auto class builds."""
    import torch
    import transformers

    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **fields)
    architectures = cfg.get("architectures") or []
    with torch.device("meta"):
        if architectures:
            return getattr(transformers, architectures[0])(config)
        if type(config) not in transformers.AutoModelForCausalLM._model_mapping:
            return transformers.AutoModelForMaskedLM.from_config(config)
        return transformers.AutoModelForCausalLM.from_config(config)


def meta_elements(cfg: dict) -> int:
    """named_parameters()' element count of the class the config names (AutoModelForCausalLM when it names none)."""
    return sum(p.numel() for p in _meta_model(cfg).parameters())
