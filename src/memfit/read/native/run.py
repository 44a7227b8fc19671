"""What every format does around its own keys: the model behind a name, a referenced DeepSpeed
JSON, the launch config, the world size and the device from the settings."""

from __future__ import annotations

import os

from memfit.diagnostics import codes
from memfit.read.inputs import read as read_file
from memfit.read.native import resolve
from memfit.read.native.base import At, Found, Native, Reader, model_value
from memfit.read.native.settings import Settings
from memfit.read.native.settings import shown as settings_shown



class Context:
    def __init__(self, r: Reader, path: str, conf: Settings) -> None:
        self.r, self.path, self.conf = r, path, conf
        self.base = os.path.dirname(path) if path and not path.startswith("<") else "."
        self.model_config: dict | None = None
        self.launch: dict = {}
        self.ds_from_launch = None
        self.model_source: dict | None = None  # provenance's "model"

    # --- the model ------------------------------------------------------------------------
    def model(self, name, at: At) -> dict | None:
        """Resolve a model name to its config.json and set model.hf_config; its raw keys."""
        if not isinstance(name, str) or not name.strip():
            if not any(found.at.path == at.path and found.at.file == at.file for found in self.r.native.found):  # not a wrong type, said already
                self.r.error(at, codes.MODEL_NOT_FOUND, "no model: the config names none (memfit needs its config.json for the shapes)")
            return None
        models = self.conf.get("models") or {}
        found, looked = resolve.resolve(name, self.base, models, self.conf.base if self.conf.file else None)
        fetched = False
        if found is None and self.conf.online and "/" in name and not os.path.exists(os.path.join(self.base, name)):
            found, why = resolve.fetch(name)
            fetched = found is not None
            if found is None:
                looked.append(why)
        if found is None:
            hint = (
                f"add it to the settings' models table ([tool.memfit.models] \"{name}\" = \"path/to/config.json\" in pyproject.toml, or a memfit.toml), "
                "put its config.json in the Hugging Face cache, or name a local directory"
            )
            if resolve.hub_like(name) and not self.conf.online:
                hint += "; or pass --online to fetch its config.json alone from the Hub (nothing is fetched without it)"
            self.r.error(at, codes.MODEL_NOT_FOUND, f"model {name!r} not found; looked in {'; '.join(looked)}: {hint}")
            return None
        # relative to the checked file, as a memfit config names it, when the two share a directory
        # below the root (a repository's models/); absolute in the HF cache or elsewhere
        full = os.path.abspath(found)
        cached = any(full.startswith(os.path.abspath(cache) + os.sep) for cache in resolve.cache_dirs())
        shared = os.path.commonpath([full, os.path.abspath(self.base)]) != os.path.dirname(os.path.abspath(os.sep))
        target = os.path.relpath(full, os.path.abspath(self.base)) if shared and not cached else full
        self.r.set(("model", "hf_config"), target.replace(os.sep, "/") if not os.path.isabs(target) else target, at)
        self.r.native.files.append(full)
        source = "the Hugging Face Hub (--online)" if fetched else looked[-1].split(" (")[0]
        if source == "the settings' models table":
            source = f"the models table of {settings_shown(self.conf.file)}"
        self.model_source = {"name": name, "config": settings_shown(full), "from": source}
        if not fetched and source.startswith("a local path") and resolve.hub_like(name) and name not in models:
            self.r.error(
                at,
                codes.MODEL_SHADOWED,
                f"model {name!r} is read from the local folder {settings_shown(os.path.dirname(full) if full.endswith('config.json') else full)}, "
                f"which shadows the Hugging Face model {name!r}: the framework loads the local folder only when the run starts "
                "where that path exists, and the Hub's model otherwise (the figures may then be far off, either way); "
                f"write './{name}' to mean the folder, or map the name in the settings' models table",
            )
        import json

        text, problem, _ = read_file(found)
        try:
            raw = json.loads(text) if problem is None else None
        except (ValueError, RecursionError):  # too deeply nested for json: the pipeline says so, positioned in that file
            raw = None  # the pipeline reports an unreadable config.json, in that file
        self.model_config = raw if isinstance(raw, dict) else None
        return self.model_config

    @property
    def hidden_size(self) -> int | None:
        cfg = self.model_config or {}
        value = model_value(cfg, "hidden_size")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    # --- referenced files -----------------------------------------------------------------
    def load_json(self, ref: str, at: At, what: str, base: str | None = None) -> tuple[dict | None, str | None]:
        """A referenced JSON (or YAML) file's data and its path as the checked path is given."""
        from memfit.read import source

        # relative to the file that names it; the frameworks open it relative to where they run
        # (Axolotl: utils/config/__init__.py normalize_config, os.path.exists(cfg.deepspeed)), so
        # then the working directory and the project root (the settings file's directory)
        bases = [base if base is not None else self.base]
        if base is None and not os.path.isabs(os.path.expanduser(ref)):
            bases += [os.curdir] + ([self.conf.base] if self.conf.file else [])
        tried = []
        for directory in bases:
            file = os.path.join(directory, os.path.expanduser(ref))
            if os.path.normpath(os.path.abspath(file)) in tried:
                continue
            tried.append(os.path.normpath(os.path.abspath(file)))
            if not os.path.lexists(file):
                continue
            # regular files only, size-limited (inputs.read): a FIFO or /dev/zero named here never blocks
            text, problem, _ = read_file(file)
            if problem is not None:
                self.r.error(at, codes.MISSING_REFERENCE, f"{what} {ref!r}: {problem.message}")
                return None, None
            break
        else:
            self.r.error(at, codes.MISSING_REFERENCE, f"{what} {ref!r} not found; looked at {', '.join(tried)}")
            return None, None
        loaded = source.load(text)
        if loaded.data is None or loaded.diagnostics:
            d = loaded.diagnostics[0] if loaded.diagnostics else None
            message = d.message if d is not None else "the file is empty"
            self.r.native.found.append(Found(At((), file), codes.JSON_SYNTAX, f"{what}: {message}", range=d.range if d is not None else None))
            self.r.native.texts[file] = text
            self.r.native.refs[file] = at
            return None, None
        if not isinstance(loaded.data, dict):
            self.r.error(at, codes.NATIVE_CONFIG, f"{what} {ref!r} is not a mapping of keys")
            return None, None
        self.r.native.texts[file] = text
        self.r.native.refs[file] = at
        self.r.native.files.append(os.path.abspath(file))
        return loaded.data, file

    def deepspeed(self, value, at: At, trainer: dict) -> None:
        """A `deepspeed:` key: a JSON path (relative to the native file) or the config inline."""
        from memfit.read.native import deepspeed

        if isinstance(value, dict):
            _inline_ds(self.r, value, at, trainer, self.hidden_size)
            return
        if not isinstance(value, str):
            self.r.error(at, codes.NATIVE_CONFIG, "deepspeed takes the path of a DeepSpeed JSON (or its keys inline)")
            return
        data, file = self.load_json(value, at, "the DeepSpeed config")
        if data is not None:
            deepspeed.apply(self.r, data, file, trainer, self.hidden_size)

    # --- launch and world -------------------------------------------------------------------
    def read_launch(self) -> None:
        """The accelerate config the settings or --launch name."""
        from memfit.read.native import accelerate

        ref = self.conf.get("launch")
        if not ref:
            return
        base = os.getcwd() if "launch" in self.conf.cli else self.conf.base
        at = self.r.native.root
        data, file = self.load_json(ref, at, f"the launch config ({self.conf.where('launch')})", base=base)
        if data is not None:
            self.launch = accelerate.launch(self.r, data, file)
            if "ds_file" in self.launch and self.launch["ds_file"][0]:
                self.ds_from_launch = (self.launch["ds_file"][0], self.launch["ds_file"][1], os.path.dirname(file))

    def finish(self, trainer: dict | None = None) -> Native:
        """World size, sharding, device and host from the launch config and the settings."""
        r, conf, doc = self.r, self.conf, self.r.native.doc
        for at_range, message in conf.problems:
            r.native.found.append(Found(At((), conf.file), codes.NATIVE_CONFIG, message, range=at_range))
        if self.ds_from_launch and "zero" not in doc.get("parallel", {}):
            ref, at, base = self.ds_from_launch
            from memfit.read.native import deepspeed

            data, file = self.load_json(ref, at, "the DeepSpeed config (deepspeed_config_file)", base=base)
            if data is not None:
                deepspeed.apply(r, data, file, trainer or {}, self.hidden_size)
        launch = self.launch
        parallel = doc.get("parallel", {})
        if "zero" in launch and "zero" not in parallel and "fsdp" not in parallel:
            r.set(("parallel", "zero"), launch["zero"][0], launch["zero"][1])
        if "fsdp" in launch and "zero" not in doc.get("parallel", {}) and "fsdp" not in doc.get("parallel", {}):
            r.set(("parallel", "fsdp"), launch["fsdp"][0], launch["fsdp"][1])
            if "fsdp_version" in launch:
                r.set(("parallel", "fsdp_version"), launch["fsdp_version"][0], launch["fsdp_version"][1])
        for target, (value, at) in launch.get("offload", {}).items():
            if target not in doc.get("parallel", {}).get("offload", {}):
                r.set(("parallel", "offload", target), value, at)
        if "checkpointing" in launch and doc.get("training", {}).get("checkpointing", "none") == "none":
            r.set(("training", "checkpointing"), launch["checkpointing"][0], launch["checkpointing"][1])
        gpus, gpus_at = (conf.get("gpus"), None) if "gpus" in conf.cli else launch.get("gpus", (conf.get("gpus"), None))
        per_node, per_node_at = (conf.get("gpus_per_node"), None) if "gpus_per_node" in conf.cli else launch.get("gpus_per_node", (conf.get("gpus_per_node"), None))
        parallel = doc.get("parallel")
        if gpus is not None and gpus > 1 or parallel is not None:
            world = gpus or 1
            split = (parallel or {}).get("tensor", 1) * (parallel or {}).get("pipeline", 1)
            if world % split:
                r.error(r.native.root, codes.NATIVE_CONFIG, f"{world} GPUs ({conf.where('gpus')}) do not divide into tensor x pipeline = {split}")
            else:
                r.set(("parallel", "data"), world // split, gpus_at)
            if per_node is not None:
                r.set(("parallel", "gpus_per_node"), per_node, per_node_at)
            # plain data parallelism runs PyTorch DDP: its reducer's gradient buckets (a second copy of the gradients,
            # gradient_as_bucket_view being off under accelerate and the Trainer) are counted by placement/sharding.py
        _device(doc, conf)
        from memfit.read.native.settings import provenance

        r.native.provenance = provenance(conf, model=self.model_source)
        if not r.native.checkable:
            r.error(r.native.root, codes.MODEL_NOT_FOUND, r.native.uncheckable)
        elif "model" not in doc and not r.native.failed:
            r.error(r.native.root, codes.MODEL_NOT_FOUND, "no model: this config names none; give one with --model NAME or the settings' `model`")
        return r.native


def _inline_ds(r: Reader, value: dict, at: At, trainer: dict, hidden: int | None) -> None:
    """A DeepSpeed config written inline (a mapping under `deepspeed:`): keys under that path."""
    from memfit.read.native import deepspeed

    inner = Reader(r.native.format, value, r.path, r.file)
    inner.native = r.native
    prefix = at.path
    before = len(r.native.found)
    deepspeed.apply(inner, value, r.file, trainer, hidden)
    # the inline keys live under the `deepspeed` key of the checked file
    for found in r.native.found[before:]:
        if found.at.file == r.file:
            found.at = At(prefix + found.at.path, found.at.file, found.at.on_key)
    for key, origin in list(r.native.origins.items()):
        if origin.file == r.file and origin.path and origin.path[0] not in r.data:
            r.native.origins[key] = At(prefix + origin.path, origin.file, origin.on_key)


def _device(doc: dict, conf: Settings) -> None:
    device = {}
    if conf.get("device"):
        device["preset"] = conf.get("device")
    if conf.get("budget") is not None:
        device["memory"] = conf.get("budget")
    if conf.get("reserve") is not None:
        device["reserve"] = conf.get("reserve")
    if conf.get("overhead") is not None:
        device["overhead"] = conf.get("overhead")
    if device:
        doc["device"] = device
    if conf.get("host_memory") is not None:
        doc["host"] = {"memory": conf.get("host_memory")}


def memfit_defaults(data: dict, conf: Settings) -> tuple[dict, set]:
    """A memfit config with the settings' device and host where it has none."""
    added = set()
    out = dict(data)
    if "device" not in data:
        probe: dict = {}
        _device(probe, conf)
        if "device" in probe:
            out["device"] = probe["device"]
            added.add(("device",))
        if "host" in probe and "host" not in data:
            out["host"] = probe["host"]
            added.add(("host",))
    elif "host" not in data and conf.get("host_memory") is not None:
        out["host"] = {"memory": conf.get("host_memory")}
        added.add(("host",))
    if isinstance(data.get("device"), dict):  # a device section without them: --reserve and --overhead fill them
        for key in ("reserve", "overhead"):
            if key not in data["device"] and conf.get(key) is not None:
                out["device"] = {**out["device"], key: conf.get(key)}
                added.add(("device", key))
    if isinstance(data.get("parallel"), dict) and "gpus_per_node" not in data["parallel"] and conf.get("gpus_per_node") is not None:
        out["parallel"] = {**data["parallel"], "gpus_per_node": conf.get("gpus_per_node")}
        added.add(("parallel", "gpus_per_node"))
    return out, added


def _count(value, default: int = 1) -> int | None:
    """A parallel degree as the schema takes it (a positive int), the default where it is absent; None otherwise."""
    if value is None:
        return default
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def memfit_world(data: dict, conf: Settings) -> tuple[dict, set, list]:
    """A memfit config's world size from --gpus (or the settings' gpus), as a native config's (Context.finish):
    parallel.data = gpus / (tensor x pipeline) where the config states no parallel.data (a `parallel` section of
    gpus ranks where it has none and gpus > 1). Where the config states parallel.data and its world size data x
    tensor x pipeline is another, the config's own section wins (as its device wins over --device) and a
    gpus-overridden warning at parallel.data says so, and so where gpus is below tensor x pipeline (at the parallel
    key); gpus that tensor x pipeline does not divide is bad-parallel on the parallel key. (the data, the keys added, the problems)."""
    from memfit.diagnostics.diagnostic import Problem

    gpus = conf.get("gpus")
    parallel = data.get("parallel")
    if _count(gpus, 0) in (None, 0) or (parallel is None and gpus == 1) or not isinstance(parallel, (dict, type(None))):
        return data, set(), []
    parallel = parallel or {}
    tensor, pipeline, stated = _count(parallel.get("tensor")), _count(parallel.get("pipeline")), parallel.get("data")
    if tensor is None or pipeline is None or (stated is not None and _count(stated) is None):
        return data, set(), []  # the schema's problem, at the key
    source = f"--gpus {gpus}" if "gpus" in conf.cli or not conf.file else f"gpus = {gpus} in {settings_shown(conf.file)}"
    if stated is not None:
        world = stated * tensor * pipeline
        if world == gpus:
            return data, set(), []
        split = f" x tensor {tensor} x pipeline {pipeline}" if tensor * pipeline > 1 else ""
        message = (f"{source} is not this config's world size, parallel.data {stated}{split} = {world} GPU{'s' if world != 1 else ''}: "
                   f"the config's parallel section wins, the figures are for {world} GPU{'s' if world != 1 else ''} (drop parallel.data to let {source.split(' ')[0]} set it)")
        return data, set(), [Problem(("parallel", "data"), codes.GPUS_OVERRIDDEN, message, on_key=True)]
    if gpus < tensor * pipeline:
        # fewer GPUs than the config's own model-parallel split: as a stated parallel.data, the config wins
        message = (f"{source} is fewer GPUs than this config's tensor {tensor} x pipeline {pipeline} = {tensor * pipeline}: "
                   f"the config's parallel section wins, the figures are for {tensor * pipeline} GPUs")
        return data, set(), [Problem(("parallel",), codes.GPUS_OVERRIDDEN, message, on_key=True)]
    if gpus % (tensor * pipeline):
        message = f"{source}: {gpus} GPUs do not divide into tensor x pipeline = {tensor} x {pipeline} = {tensor * pipeline}: parallel.data would not be a whole number of ranks"
        return data, set(), [Problem(("parallel",), codes.BAD_PARALLEL, message, on_key=True)]
    out = {**data, "parallel": {**parallel, "data": gpus // (tensor * pipeline)}}
    return out, {("parallel", "data") if "parallel" in data else ("parallel",)}, []


# the formats whose data-parallel runs without ZeRO or FSDP are torch DDP (the Trainer, through accelerate)

MODULES = {"axolotl": "axolotl", "llama-factory": "llamafactory", "hf-trainer": "hftrainer", "torchtune": "torchtune", "deepspeed": "deepspeed", "accelerate": "accelerate", "litgpt": "litgpt"}


# configs of a training framework that train nothing: format -> (keys any of which says so, unless a training key is
# there, what such a file is). LLaMA-Factory's examples/inference/ (infer_backend) and examples/merge_lora/
# (export_dir); torchtune's eleuther_evaluation (tasks), generation (prompt, max_new_tokens) and quantization
# (quantizer) recipes, none of which has an optimizer
NOT_TRAINING = {
    "llama-factory": (("infer_backend", "export_dir"), ("stage", "do_train", "output_dir"), "an inference or merge config (LLaMA-Factory's chat, webui, export)"),
    "torchtune": (("tasks", "prompt", "max_new_tokens", "quantizer"), ("optimizer", "loss", "epochs"), "an evaluation, generation or quantization recipe config"),
}


def not_training(fmt: str, data: dict) -> tuple[str, str] | None:
    """(the key that says so, what the file is) for a config that trains nothing, else None."""
    found = NOT_TRAINING.get(fmt)
    if found is None:
        return None
    marks, training, what = found
    if any(k in data for k in training):
        return None
    key = next((k for k in marks if k in data), None)
    return (key, what) if key is not None else None


def read(fmt: str, data: dict, path: str, conf: Settings) -> Native:
    import importlib

    r = Reader(fmt, data, path)
    idle = not_training(fmt, data)
    if idle is not None:  # recognised, and said to be what it is: no training figure
        key, what = idle
        r.native.root = r.at(key, on_key=True)
        r.native.checkable, r.native.training = False, False
        r.native.found.append(Found(r.native.root, codes.NOT_TRAINING, f"{key}: {what}, which trains nothing; memfit prices training steps, so it gives no figure (check the training config that made the model)"))
        return r.native
    module = importlib.import_module(f"memfit.read.native.{MODULES[fmt]}")  # only the format read
    v1 = module.v1_key(data) if fmt == "llama-factory" else None
    if v1 is not None:  # LLaMA-Factory's v1 format (USE_V1=1): its own reader; torchrun, no accelerate launch config
        from memfit.read.native import llamafactory_v1

        idle_key = llamafactory_v1.not_training(data)
        if idle_key is not None:
            llamafactory_v1.refuse_idle(r, idle_key)
            return r.native
        ctx = Context(r, path, conf)
        return ctx.finish(llamafactory_v1.read(r, ctx))
    ctx = Context(r, path, conf)
    ctx.read_launch()
    trainer = module.read(r, ctx)
    return ctx.finish(trainer)
