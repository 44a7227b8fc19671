"""Keep the measurement tables in docs/*.md what memfit and the references give.

A table of figures is preceded by a marker, an HTML comment (invisible on GitHub), that names its kind:

    <!-- memfit-docs table="peak-transformers" -->
    | family | optimizer | impl | checkpointing | batch x seq | MemTracker peak (B) | phase | memfit peak (B) | phase | diff |

Each row's key cells (the family, optimizer, sizes ...) say which run it is. Its other cells are of two kinds:

- memfit's figures: from running `memfit check --format json` on the config a user writes for that run (one CLI
  call for the whole table, through the front door, never memfit's functions);
- the reference figures: from the framework run on the CPU (PyTorch's MemTracker around a real step, DeepSpeed's
  own estimators), or the paper's formula written out here (Korthikanti et al. 2022, Table 2) — never from memfit.

and the derived cells (the difference) follow from both.

    python tools/doc_tables.py            # rewrite memfit's cells and the differences from the program
    python tools/doc_tables.py --measure  # also rerun the references (the frameworks; minutes)
    python tools/doc_tables.py --check    # print the differences, exit 1 if any (memfit's cells and the differences)

`python tools/sync_docs.py` rewrites these tables too (memfit's cells). The tests hold both kinds: tests/project/
test_docs.py reruns memfit's cells of every table (`check`); the tests that run the reference (tests/ledger/test_peak.py
MemTracker, tests/placement/test_deepspeed_configs.py DeepSpeed, tests/ledger/test_korthikanti_configs.py the paper,
tests/models/test_transformers_activations.py autograd's saved bytes for docs/transformers.md)
assert each documented reference figure exactly, through `documented(...)`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = ROOT / "tests" / "support"
MARKER = re.compile(r'^<!-- memfit-docs table="(?P<name>[\w-]+)"(?P<attrs>(?: [\w-]+="[^"]*")*) -->[ \t]*$')
ATTR = re.compile(r'([\w-]+)="([^"]*)"')


class TableError(Exception):
    pass


def _support():
    if str(SUPPORT) not in sys.path:
        sys.path.insert(0, str(SUPPORT))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def row_line(values: list[str]) -> str:
    return "| " + " | ".join(values) + " |"


def n(text: str) -> int:
    return int(text.replace(",", ""))


def commas(value: int) -> str:
    return f"{value:,}"


# --- running memfit through its CLI -------------------------------------------------------------------------
def memfit_json(configs: list[dict], extra_files: list[dict[str, str]] | None = None) -> list[dict]:
    """`memfit check --format json` on each config (a YAML document as a user writes it; files beside it, such
    as a model's config.json, named in extra_files[i]); one CLI call for all of them. The file entries, in order."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="memfit-tables-") as tmp:
        paths = []
        for i, doc in enumerate(configs):
            folder = Path(tmp) / f"r{i}"
            folder.mkdir()
            for name, text in ((extra_files or [{}] * len(configs))[i] or {}).items():
                (folder / name).write_text(text, encoding="utf-8")
            path = folder / "run.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            paths.append(str(path))
        done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *paths], capture_output=True, text=True,
                              timeout=600, check=False, env=env)
        try:
            files = json.loads(done.stdout)["files"]
        except ValueError:
            raise TableError(f"memfit check failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}") from None
    by_path = {e["path"]: e for e in files}
    return [by_path[p] for p in paths]


# --- docs/peak.md: a training step's peak against PyTorch's MemTracker ----------------------------------------
KERAS_MODELS = {"seed CNN": ("seed", 32), "MLP": ("mlp", 8), "encoder": ("encoder", 4)}


def _keras_model(cell: str):
    _support()
    import keras_reference as tf

    for name, (case, batch) in KERAS_MODELS.items():
        if cell == name or cell.startswith(name + " ("):
            shape, layers = tf.SEED if case == "seed" else tf.CASES[case]
            return shape, layers, batch
    raise TableError(f"peak-keras: no model {cell!r} (one of {sorted(KERAS_MODELS)})")


def _optimizer(cell: str) -> str:
    return "adamw" if cell == "adam/adamw" else cell


def _impl(cell: str) -> str:
    return "foreach" if cell == "any" else cell


class PeakTable:
    """Columns: key cells, MemTracker peak (B), phase, memfit peak (B), phase, diff."""

    keys: int
    places: int

    def run(self, key: list[str]) -> dict:
        raise NotImplementedError

    def config(self, run: dict) -> tuple[dict, dict[str, str]]:
        raise NotImplementedError

    def measure(self, run: dict) -> dict:
        raise NotImplementedError

    def render(self, rows: list[list[str]], measure: bool) -> list[list[str]]:
        k = self.keys
        runs = [self.run(r[:k]) for r in rows]
        made = [self.config(run) for run in runs]
        entries = memfit_json([m[0] for m in made], [m[1] for m in made])
        out = []
        for row, run, entry in zip(rows, runs, entries):
            if entry.get("peak") is None:
                raise TableError(f"no peak for {row[:k]}: {entry.get('diagnostics')}")
            if measure:
                theirs = self.measure(run)
                ref = (commas(theirs["bytes"]), theirs["phase"])
            else:
                ref = (row[k], row[k + 1])
            ours = entry["peak"]["bytes"]
            diff = f"{(ours - n(ref[0])) / n(ref[0]) * 100:+.{self.places}f}%"
            out.append([*row[:k], ref[0], ref[1], commas(ours), entry["peak"]["phase"], diff])
        return out


class PeakKeras(PeakTable):
    """docs/peak.md: the Keras-form models (tests/support/keras_reference.py) in plain PyTorch."""

    keys, places = 3, 2

    def run(self, key):
        shape, layers, batch = _keras_model(key[0])
        return {"input_shape": shape, "layers": layers, "batch": batch, "optimizer": _optimizer(key[1]), "impl": _impl(key[2])}

    def config(self, run):
        return ({"memfit": 1, "optimizer": run["optimizer"], "device": {"memory": "1 TiB"}, "training": {"optimizer_impl": run["impl"]},
                 "model": {"input_shape": run["input_shape"], "batch_size": run["batch"], "layers": run["layers"]}}, {})

    def measure(self, run):
        _support()
        import peak_reference as ref

        return ref.measure_keras(run["input_shape"], run["layers"], run["batch"], run["optimizer"], run["impl"])


class PeakTransformers(PeakTable):
    """docs/peak.md: tiny transformers models (tests/support/hf_measure.py), attention dropout off, sdpa."""

    keys, places = 5, 1

    def run(self, key):
        family, optimizer, impl, checkpointing, size = key
        micro_batch, seq_len = (int(x) for x in size.split("x"))
        return {"family": family, "optimizer": optimizer, "impl": impl, "checkpointing": checkpointing, "micro_batch": micro_batch,
                "seq_len": seq_len, "precision": "32-true"}

    @staticmethod
    def model_config(family: str) -> dict:
        _support()
        import hf_measure

        return hf_measure.without_attention_dropout(hf_measure.tiny(family))

    def config(self, run):
        doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": run["optimizer"], "precision": run["precision"],
               "model": {"hf_config": "config.json"},
               "training": {"micro_batch": run["micro_batch"], "seq_len": run["seq_len"], "checkpointing": run["checkpointing"],
                            "optimizer_impl": run["impl"], "attention": "sdpa"}}
        return doc, {"config.json": json.dumps(self.model_config(run["family"]))}

    def measure(self, run):
        _support()
        import peak_reference as ref

        return ref.measure_hf(self.model_config(run["family"]), micro_batch=run["micro_batch"], seq_len=run["seq_len"], optimizer=run["optimizer"],
                              impl=run["impl"], checkpointing=run["checkpointing"], precision=run["precision"])


# --- docs/parallel.md: Korthikanti et al. 2022, Table 2 ----------------------------------------------------
class Korthikanti:
    """One transformer layer's activation bytes per tensor-parallel rank, at the sizes the marker gives (s, b, h, a, t):
    the paper's Table 2 formula (written out here, 16-bit activations) against memfit's per-layer figure, the
    difference of `memfit check` on a GPT-2 config.json with 3 and with 2 layers."""

    def __init__(self, s, b, h, a, t):
        self.s, self.b, self.h, self.a, self.t = (int(x) for x in (s, b, h, a, t))

    def paper(self, recompute: str, sp: bool) -> int:
        """Table 2 (bytes per layer, 16-bit activations): sbh(10 + 24/t + 5as/(ht)) and its columns."""
        s, b, h, a, t = self.s, self.b, self.h, self.a, self.t
        sbh = s * b * h
        value = {
            ("none", False): sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)),
            ("none", True): sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t)),
            ("selective", False): sbh * (10 + Fraction(24, t)),
            ("selective", True): sbh * Fraction(34, t),
            ("full", False): Fraction(2 * sbh),
        }[recompute, sp]
        if value.denominator != 1:
            raise TableError(f"Table 2 is not a whole number of bytes at {recompute}, sp={sp}: {value}")
        return int(value)

    def config(self, layers: int, recompute: str, sp: bool) -> tuple[dict, dict[str, str]]:
        model = {"model_type": "gpt2", "n_embd": self.h, "n_head": self.a, "n_layer": layers, "n_positions": self.s, "vocab_size": 50257,
                 "activation_function": "gelu", "use_cache": False, "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
        doc = {"memfit": 1, "device": {"memory": "100 TiB"}, "optimizer": "adamw", "dtypes": {"activations": "bfloat16"},
               "model": {"hf_config": "config.json"},
               "training": {"micro_batch": self.b, "seq_len": self.s, "attention": "eager", "checkpointing": recompute}}
        if self.t > 1:
            doc["parallel"] = {"tensor": self.t, "sequence_parallel": sp, "gpus_per_node": 8}
        return doc, {"config.json": json.dumps(model)}

    def render(self, rows, measure):
        keys = [(r[0], r[1] == "yes") for r in rows]
        made = [self.config(layers, rc, sp) for rc, sp in keys for layers in (2, 3)]
        entries = memfit_json([m[0] for m in made], [m[1] for m in made])
        out = []
        for i, (row, (recompute, sp)) in enumerate(zip(rows, keys)):
            two, three = entries[2 * i]["footprint"]["activations"], entries[2 * i + 1]["footprint"]["activations"]
            ours, paper = three - two, self.paper(recompute, sp)
            diff = "0" if ours == paper else f"{(ours - paper) / paper * 100:+.3f} %"
            out.append([row[0], row[1], row[2], commas(paper), commas(ours), diff])
        return out


# --- docs/parallel.md: DeepSpeed's ZeRO estimators ---------------------------------------------------------
DEEPSPEED_RECIPE = {"precision": "16-true", "master_weights": "float32", "training": {"grad_accum_dtype": "float32"}}


def deepspeed_models() -> dict:
    return {"docs' t5-3b": "docs-t5-3b", "T5ForConditionalGeneration": "t5-3b", "LlamaForCausalLM": "llama-7b"}


_SHAPES: dict = {}


def model_shapes(kind: str) -> tuple[list[tuple[str, list[int]]], int, int]:
    """(named parameter shapes, parameters, the largest module's own parameters): DeepSpeed's memory.rst case
    (2,851M parameters, 32M in the largest layer: 89 modules of 32M and one of 3M), or a real transformers model
    built on the meta device, as DeepSpeed's model_to_params counts it."""
    if kind in _SHAPES:
        return _SHAPES[kind]
    if kind == "docs-t5-3b":
        shapes = [(f"block.{i}.w.weight", [32_000_000]) for i in range(89)] + [("final.weight", [3_000_000])]
        _SHAPES[kind] = (shapes, 2_851_000_000, 32_000_000)
        return _SHAPES[kind]
    import torch
    import transformers

    if kind == "t5-3b":
        config = transformers.T5Config(d_model=1024, d_ff=16384, num_layers=24, num_heads=32, d_kv=128, vocab_size=32128)
        cls = transformers.T5ForConditionalGeneration
    else:  # a Llama-2-7B-shaped decoder
        config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000)
        cls = transformers.LlamaForCausalLM
    with torch.device("meta"):
        model = cls(config)
    shapes = [(name, list(p.shape)) for name, p in model.named_parameters()]
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    _SHAPES[kind] = (shapes, total, largest)
    return _SHAPES[kind]


class DeepSpeedTable:
    """Columns: model (P, largest layer) and nodes x GPUs, ZeRO, offload, DeepSpeed GPU bytes, memfit's model states,
    difference. "same" repeats the model (and the cluster unless the cell gives one)."""

    def runs(self, rows):
        model, cluster, out = None, None, []
        for row in rows:
            text = row[0]
            for name, kind in deepspeed_models().items():
                if text.startswith(name):
                    model = kind
            if model is None:
                raise TableError(f"deepspeed: no model in {text!r}")
            m = re.search(r"(\d+) x (\d+)(?: GPUs)?$", text)
            if m:
                cluster = (int(m.group(1)), int(m.group(2)))
            offload = row[2]
            out.append({"model": model, "nodes": cluster[0], "gpus": cluster[1], "zero": int(row[1]),
                        "optimizer": "optimizer" in offload, "parameters": "parameters" in offload})
        return out

    def config(self, run) -> tuple[dict, dict]:
        shapes, _, _ = model_shapes(run["model"])
        doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "host": {"memory": "100 TiB"}, "optimizer": "adamw", **json.loads(json.dumps(DEEPSPEED_RECIPE))}
        doc["parameters"] = [{"name": name, "shape": shape} for name, shape in shapes]
        parallel = {"data": run["gpus"] * run["nodes"], "zero": run["zero"], "gpus_per_node": run["gpus"]}
        offload = {k: "cpu" for k in ("optimizer", "parameters") if run[k]}
        if offload:
            parallel["offload"] = offload
        doc["parallel"] = parallel
        return doc, {}

    @staticmethod
    def measure(run) -> int:
        """DeepSpeed 0.19.8's estimate_zero2/3_model_states_mem_needs, the GPU figure."""
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from deepspeed.runtime.zero import stage3, stage_1_and_2
        _, total, largest = model_shapes(run["model"])
        if run["zero"] == 3:
            return stage3.estimate_zero3_model_states_mem_needs(total, largest, run["gpus"], run["nodes"], cpu_offload=run["optimizer"],
                                                               cpu_offload_params=run["parameters"])[1]
        return stage_1_and_2.estimate_zero2_model_states_mem_needs(total, run["gpus"], run["nodes"], cpu_offload=run["optimizer"])[1]

    def render(self, rows, measure):
        runs = self.runs(rows)
        made = [self.config(run) for run in runs]
        entries = memfit_json([m[0] for m in made], [m[1] for m in made])
        out = []
        for row, run, entry in zip(rows, runs, entries):
            theirs = self.measure(run) if measure else n(row[3])
            # the estimators count model states: ZeRO-2's are the footprint (its peak adds the step's flattened
            # gradient copy, tests/placement/test_zero12_gradients.py), ZeRO-3's the peak (the gathered module)
            ours = entry["peak"]["bytes"] if run["zero"] == 3 else entry["footprint"]["total"]
            note = re.search(r" \(.*\)$", row[5])
            diff = "0" if ours == theirs else f"{ours - theirs:+,} B" + (note.group(0) if note else "")
            out.append([*row[:3], commas(theirs), commas(ours), diff])
        return out


# --- docs/transformers.md: saved activation bytes against autograd's in a real step ---------------------------
class ActivationRatios:
    """One row per family and attention kernel (tests/support/hf_measure.py's tiny models, 32-true, no
    checkpointing; sdpa with attention dropout off): the bytes autograd saves in one forward + backward on the CPU
    (hf_measure.measure, saved_tensors_hooks) and memfit's activations (`memfit check --format json`'s
    footprint.activations) at b x s = 2 x 16 and 1 x 40, and memfit / autograd, lowest–highest, 4 decimals (the
    precision of the family table's ratio column). tests/models/test_transformers_activations.py measures each."""

    SIZES = ((2, 16), (1, 40))

    @staticmethod
    def model_config(family: str, attention: str) -> dict:
        _support()
        import hf_measure

        cfg = hf_measure.tiny(family)
        return hf_measure.without_attention_dropout(cfg) if attention == "sdpa" else cfg

    def config(self, family: str, attention: str, micro_batch: int, seq_len: int) -> tuple[dict, dict[str, str]]:
        doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": "32-true", "model": {"hf_config": "config.json"},
               "training": {"micro_batch": micro_batch, "seq_len": seq_len, "attention": attention, "checkpointing": "none"}}
        return doc, {"config.json": json.dumps(self.model_config(family, attention))}

    def measure(self, family: str, attention: str) -> list[int]:
        _support()
        import hf_measure

        cfg = self.model_config(family, attention)
        model = hf_measure.build(cfg, attention)
        return [hf_measure.measure(cfg, micro_batch=b, seq_len=s, attention=attention, model=model)["total"] for b, s in self.SIZES]

    def render(self, rows, measure):
        keys = [(r[0].strip("`"), r[1]) for r in rows]
        made = [self.config(family, attention, b, s) for family, attention in keys for b, s in self.SIZES]
        entries = memfit_json([m[0] for m in made], [m[1] for m in made])
        out = []
        for i, (row, (family, attention)) in enumerate(zip(rows, keys)):
            theirs = self.measure(family, attention) if measure else [n(row[2]), n(row[4])]
            ours = []
            for entry in entries[2 * i:2 * i + 2]:
                if entry.get("footprint") is None:
                    raise TableError(f"no footprint for {family} {attention}: {entry.get('diagnostics')}")
                ours.append(entry["footprint"]["activations"])
            ratios = sorted(round(o / t, 4) for o, t in zip(ours, theirs))
            out.append([row[0], row[1], commas(theirs[0]), commas(ours[0]), commas(theirs[1]), commas(ours[1]),
                        f"{ratios[0]:.4f}–{ratios[-1]:.4f}"])
        return out


# --- docs/accuracy.md: adapters as peft keeps them -----------------------------------------------------------
class AdapterTable:
    """Columns: setup, figure, memfit, reference, ratio (3 decimals). A tiny Llama (tests/support/hf_measure.py,
    attention dropout off), LoRA r 8 on all linears, 2 x 32 tokens, sdpa, AdamW foreach. The setup cell names the
    run; "same" repeats the run above, "same, X" changes X in it. The references: the trainable bytes of peft's
    model (gradients), a real AdamW step's moments (optimizer state), the peak of what autograd saves (saved
    activations); tests/recipe/test_adapters_as_kept.py asserts each documented reference."""

    LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
    NF4 = {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    SETUPS = {
        "bf16 model, peft default (`autocast_adapter_dtype=True`: fp32 adapters)": {"precision": "bf16-true"},
        "bf16 model, `autocast_adapter_dtype=False` (`lora.dtype: model`: bf16 adapters)": {"precision": "bf16-true", "bf16_adapters": True},
        "fp32 model, LoRA": {"precision": "32-true"},
        "fp32 model, DoRA (`use_dora`)": {"precision": "32-true", "dora": True},
        "fp32 model, DoRA, full checkpointing": {"precision": "32-true", "dora": True, "checkpointing": "full"},
        "bf16 model (`bf16-true`), DoRA, fp32 adapters": {"precision": "bf16-true", "dora": True},
        "bf16 model, DoRA, bf16 adapters": {"precision": "bf16-true", "dora": True, "bf16_adapters": True},
        "fp32 model under bf16 autocast (`bf16-mixed`), DoRA": {"precision": "bf16-mixed", "dora": True},
        "4-bit nf4 base (bitsandbytes, bf16 compute) on bf16, `autocast_adapter_dtype=False` (bf16 adapters)":
            {"precision": "bf16-true", "nf4": True, "bf16_adapters": True},
        "4-bit nf4 base (bitsandbytes, bf16 compute), DoRA": {"precision": "bf16-true", "nf4": True, "dora": True},
    }
    CHANGES = {"`lora_dropout` 0.1": {"dropout": 0.1}, "full checkpointing": {"checkpointing": "full"}, "on an fp32 base": {"precision": "32-true"}}
    FIGURES = {"gradients": "gradients", "gradients (adapters and magnitudes)": "gradients", "optimizer state": "optimizer_state",
               "saved activations": "activations"}

    def runs(self, rows) -> list[dict]:
        run, out = None, []
        for row in rows:
            setup = row[0]
            if setup in self.SETUPS:
                run = dict(self.SETUPS[setup])
            elif setup == "same" and run is not None:
                pass
            elif setup.startswith("same") and run is not None and setup[4:].lstrip(", ") in self.CHANGES:
                run = {**run, **self.CHANGES[setup[4:].lstrip(", ")]}
            else:
                raise TableError(f"adapters: no run for the setup {setup!r}")
            if row[1] not in self.FIGURES:
                raise TableError(f"adapters: no figure {row[1]!r} (one of {sorted(self.FIGURES)})")
            out.append(dict(run))
        return out

    def lora(self, run) -> dict:
        lora = dict(self.LORA, dropout=run.get("dropout", 0.0))
        if run.get("dora"):
            lora["use_dora"] = True
        if run.get("bf16_adapters"):
            lora["autocast_adapter_dtype"] = False
        return lora

    @staticmethod
    def model_config() -> dict:
        _support()
        import hf_measure

        return hf_measure.without_attention_dropout(hf_measure.tiny("llama"))

    def config(self, run) -> tuple[dict, dict[str, str]]:
        doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": run["precision"], "model": {"hf_config": "config.json"},
               "training": {"micro_batch": 2, "seq_len": 32, "attention": "sdpa", "checkpointing": run.get("checkpointing", "none"),
                            "optimizer_impl": "foreach"},
               "lora": self.lora(run)}
        if run.get("nf4"):
            doc["quantization"] = dict(self.NF4)
        return doc, {"config.json": json.dumps(self.model_config())}

    def measure(self, run, figure: str) -> int:
        _support()
        import hf_measure
        import torch

        cfg, quantization = self.model_config(), (dict(self.NF4) if run.get("nf4") else None)
        if figure == "activations":
            return hf_measure.measure(cfg, micro_batch=2, seq_len=32, checkpointing=run.get("checkpointing", "none"), precision=run["precision"],
                                      lora=self.lora(run), quantization=quantization)["peak"]
        model = hf_measure.build(cfg, "sdpa", run["precision"], self.lora(run), quantization=quantization)
        params = [p for p in model.parameters() if p.requires_grad]
        if figure == "gradients":
            return sum(p.numel() * p.element_size() for p in params)
        opt = torch.optim.AdamW(params, foreach=True)
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        return sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")

    def render(self, rows, measure):
        runs = self.runs(rows)
        made = [self.config(run) for run in runs]
        entries = memfit_json([m[0] for m in made], [m[1] for m in made])
        out = []
        for row, run, entry in zip(rows, runs, entries):
            if entry.get("footprint") is None:
                raise TableError(f"adapters: no footprint for {row[0]!r}: {entry.get('diagnostics')}")
            figure = self.FIGURES[row[1]]
            ours = entry["footprint"][figure]
            theirs = self.measure(run, figure) if measure else n(row[3])
            out.append([row[0], row[1], commas(ours), commas(theirs), f"{ours / theirs:.3f}"])
        return out


# --- docs/accuracy.md: DoRA's gated peak against MemTracker ------------------------------------------------
class DoraPeakTable:
    """Columns: setup, memfit peak, MemTracker, ratio (memfit over MemTracker, 3 decimals). memfit's cells from one
    `memfit check` call; MemTracker's is the peak of one warm step without its module tracker, Python's cyclic
    collector off (tests/support/peak_reference.py unhooked_step: the tracker's module hooks make reference cycles
    that keep DoRA's identity products until a collection, docs/accuracy.md), rerun with --measure;
    tests/ledger/test_dora_peak.py measures every row."""

    LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", "use_dora": True}
    NF4 = {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    WIDE = {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 4}
    SETUPS = {
        "tiny Llama, 32-true, micro-batch 2, sequence 32, DoRA all-linear": {"wide": False, "precision": "32-true", "b": 2, "s": 32},
        "wide Llama (hidden 512, intermediate 2048), 32-true, 1 × 16 tokens": {"wide": True, "precision": "32-true", "b": 1, "s": 16},
        "same, bf16-true (fp32 adapters)": {"wide": True, "precision": "bf16-true", "b": 1, "s": 16},
        "same, 4-bit nf4 base (bitsandbytes, bf16 compute: QDoRA)": {"wide": True, "precision": "bf16-true", "b": 1, "s": 16, "nf4": True},
        "tiny Llama, bf16-true, 2 × 32": {"wide": False, "precision": "bf16-true", "b": 2, "s": 32},
    }

    def config(self, run) -> tuple[dict, dict[str, str]]:
        _support()
        import hf_measure

        cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
        if run["wide"]:
            cfg = dict(cfg, **self.WIDE)
        doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": run["precision"], "model": {"hf_config": "config.json"},
               "lora": dict(self.LORA),
               "training": {"micro_batch": run["b"], "seq_len": run["s"], "attention": "sdpa", "checkpointing": "none", "optimizer_impl": "foreach"}}
        if run.get("nf4"):
            doc["quantization"] = dict(self.NF4)
        return doc, {"config.json": json.dumps(cfg)}

    def render(self, rows, measure):
        for row in rows:
            if row[0] not in self.SETUPS:
                raise TableError(f"dora-peak: no run for the setup {row[0]!r}")
        made = [self.config(self.SETUPS[row[0]]) for row in rows]
        entries = memfit_json([m[0] for m in made], [m[1] for m in made])
        out = []
        for row, entry in zip(rows, entries):
            if entry.get("peak") is None:
                raise TableError(f"dora-peak: no peak for {row[0]!r}: {entry.get('diagnostics')}")
            ours = entry["peak"]["bytes"]
            theirs = self.measure(self.SETUPS[row[0]])["bytes"] if measure else n(row[2])
            out.append([row[0], commas(ours), commas(theirs), f"{ours / theirs:.3f}"])
        return out

    def measure(self, run, collector: bool = False) -> dict:
        """MemTracker's peak of the run's warm step without its module tracker: {"bytes", "phase"}."""
        _support()
        import hf_measure
        import peak_reference as ref
        import torch

        doc, files = self.config(run)
        cfg = json.loads(files["config.json"])
        model = hf_measure.build(cfg, "sdpa", run["precision"], doc["lora"], quantization=doc.get("quantization"))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
        batch = hf_measure.inputs(cfg, run["b"], run["s"])
        return ref.unhooked_step(model, opt, batch["input_ids"], batch["labels"], collector=collector)


# --- docs/accuracy.md: published GPU measurements, as config files ------------------------------------------
PUBLISHED = SUPPORT / "published"
GIB = 1 << 30


def memfit_files(paths: list[Path]) -> list[dict]:
    """`memfit check --format json` on config files as they are (native configs; the settings beside them, such as
    tests/support/published/memfit.toml's devices, apply as they do for a user), one CLI call, in their folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    folder = paths[0].parent
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *[p.name for p in paths]], capture_output=True, text=True,
                          timeout=600, check=False, env=env, cwd=folder)
    try:
        files = json.loads(done.stdout)["files"]
    except ValueError:
        raise TableError(f"memfit check failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}") from None
    by_path = {e["path"]: e for e in files}
    return [by_path[p.name] for p in paths]


class PublishedTable:
    """Columns: row (the source's words), config (a file in tests/support/published/, its header cites the source
    and commit), published (GiB, MiB or GB as the source computes it: nvidia-smi's "MB" is MiB, Lit-GPT's "GB" 10^9 bytes), memfit peak (B), memfit (GiB), ratio (memfit / published, 3 decimals),
    gate (memfit's verdict on the device the row ran on: tests/support/published/memfit.toml). The published cells are
    the source's and stay as written; memfit's cells come from one `memfit check` call on the files."""

    def render(self, rows, measure):
        paths = []
        for row in rows:
            m = re.fullmatch(r"\[`([\w.-]+)`\]\([^)]*\)", row[1])
            if not m or not (PUBLISHED / m[1]).is_file():
                raise TableError(f"published: no config file in {row[1]!r} (a link to tests/support/published/<file>)")
            paths.append(PUBLISHED / m[1])
        entries = memfit_files(paths)
        out = []
        for row, entry in zip(rows, entries):
            peak = entry.get("peak")
            if not peak:
                raise TableError(f"published: no peak for {row[1]}: {entry.get('diagnostics')}")
            m = re.fullmatch(r"([\d.]+) (GiB|MiB|GB)", row[2])
            if not m:
                raise TableError(f"published: {row[2]!r} is not a figure in GiB, MiB or GB")
            theirs = Fraction(m[1]) * {"GiB": GIB, "MiB": 1 << 20, "GB": 10**9}[m[2]]
            ours = peak["bytes"]
            gate = "exceeds" if any(d["code"] == "budget-exceeded" for d in entry["diagnostics"]) else "fits"
            out.append([row[0], row[1], row[2], commas(ours), f"{ours / GIB:.2f}", f"{float(ours / theirs):.3f}", gate])
        return out


# --- the tables, found in the pages -------------------------------------------------------------------------
def table(name: str, attrs: dict[str, str]):
    if name == "peak-keras":
        return PeakKeras()
    if name == "peak-transformers":
        return PeakTransformers()
    if name == "korthikanti":
        return Korthikanti(**attrs)
    if name == "deepspeed":
        return DeepSpeedTable()
    if name == "activation-ratios":
        return ActivationRatios()
    if name == "adapters":
        return AdapterTable()
    if name == "dora-peak":
        return DoraPeakTable()
    if name == "published":
        return PublishedTable()
    raise TableError(f"no table kind {name!r}")


def found(text: str) -> list[tuple[int, str, dict[str, str], int, int]]:
    """(marker line index, name, attributes, first row index, end index) of every marked table."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        start = i + 3  # the header and the |---| line
        if not (i + 2 < len(lines) and lines[i + 1].startswith("|") and lines[i + 2].startswith("|-")):
            raise TableError(f"line {i + 1}: a table marker must be followed by a Markdown table")
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        out.append((i, m["name"], dict(ATTR.findall(m["attrs"])), start, end))
    return out


def documented(page: str, name: str, **attrs) -> list[list[str]]:
    """The cells of the rows of the table `name` on `page` (docs/peak.md ...), for the tests that run the reference;
    with attrs, the table whose marker has them."""
    text = (ROOT / page).read_text(encoding="utf-8")
    lines = text.split("\n")
    for _, kind, given, start, end in found(text):
        if kind == name and all(given.get(k) == str(v) for k, v in attrs.items()):
            return [cells(line) for line in lines[start:end]]
    raise TableError(f"{page}: no table {name!r} {attrs}")


def refresh_text(text: str, measure: bool = False) -> str:
    lines = text.split("\n")
    for _, name, attrs, start, end in reversed(found(text)):
        rows = [cells(line) for line in lines[start:end]]
        lines[start:end] = [row_line(r) for r in table(name, attrs).render(rows, measure)]
    return "\n".join(lines)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def diff(page: Path, old: str, new: str) -> str:
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{name} (the page)", f"{name} (the program)"))


def check(paths: list[Path] | None = None) -> str:
    """The differences between the pages' tables and what memfit prints now (empty when none)."""
    out = []
    for page in paths or pages():
        old = page.read_text(encoding="utf-8")
        if "memfit-docs table=" not in old:
            continue
        out.append(diff(page, old, refresh_text(old)))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="print the differences and exit 1 if any; change nothing")
    parser.add_argument("--measure", action="store_true", help="also rerun the reference figures (the frameworks on the CPU)")
    parser.add_argument("pages", nargs="*", type=Path, help="pages (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    stale = 0
    for page in [p.resolve() for p in args.pages] or pages():
        old = page.read_text(encoding="utf-8")
        if "memfit-docs table=" not in old:
            continue
        try:
            new = refresh_text(old, measure=args.measure)
        except TableError as exc:
            print(f"doc_tables: {page.name}: {exc}", file=sys.stderr)
            return 2
        if new == old:
            continue
        stale += 1
        if args.check:
            sys.stdout.write(diff(page, old, new))
        else:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
