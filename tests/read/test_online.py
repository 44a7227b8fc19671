"""--online's bounds (issue 33), against a loopback HTTP server started here: the whole fetch ends by its deadline
(a server that trickles a byte at a time is cut off, headers or body), the body is capped while it is read, and
nothing reaches the Hugging Face cache unless a whole JSON config.json arrived. Bounded by counting the bytes the
server sent; wall-clock only as an outer limit."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memfit.read.native import resolve

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (ROOT / "examples" / "models" / "llama-3-8b.json").read_bytes()


class Server:
    """One loopback listener; `mode` decides the answer: ok, trickle-body, trickle-headers, endless."""

    def __init__(self, mode: str) -> None:
        self.mode, self.sent, self.stop = mode, 0, threading.Event()
        self.answered = threading.Event()  # set once a connection is over: the client hung up, or the answer ended
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def send(self, conn, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Repo-Commit: 0123456789abcdef0123456789abcdef01234567\r\n"
                    if self.mode == "ok":
                        self.send(conn, head + f"Content-Length: {len(CONFIG)}\r\n\r\n".encode() + CONFIG)
                    elif self.mode == "trickle-headers":
                        while not self.stop.is_set():
                            self.send(conn, b"X")
                            time.sleep(0.05)
                    elif self.mode == "trickle-body":
                        self.send(conn, head + b"\r\n")
                        while not self.stop.is_set():
                            self.send(conn, b" ")
                            time.sleep(0.05)
                    elif self.mode == "endless":
                        self.send(conn, head + b"\r\n")
                        chunk = b" " * 65536
                        while not self.stop.is_set() and self.sent < 256 * 2**20:
                            self.send(conn, chunk)
                except OSError:
                    pass  # the client hung up: what a bounded client does
            self.answered.set()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    servers = []

    def start(mode: str) -> Server:
        server = Server(mode)
        servers.append(server)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.port}")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
        return server

    yield start
    for server in servers:
        server.close()


def cached(tmp_path) -> list:
    return [p for p in (tmp_path / "hf").rglob("*") if p.is_file()] if (tmp_path / "hf").exists() else []


def test_a_whole_config_json_is_fetched_into_the_cache_layout(hub, tmp_path):
    hub("ok")
    path, why = resolve.fetch("acme/llama", deadline_s=10)
    assert why == "" and Path(path).read_bytes() == CONFIG
    assert Path(path).parts[-3:] == ("snapshots", "0123456789abcdef0123456789abcdef01234567", "config.json")
    # the next lookup finds it without the network
    found, _ = resolve.resolve("acme/llama", str(tmp_path))
    assert found == path


@pytest.mark.wallclock  # the server trickles a byte per 50 ms: the deadline's effect is only seen through the clock
@pytest.mark.parametrize("mode", ["trickle-body", "trickle-headers"])
def test_a_trickling_server_is_cut_off_at_the_deadline(hub, tmp_path, mode):
    server = hub(mode)
    began = time.monotonic()
    path, why = resolve.fetch("acme/llama", deadline_s=1)
    assert path is None and "deadline" in why and "nothing was written" in why, why
    assert time.monotonic() - began < 10  # outer limit only
    sent = server.sent
    assert sent < 200  # a byte each 50 ms for about the 1 s deadline, and no more read after it
    assert not cached(tmp_path)


def test_an_endless_answer_is_capped_while_it_is_read_and_nothing_is_written(hub, tmp_path):
    server = hub("endless")
    path, why = resolve.fetch("acme/llama", deadline_s=20)
    assert path is None and f"{resolve.ONLINE_MAX_BYTES:,}-byte cap" in why, why
    assert server.answered.wait(60), "the server never saw the client hang up"
    # what the server got out before the client hung up: the cap, plus what the loopback's socket buffers held
    assert server.sent < resolve.ONLINE_MAX_BYTES + 32 * 2**20
    assert not cached(tmp_path)


def test_online_through_the_cli(hub, tmp_path):
    hub("ok")
    config = tmp_path / "ax.yml"
    config.write_text("base_model: acme/llama\nmicro_batch_size: 1\nsequence_len: 512\n")
    env = {**os.environ}
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--online", "--format", "json", "--device", "H200", str(config)], capture_output=True, text=True, timeout=120, env=env)
    entry = json.loads(out.stdout)["files"][0]
    assert entry["footprint"] is not None and entry["provenance"]["model"]["from"] == "the Hugging Face Hub (--online)", out.stdout
