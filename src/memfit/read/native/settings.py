"""Project settings: `[tool.memfit]` in a pyproject.toml, or the same keys at the top level of a
memfit.toml, found from the checked file's directory upward as ruff finds its settings (in each
directory a memfit.toml wins over a pyproject.toml; a pyproject.toml without `[tool.memfit]` is
passed over), up to the repository's root (the directory holding `.git`) and no further. Command-line flags win over the file.

What a key means for a config is in one table, SETTINGS: the memfit key it fills. A native
config gets them all; a memfit config gets the device and host keys where it says nothing itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import field

from memfit.diagnostics.diagnostic import FILE_START, Range
from memfit.diagnostics.records import record
from memfit.diagnostics.units import UnitError, parse_bytes, parse_percent

# key -> (what it holds, the memfit key it fills, the command-line flag)
SETTINGS: dict[str, tuple[str, str, str | None]] = {
    "device": ("a GPU preset name (H100-80GB, RTX-4090, ...)", "device.preset", "--device"),
    "budget": ("bytes, e.g. '80 GiB'", "device.memory", "--budget"),
    "reserve": ("bytes or a percentage", "device.reserve", "--reserve"),
    "overhead": ("'auto' or bytes", "device.overhead", "--overhead"),
    "gpus": ("the world size: GPUs in the run", "parallel.data (divided by tensor x pipeline)", "--gpus"),
    "gpus_per_node": ("GPUs per node", "parallel.gpus_per_node", "--gpus-per-node"),
    "host_memory": ("bytes of RAM per node", "host.memory", "--host-memory"),
    "launch": ("an accelerate config file", "the world size, sharding and precision it sets", "--launch"),
    "include": ("globs of native configs, relative to the settings file", "files a directory walk checks", None),
    "models": ("a table: model name -> config.json (or its directory)", "model.hf_config", None),
    "model": ("a model name or path, for configs that name none (a DeepSpeed JSON alone)", "model.hf_config", "--model"),
    "data_seq_len": ("tokens: the sequence length gated where a config leaves it to the data (torchtune tokenizer.max_seq_len: null)", "training.seq_len (default DATA_SEQ_LEN)", None),
    "overrides": ("a list of tables: `files` (globs, relative to the settings file) and any keys above, for those files", "the keys it sets", None),
}
NAMES = ("pyproject.toml", "memfit.toml")

# The sequence length memfit gates where a config leaves it to the data (torchtune's `tokenizer.max_seq_len: null`:
# no truncation, the dataset's longest sample decides), the same for every format: not the model's maximum context
# (131,072 tokens for Llama 3.1), which no dataset of instructions comes near. 2,048 is LLaMA-Factory's `cutoff_len`
# default. The setting `data_seq_len` changes it; the diagnostic gives the longest sequence that fits besides.
DATA_SEQ_LEN = 2048


def data_seq_len(conf: "Settings") -> tuple[int, str]:
    """The length gated where a config leaves it to the data, and where that length comes from (as the message says it)."""
    value = conf.get("data_seq_len")
    if value is None:
        return DATA_SEQ_LEN, "memfit's default for a length left to the data; the setting data_seq_len changes it"
    return value, f"data_seq_len in {shown(conf.file)}" if conf.file and "data_seq_len" not in conf.cli else "data_seq_len"


@record
class Settings:
    """The project settings in force for a file ([tool.memfit] in pyproject.toml, or memfit.toml)."""

    file: str | None = None  # where the file settings come from (None: none found)
    text: str = ""
    values: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)  # (Range in file, message)
    cli: set = field(default_factory=set)  # the keys the command line set
    online: bool = False  # --online: a model's config.json may be fetched (resolve.fetch)

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    @property
    def base(self) -> str:
        return os.path.dirname(self.file) if self.file else os.getcwd()

    def where(self, key: str) -> str:
        return f"--{key.replace('_', '-')}" if key in self.cli else f"{self.file} {key}" if self.file else key


def shown(path: str | None) -> str | None:
    """A file as the output names it: relative to the working directory when under it, else absolute."""
    if path is None:
        return None
    relative = os.path.relpath(path)
    return relative if not relative.startswith(os.pardir) else path


def provenance(conf: Settings, device: bool = True, model: dict | None = None) -> dict | None:
    """Where a check's model, device and settings came from (json `provenance`, the text's found line):
    {"settings": the settings file or None, "device": {"preset" or "memory", "from"}, "model": {"name",
    "config", "from"}}; None when nothing came from outside the checked file."""
    out: dict = {}
    if device:
        for key, field_name in (("device", "preset"), ("budget", "memory")):
            value = conf.get(key)
            if value is not None:
                out["device"] = {field_name: value if isinstance(value, (str, int)) else str(value), "from": key_origin(conf, key)}
                break
    if model is not None:
        out["model"] = model
    if not out and conf.file is None:
        return None
    return {"settings": shown(conf.file), **out}


def key_origin(conf: Settings, key: str) -> str:
    """`--device`, or the settings file that set the key (as the output names files)."""
    if key in conf.cli:
        return f"--{key.replace('_', '-')}"
    return shown(conf.file) or "the settings"


def find(directory: str) -> tuple[str | None, str, dict, list]:
    """(the settings file, its text, its [tool.memfit] values, problems) for a directory. Read
    for each checked file, never cached (no state between checks; a long-running language server
    sees a settings edit at once): a few stats up the tree and one small TOML parse."""
    directory = os.path.abspath(directory or ".")
    found = (None, "", {}, [])
    here = directory
    while True:
        for name in ("memfit.toml", "pyproject.toml"):
            candidate = os.path.join(here, name)
            if os.path.isfile(candidate):
                loaded = _load(candidate, tool=name == "pyproject.toml")
                if loaded is not None:
                    found = loaded
                    break
        else:
            parent = os.path.dirname(here)
            # the repository's root ends the search: a pyproject.toml above the checkout is someone else's
            if parent == here or os.path.lexists(os.path.join(here, ".git")):
                break
            here = parent
            continue
        break
    return found


def _load(path: str, tool: bool):
    import tomllib

    from memfit.read.inputs import read

    text, problem, _ = read(path)  # regular files only, size-limited
    if problem is not None:
        return None
    if tool and not re.search(r"^\s*\[\s*tool\s*\.\s*memfit\b", text, re.M) and "tool.memfit" not in text:
        return None  # a pyproject.toml without [tool.memfit] is passed over
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        match = re.search(r"line (\d+), column (\d+)", str(error))
        at = Range(int(match[1]) - 1, int(match[2]) - 1, int(match[1]) - 1, int(match[2])) if match else FILE_START
        return path, text, {}, [(at, f"invalid TOML: {error}")]
    values = data.get("tool", {}).get("memfit") if tool else data
    if not isinstance(values, dict):
        return None if tool else (path, text, {}, [])
    values, problems = validate(values, text)
    return path, text, values, problems


def key_range(text: str, key: str) -> Range:
    """Where `key =` is written in a TOML text (its first occurrence), else the file start."""
    match = re.search(rf"^[ \t]*{re.escape(key)}[ \t]*=", text, re.M)
    if match is None:
        match = re.search(rf"^[ \t]*\[[^\]]*\b{re.escape(key)}\b", text, re.M)
    if match is None:
        return FILE_START
    line = text.count("\n", 0, match.start())
    column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + (len(match[0]) - len(match[0].lstrip()))
    return Range(line, column, line, column + len(key))


def validate(values: dict, text: str = "") -> tuple[dict, list]:
    """Values of the right type; each wrong one a problem (the key is then left out)."""
    out, problems = {}, []

    def bad(key, message):
        problems.append((key_range(text, key), f"settings: {key} {message}"))

    for key, value in values.items():
        if key not in SETTINGS:
            from difflib import get_close_matches

            near = get_close_matches(key, list(SETTINGS), 1)
            bad(key, "is not a memfit setting" + (f" (did you mean {near[0]!r}?)" if near else f"; the settings are {', '.join(SETTINGS)}"))
            continue
        if key in ("gpus", "gpus_per_node", "data_seq_len"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                bad(key, f"is {value!r}: a positive integer")
                continue
        elif key in ("budget", "host_memory"):
            try:
                parse_bytes(value)
            except (UnitError, TypeError) as error:
                bad(key, f"is {value!r}: {error}")
                continue
        elif key == "reserve":
            try:
                parse_percent(value) if isinstance(value, str) and value.strip().endswith("%") else parse_bytes(value)
            except (UnitError, TypeError) as error:
                bad(key, f"is {value!r}: {error}")
                continue
        elif key == "overhead":
            if value != "auto":
                try:
                    parse_bytes(value)
                except (UnitError, TypeError) as error:
                    bad(key, f"is {value!r}: 'auto' or bytes ({error})")
                    continue
        elif key == "include":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                bad(key, "takes a list of globs")
                continue
        elif key == "overrides":
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                bad(key, "takes a list of tables ([[tool.memfit.overrides]] with files = [...] and the keys to set)")
                continue
            checked = []
            for item in value:
                files = item.get("files")
                if isinstance(files, str):
                    files = [files]
                if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
                    bad(key, "entries need files = [globs]")
                    continue
                inner, inner_problems = validate({k: v for k, v in item.items() if k != "files"}, text)
                problems.extend(inner_problems)
                inner.pop("overrides", None)
                checked.append({"files": files, **inner})
            value = checked
        elif key == "models":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                bad(key, "takes a table of model name = \"path/to/config.json\"")
                continue
        elif not isinstance(value, str):
            bad(key, f"is {value!r}: a string")
            continue
        out[key] = value
    return out, problems


def effective(path: str, options) -> Settings:
    """The settings for one checked file: its settings file's, with the command line's on top."""
    settings = Settings()
    if path and not path.startswith("<") and getattr(options, "settings", True):
        file, text, values, problems = find(os.path.dirname(os.path.abspath(path)))
        settings = Settings(file, text, dict(values), list(problems))
        for override in settings.values.pop("overrides", []):  # in order: a later match wins
            if _matches(path, os.path.dirname(file), override["files"]):
                settings.values.update({k: v for k, v in override.items() if k != "files"})
    settings.online = bool(getattr(options, "online", False))
    for key in SETTINGS:
        value = getattr(options, key, None)
        if key == "budget":
            continue  # --budget is the pipeline's own (it overrides device.memory - reserve)
        if value is not None:
            settings.values[key] = value
            settings.cli.add(key)
    return settings


def _matches(path: str, base: str, patterns) -> bool:
    import fnmatch

    rel = os.path.relpath(os.path.abspath(path), base).replace(os.sep, "/")
    return any(fnmatch.fnmatch(rel, pattern.removeprefix("./")) for pattern in patterns)


def included(path: str, settings: Settings) -> bool:
    """Whether a settings include glob names the file."""
    import fnmatch

    patterns = settings.get("include") or []
    if not patterns or settings.file is None:
        return False
    rel = os.path.relpath(os.path.abspath(path), settings.base).replace(os.sep, "/")
    return any(fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, pattern.removeprefix("./")) for pattern in patterns)


def include_matches(directory: str) -> list[str]:
    """Files under a walked directory that its settings' include globs name."""
    import glob

    file, _, values, _ = find(directory)
    if file is None or not values.get("include"):
        return []
    base = os.path.dirname(file)
    top = os.path.abspath(directory)
    out = []
    for pattern in values["include"]:
        for match in glob.glob(os.path.join(base, pattern), recursive=True):
            full = os.path.abspath(match)
            if os.path.isfile(full) and (full == top or full.startswith(top + os.sep)):
                out.append(os.path.join(directory, os.path.relpath(full, top)))
    return sorted(set(out))


# GPU presets without bf16 (compute capability below 8.0): where Axolotl's `bf16: auto`
# (utils/config/__init__.py resolve_dtype: is_torch_bf16_gpu_available()) turns to fp16
NO_BF16 = ("V100", "T4")  # preset names, case, spaces and dashes aside (config/presets.py)


def bf16_capable(conf: Settings) -> bool:
    """Whether the device the settings name computes in bf16 (unknown device: assume it does, as
    every GPU since Ampere does)."""
    import re

    name = conf.get("device")
    key = re.sub(r"[\s_-]", "", name.upper()) if isinstance(name, str) else ""
    return not key.startswith(NO_BF16)
