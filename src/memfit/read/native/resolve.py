"""The model behind a name (`base_model: meta-llama/Meta-Llama-3-8B`): its config.json, found
without the network, in order:

1. the settings' `models` table (name -> a config.json or a directory holding one, relative to
   the settings file);
2. a local directory or file: the name as a path, relative to the checked file (as the framework
   would open it relative to where it runs, memfit takes the file's directory);
3. the Hugging Face cache as huggingface_hub lays it out (huggingface_hub/constants.py:
   HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, HF_HOME defaulting to
   $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface; file_download.repo_folder_name:
   `models--{org}--{name}`; the revision `refs/main` names the snapshot
   `snapshots/<commit>/config.json`).

Nothing is downloaded unless `--online` asks for it: then `config.json` alone is fetched through
huggingface_hub (`hf_hub_download`, which honours HF_ENDPOINT and the cache above; the optional
extra `memfit[online]`). Not found: where it looked, for a positioned error.
"""

from __future__ import annotations

import os
import re


def cache_dirs() -> list[str]:
    """The hub cache directory huggingface_hub would use (first set wins, as in its constants)."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return [os.path.expandvars(os.path.expanduser(env["HF_HUB_CACHE"]))]
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return [os.path.expandvars(os.path.expanduser(env["HUGGINGFACE_HUB_CACHE"]))]
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return [os.path.join(os.path.expandvars(os.path.expanduser(home)), "hub")]


_COMMIT = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]*")  # a commit hash (or a name): no separator, no dot, so no way out of snapshots/
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_like(name: str) -> bool:
    """A name the Hub could hold (`org/model`), not a path written as one (`./x`, `../x`, `/x`, `~/x`)."""
    return _HUB_ID.fullmatch(name) is not None and ".." not in name


def _config_in(path: str) -> str | None:
    if os.path.isdir(path):
        inner = os.path.join(path, "config.json")
        return inner if os.path.isfile(inner) else None
    return path if os.path.isfile(path) else None


def resolve(name: str, base_dir: str, models: dict | None = None, models_dir: str | None = None, revision: str = "main") -> tuple[str | None, list[str]]:
    """(path of the model's config.json, or None; the places looked at, in order)."""
    looked: list[str] = []
    if models and name in models:
        target = os.path.join(models_dir or base_dir, os.path.expanduser(str(models[name])))
        looked.append(f"the settings' models table ({target})")
        found = _config_in(target)
        return found, looked
    local = os.path.join(base_dir, os.path.expanduser(name))
    looked.append(f"a local path ({os.path.normpath(local)})")
    found = _config_in(local)
    if found is not None:
        return found, looked
    if "/" in name.strip("/") or not os.path.isabs(name):
        folder = "models--" + "--".join(name.strip("/").split("/"))
        for cache in cache_dirs():
            repo = os.path.join(cache, folder)
            looked.append(f"the Hugging Face cache ({repo})")
            commit = revision
            ref = os.path.join(repo, "refs", revision)
            if os.path.isfile(ref):
                from memfit.read.inputs import read

                text, problem, _ = read(ref, 4096)
                # a commit hash, never a path: a ref reading `../../x` must not lead out of the cache
                commit = text.strip() if problem is None and _COMMIT.fullmatch(text.strip()) else revision
            candidate = os.path.join(repo, "snapshots", commit, "config.json")
            if os.path.isfile(candidate):
                return candidate, looked
    return None, looked


def fetch(name: str, revision: str = "main") -> tuple[str | None, str]:
    """--online: the model's config.json alone, through huggingface_hub into its cache; (path, or
    None and why not)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None, "--online needs huggingface_hub (pip install 'memfit[online]')"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        return hf_hub_download(repo_id=name, filename="config.json", revision=revision), ""
    except Exception as error:  # noqa: BLE001 -- any failure (network, 404, bad name) is the message
        return None, f"fetching config.json from {endpoint} failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
