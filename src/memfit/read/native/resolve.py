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

Nothing is downloaded unless `--online` asks for it: then `config.json` alone is fetched from the Hub's resolve
URL (HF_ENDPOINT honoured) with the standard library, within a deadline and a size cap, into the cache above
(fetch). Not found: where it looked, for a positioned error.
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


# --online's bounds: the whole fetch (connect, headers and body) ends by the deadline, and the body is read into memory
# up to the cap, then checked as JSON, before anything is written to the cache. A config.json is a few kilobytes
# (the largest in examples/models/ is under 4 KB); a server that trickles a byte at a time, or sends without end, is cut off.
ONLINE_DEADLINE_S = 30
ONLINE_MAX_BYTES = 1 << 20  # 1 MiB
_CHUNK = 16 * 1024


def fetch(name: str, revision: str = "main", deadline_s: float | None = None, max_bytes: int | None = None) -> tuple[str | None, str]:
    """--online: the model's config.json alone, from the Hub's resolve URL (HF_ENDPOINT honoured, HF_TOKEN sent),
    into the Hugging Face cache's layout (refs/<revision> -> snapshots/<commit>/config.json) once it is read whole
    and is JSON; (path, or None and why not). Bounded by ONLINE_DEADLINE_S and ONLINE_MAX_BYTES."""
    import http.client
    import json
    import time
    import urllib.parse

    deadline_s = ONLINE_DEADLINE_S if deadline_s is None else deadline_s
    max_bytes = ONLINE_MAX_BYTES if max_bytes is None else max_bytes
    if not hub_like(name) or not _COMMIT.fullmatch(revision):
        return None, f"{name!r} is not a Hub model id (org/name)"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{urllib.parse.quote(name)}/resolve/{urllib.parse.quote(revision)}/config.json"
    headers = {"User-Agent": "memfit", "Accept-Encoding": "identity"}
    if os.environ.get("HF_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    start = time.monotonic()

    def left() -> float:
        remaining = deadline_s - (time.monotonic() - start)
        if remaining <= 0:
            raise TimeoutError(f"no complete answer within the {deadline_s:g} s deadline")
        return remaining

    def get(found: dict) -> None:
        """The request, in a thread the caller waits for until the deadline (a server trickling its headers
        holds this thread, never the check); each body read waits at most until the deadline too."""
        url, body, commit = found["url"], bytearray(), revision
        try:
            for _ in range(5):  # the Hub answers config.json directly, or redirects (a renamed repository, a CDN)
                parts = urllib.parse.urlsplit(url)
                kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
                connection = kind(parts.hostname, parts.port, timeout=left())
                try:
                    connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
                    sock = connection.sock  # the response reads through it (the connection lets go of it after a close-delimited answer)
                    sock.settimeout(left())
                    response = connection.getresponse()
                    commit = response.getheader("X-Repo-Commit") or commit
                    if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                        url = urllib.parse.urljoin(url, response.getheader("Location"))
                        continue
                    if response.status != 200:
                        raise ValueError(f"HTTP {response.status} {response.reason}")
                    declared = response.getheader("Content-Length")
                    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                        raise ValueError(f"the server announces {int(declared):,} bytes, over the {max_bytes:,}-byte cap on a config.json")
                    while True:
                        sock.settimeout(left())
                        chunk = response.read1(min(_CHUNK, max_bytes + 1 - len(body)))
                        if not chunk:
                            break
                        body += chunk
                        if len(body) > max_bytes:
                            raise ValueError(f"the answer passes the {max_bytes:,}-byte cap on a config.json")
                        left()
                    found["body"], found["commit"] = bytes(body), commit
                    return
                finally:
                    connection.close()
            raise ValueError("too many redirects")
        except Exception as error:  # noqa: BLE001 -- network, status, deadline, cap: the reason the fetch failed
            if isinstance(error, TimeoutError):
                # every socket wait is set to what is left of the deadline: a socket timeout is the deadline passing
                # (it can fire just before the caller's join gives up on this thread)
                error = TimeoutError(f"no complete answer within the {deadline_s:g} s deadline")
            found["error"] = error

    import threading

    found: dict = {"url": url}
    worker = threading.Thread(target=get, args=(found,), daemon=True, name="memfit-online")
    worker.start()
    worker.join(deadline_s)
    try:
        if worker.is_alive():
            raise TimeoutError(f"no complete answer within the {deadline_s:g} s deadline")
        if "error" in found:
            raise found["error"]
        body, commit = found["body"], found["commit"]
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError("the answer is not a JSON object")
    except Exception as error:  # noqa: BLE001 -- network, status, deadline, cap, JSON: the message
        text = str(error).splitlines()[0] if str(error) else ""
        return None, f"fetching config.json from {endpoint} failed ({type(error).__name__}: {text}); nothing was written"
    if not _COMMIT.fullmatch(commit):
        commit = revision
    repo = os.path.join(cache_dirs()[0], "models--" + "--".join(name.split("/")))
    target = os.path.join(repo, "snapshots", commit, "config.json")
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(target, "wb") as out:
            out.write(body)
        with open(os.path.join(repo, "refs", revision), "w", encoding="ascii") as out:
            out.write(commit)
    except OSError as error:
        return None, f"writing the fetched config.json to {target} failed ({error.strerror or error})"
    return target, ""
