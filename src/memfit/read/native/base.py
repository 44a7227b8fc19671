"""What every native reader shares: the document it builds (the memfit config the native file
means), where each memfit key came from, and the problems found while reading.

A reader never computes bytes: it says which memfit keys a native key sets (the tables in each
format's module), and the pipeline computes every figure from the document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memfit.diagnostics import codes
from memfit.models.family_keys import ATTRIBUTE_MAPS

from memfit.read.native import FORMATS  # noqa: F401 (the readers name them from here too)


@dataclass(frozen=True)
class At:
    """A node of a native file: its key path; `file` None is the checked file, else a file it
    references (a DeepSpeed JSON), as the checked path is given (joined onto its directory)."""

    path: tuple
    file: str | None = None
    on_key: bool = False


@dataclass
class Found:
    """A problem the reader found, at a native node."""

    at: At
    code: str
    message: str
    severity: str | None = None
    range: object = None  # a Range in at.file, where the node is not a YAML/JSON key (a TOML settings key)

    @property
    def level(self) -> str:
        return self.severity or codes.lookup(self.code).severity


@dataclass
class Native:
    """A native file read: the memfit document, each memfit key's native node, the problems."""

    format: str
    doc: dict
    origins: dict = field(default_factory=dict)  # memfit path -> At
    found: list = field(default_factory=list)  # Found
    texts: dict = field(default_factory=dict)  # referenced file -> its text (for positions)
    refs: dict = field(default_factory=dict)  # referenced file -> At of the key that names it
    root: At = At(())  # a whole-document problem: the format's main key
    checkable: bool = True  # False: a launch config alone (no model): read, but nothing to check
    uncheckable: str = ""  # why not, for the error when it is named explicitly
    files: list = field(default_factory=list)  # every other file read (config.json, DeepSpeed JSON, launch config), absolute
    provenance: dict | None = None  # where the model, the device and the settings came from (settings.provenance)
    training: bool = True  # False: a config that trains nothing (inference, a merge, evaluation): a note, no figure
    seq_from_data: tuple | None = None  # (the warning where the sequence length is left to the data, the model's maximum): the check adds the longest that fits

    @property
    def failed(self) -> bool:
        return any(f.level == codes.ERROR for f in self.found)


_MISSING = object()

# what every reader says of torch.compile (Axolotl, LLaMA-Factory and the Trainer's torch_compile, torchtune's compile,
# litgpt pretrain's own call): memfit prices the eager step
COMPILED = ("torch.compile: compiled kernels save less for backward, so the figure is high, on the safe side (torchtune's "
            "README, Llama 3.2 3B full fine-tune: + compile 51.0 GiB measured vs 60.0 GiB eager, 15% less); the gate keeps "
            "the eager figure")
_YAML11_INT = re.compile(r"[-+]?[1-9][0-9_]*")
_TYPES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping", list: "a list"}


class Reader:
    """Builds a Native: typed reads of native keys (a wrong type is a positioned problem, and the
    framework's default is used), memfit keys set with their origin, warnings for what is not
    modelled."""

    def __init__(self, fmt: str, data: dict, path: str, file: str | None = None) -> None:
        self.data = data
        self.path = path
        self.file = file
        self.native = Native(fmt, {"memfit": 1})

    # --- reading native keys ---------------------------------------------------------------
    def at(self, *keys, on_key: bool = False, file: str | None = _MISSING) -> At:
        return At(tuple(keys), self.file if file is _MISSING else file, on_key)

    def has(self, key: str, data: dict | None = None) -> bool:
        data = self.data if data is None else data
        return key in data and data[key] is not None

    def get(self, key: str, kinds, default=None, *, data: dict | None = None, prefix: tuple = (), file=_MISSING, choices=None):
        """data[key] when it has one of `kinds` (a tuple of types; "auto" is passed through when
        listed), else the default; a wrong type or an unknown choice is a positioned problem."""
        data = self.data if data is None else data
        value = data.get(key, _MISSING) if isinstance(data, dict) else _MISSING
        if value is _MISSING or value is None:
            return default
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if int in kinds and isinstance(value, str) and _YAML11_INT.fullmatch(value):
            value = int(value.replace("_", ""))  # 500_000: an integer to PyYAML (YAML 1.1), which the frameworks load with
        if isinstance(value, str) and value in kinds:  # a literal such as "auto"
            return value
        types = tuple(k for k in kinds if isinstance(k, type))
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            wanted = " or ".join(_TYPES.get(k, repr(k)) if isinstance(k, type) else repr(k) for k in kinds)
            self.error(self.at(*prefix, key, file=file), codes.NATIVE_CONFIG, f"{_name(prefix, key)} is {_show(value)}: it takes {wanted}")
            return default
        if choices is not None and isinstance(value, str) and value not in choices:
            self.error(self.at(*prefix, key, file=file), codes.NATIVE_CONFIG, f"{_name(prefix, key)} is {value!r}: one of {', '.join(map(repr, choices))}")
            return default
        return value

    # --- the memfit document -----------------------------------------------------------------
    def set(self, path: tuple, value, at: At | None = None) -> None:
        node = self.native.doc
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        if at is not None:
            self.native.origins[path] = at

    def origin(self, path: tuple, at: At) -> None:
        self.native.origins[path] = at

    # --- problems ----------------------------------------------------------------------------
    def error(self, at: At, code: str, message: str) -> None:
        self.native.found.append(Found(at, code, message))

    def warn(self, at: At, message: str) -> None:
        self.native.found.append(Found(at, codes.NOT_MODELLED, message))

    def note(self, at: At, message: str) -> None:
        self.native.found.append(Found(at, codes.NOT_MODELLED, message, severity=codes.INFORMATION))

    def unmodelled(self, table: dict, data: dict | None = None, prefix: tuple = (), file=_MISSING) -> None:
        """A warning on each key of `table` (key -> why it changes memory) that the file sets to
        something other than its no-effect value."""
        data = self.data if data is None else data
        for key, (inert, why) in table.items():
            if key in data and data[key] is not None and data[key] not in inert:
                self.warn(self.at(*prefix, key, on_key=True, file=file), f"{_name(prefix, key)}: {why}; memfit does not model it, the figures leave it out")


    def seq_left_to_data(self, at: At, conf, most: int, why: str) -> int:
        """A sequence length the config leaves to the data (no truncation): the length memfit gates, the same for every
        format (settings.data_seq_len: DATA_SEQ_LEN or the setting), said at the key; the check adds the longest length
        that fits (check/pipeline.py). `why` names the key and the framework's behaviour; `most` is the model's context."""
        from memfit.read.native.settings import data_seq_len

        seq, source = data_seq_len(conf)
        self.warn(at, f"{why}, the dataset's longest sample sets the length (the model allows {most:,} tokens); memfit gates {seq:,} tokens ({source})")
        self.native.seq_from_data = (self.native.found[-1], most)
        return seq

    def eval_batch(self, key: str, micro: int, default: int | None = None, conf=None) -> None:
        """An evaluation batch larger than the training micro-batch: on one GPU, training.eval_batch (the evaluation
        pass, ledger/passes.py: the run's peak is the larger of the step's and the pass's); under a layout (--gpus
        above 1, a DeepSpeed or FSDP config) the pass is not modelled: a warning says the figure may be low."""
        value = self.get(key, (int,), default) if key in self.data else default
        if not (isinstance(value, int) and not isinstance(value, bool) and value > micro):
            return
        at = self.at(key, on_key=True) if key in self.data else self.native.root
        gpus = conf.get("gpus") if conf is not None else None
        layout = (isinstance(gpus, int) and gpus > 1) or any(self.data.get(k) for k in ("deepspeed", "fsdp", "fsdp_config"))
        if layout:
            self.warn(at, f"{key} {value} is larger than the training micro-batch {micro}: evaluation runs its forward on {value} sequences "
                          "(the logits of all of them at once); under a parallel layout memfit checks the training step only, so the figures may be low for evaluation")
            return
        self.set(("training", "eval_batch"), value, at if key in self.data else None)


def model_value(cfg: dict, key: str):
    """A general key of a model's config.json (hidden_size, max_position_embeddings), under the name its family's
    config class stores it when that is another (GPT-2's n_embd, n_positions: the class's attribute_map). A config
    whose family gives the key no name of its own (or that no family describes) may still carry it under a name
    another family gives it (T5's config.json keeps n_positions): the first of those it has. None when it has none."""
    if key in cfg:
        return cfg[key]
    model_type = cfg.get("model_type")
    own = ATTRIBUTE_MAPS.get(model_type, {}) if isinstance(model_type, str) else {}
    if key in own:
        return cfg.get(own[key])
    for names in ATTRIBUTE_MAPS.values():
        if key in names and names[key] in cfg:
            return cfg[names[key]]
    return None


def _name(prefix: tuple, key) -> str:
    return ".".join(str(p) for p in (*prefix, key))


def _show(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
