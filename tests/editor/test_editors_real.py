"""Two real clients that nobody here wrote, driven end to end:

- Neovim (Debian's package; 0.7 on Debian 12) with the setup the README (and docs/editors.md) prints for it, the
  snippet taken from the page itself: its own LSP client must receive memfit's diagnostics (the
  ones `memfit check` prints, at the same positions) and answer a hover.
- yaml-language-server (npm, installed into .ci/node by .ci/run) with memfit's schema through the
  modeline the examples carry: it must report the schema errors memfit reports (an unknown key, a
  bad dtype) at the same positions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import needs

ROOT = Path(__file__).resolve().parents[2]
EDITORS = ROOT / "docs" / "editors.md"

# 4096 x 4096 float32 with Adam: 67,108,864 B of weights, as much gradient, twice that of state:
# 268,435,456 B in all, over a 100 MB budget.
OVER = """\
memfit: 1
name: neovim
device: {memory: 100 MB}
optimizer: adam
parameters:
  - {name: big.weight, shape: [4096, 4096]}
"""


def memfit_check(path: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120, check=False)
    return json.loads(done.stdout)["files"][0]["diagnostics"]


def lua_snippet(first_line: str) -> str:
    """The block the README prints (indented in a list item there); docs/editors.md prints the same."""
    found = {}
    for page in (ROOT / "README.md", EDITORS):
        blocks = re.findall(r"^( *)```lua\n(.*?)^ *```", page.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)
        blocks = ["".join(line[len(indent) :] + "\n" for line in body.splitlines()) for indent, body in blocks]
        found[page.name] = [b for b in blocks if b.startswith(first_line)]
        assert len(found[page.name]) == 1, f"{page.name} must print one lua block starting {first_line!r}"
    assert found["README.md"] == found["editors.md"], "the README and docs/editors.md print different Neovim setups"
    return found["README.md"][0]


def client_env(tmp_path: Path) -> dict:
    """`memfit` on PATH from this interpreter's environment; no user configuration of any editor."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "NVIM", "VIM"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"), XDG_STATE_HOME=str(home / ".local/state"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p)
    return env


HARNESS = r"""
-- the test's part: wait for memfit's diagnostics, hover on the tensor, write what Neovim holds
vim.api.nvim_create_autocmd('VimEnter', { callback = function()
  local buf = vim.api.nvim_get_current_buf()
  vim.wait(30000, function() return #vim.diagnostic.get(buf) > 0 end, 50)
  local diagnostics = {}
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    local lsp = d.user_data and d.user_data.lsp or {}
    table.insert(diagnostics, { lnum = d.lnum, col = d.col, code = d.code or lsp.code, message = d.message, source = d.source })
  end
  vim.api.nvim_win_set_cursor(0, { 6, 30 })
  local responses = vim.lsp.buf_request_sync(buf, 'textDocument/hover', vim.lsp.util.make_position_params(), 20000) or {}
  local hovers = {}
  for _, response in pairs(responses) do
    if response.result then table.insert(hovers, response.result.contents.value or response.result.contents) end
  end
  local clients = {}
  for _, client in pairs(vim.lsp.buf_get_clients(buf)) do table.insert(clients, client.name) end
  local out = io.open(vim.env.MEMFIT_RESULT, 'w')
  out:write(vim.fn.json_encode({ version = vim.version(), filetype = vim.bo.filetype, clients = clients,
                                  diagnostics = diagnostics, hover = hovers }))
  out:close()
  vim.cmd('qall!')
end })
"""


def test_neovim_core_client_gets_diagnostics_and_hover(tmp_path: Path) -> None:
    nvim = shutil.which("nvim")
    if nvim is None:
        needs.unavailable("nvim is not installed (.ci/run installs Debian's neovim package)")
    config = tmp_path / "train.yaml"
    config.write_text(OVER, encoding="utf-8")
    init = tmp_path / "init.lua"
    init.write_text(lua_snippet("-- memfit for Neovim 0.7+") + HARNESS, encoding="utf-8")
    result = tmp_path / "result.json"
    env = client_env(tmp_path) | {"MEMFIT_RESULT": str(result)}
    done = subprocess.run([nvim, "--headless", "-u", str(init), str(config)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.exists(), f"nvim wrote no result (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    seen = json.loads(result.read_text(encoding="utf-8"))
    assert seen["filetype"] == "yaml" and seen["clients"] == ["memfit"]
    expected = [
        {"lnum": d["range"]["start"]["line"], "col": d["range"]["start"]["character"], "code": d["code"], "message": d["message"], "source": "memfit"}
        for d in memfit_check(config)
    ]
    assert [d["code"] for d in expected] == ["budget-exceeded"]
    assert seen["diagnostics"] == expected
    (hover,) = seen["hover"]
    assert hover.startswith("**big.weight**: parameter [4096, 4096]")
    assert "67,108,864 B" in hover


# --- yaml-language-server ------------------------------------------------------------------------------

SCHEMA_ERRORS = """\
# yaml-language-server: $schema=../schemas/memfit.schema.json
memfit: 1
device: {memory: 24 GiB}
optimizer: adam
dtypes:
  parameters: float23
parameters:
  - {name: w, shape: [4, 4], trainabel: false}
"""


def yaml_language_server() -> list[str]:
    local = ROOT / ".ci" / "node" / "node_modules" / ".bin" / "yaml-language-server"
    found = str(local) if local.exists() else shutil.which("yaml-language-server")
    if found is None:
        needs.unavailable("yaml-language-server is not installed (.ci/run installs it from npm into .ci/node)")
    return [found, "--stdio"]


class Stdio:
    """A minimal LSP client over pipes: enough to open a document and collect what is published."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.process = subprocess.Popen(command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.received: list[dict] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.process.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            message = json.loads(out.read(length))
            if "id" in message and "method" in message:  # a request to the client (configuration, registration)
                result = [None] * len(message.get("params", {}).get("items", [])) if message["method"] == "workspace/configuration" else None
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})
            with self.lock:
                self.received.append(message)

    def send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def wait_for(self, predicate, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for message in self.received:
                    if predicate(message):
                        return message
            time.sleep(0.05)
        raise AssertionError(f"timed out; received {self.received}")

    def close(self) -> None:
        try:
            self.send({"jsonrpc": "2.0", "id": "bye", "method": "shutdown"})
            self.wait_for(lambda m: m.get("id") == "bye", 10)
            self.send({"jsonrpc": "2.0", "method": "exit"})
            self.process.wait(timeout=10)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.process.stdin.close()
            self.process.stdout.close()


def test_yaml_language_server_reports_memfits_schema_errors_at_memfits_positions(tmp_path: Path) -> None:
    command = yaml_language_server()
    (tmp_path / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "memfit.schema.json", tmp_path / "schemas")
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "train.yaml"
    config.write_text(SCHEMA_ERRORS, encoding="utf-8")
    assert SCHEMA_ERRORS.splitlines()[0] == (ROOT / "examples" / "atari-cnn.yaml").read_text(encoding="utf-8").splitlines()[0]  # the examples' modeline

    client = Stdio(command, tmp_path)
    try:
        client.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": tmp_path.as_uri(), "capabilities": {}}})
        client.wait_for(lambda m: m.get("id") == 1)
        client.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        client.send({"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration", "params": {"settings": {"yaml": {"validate": True, "schemaStore": {"enable": False}}}}})
        uri = config.as_uri()
        client.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": SCHEMA_ERRORS}}})
        published = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri and m["params"]["diagnostics"])
    finally:
        client.close()

    theirs = {(d["range"]["start"]["line"], d["range"]["start"]["character"]) for d in published["params"]["diagnostics"]}
    ours = memfit_check(config)
    assert sorted(d["code"] for d in ours) == ["schema", "unknown-dtype"]
    for diagnostic in ours:
        start = diagnostic["range"]["start"]
        assert (start["line"], start["character"]) in theirs, (diagnostic, published["params"]["diagnostics"])
