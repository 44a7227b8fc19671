"""`memfit lsp` against a hostile or broken client: huge and malformed frames, invalid params,
requests out of order, unopened documents, pathological text; plus property-based fuzzing of
random message sequences. Every request must get exactly one JSON-RPC answer, and the server
must never exit on its own.

Transport-level tests drive `python -m memfit lsp` over real pipes with a raw client (a real
LSP client library would refuse to send these messages); protocol-level ones and the fuzzing
feed messages to the server object in-process, which is fast enough for hundreds of cases."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import needs
import pytest

needs.module("pygls")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.editor import lsp
from lsp_session import INIT, session  # noqa: F401 (the in-process session the hostile tests share)

SERVER = [sys.executable, "-m", "memfit", "lsp"]
TIMEOUT = 30  # a safety net against a hung server, never the synchronisation itself
CONFIG = "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters:\n  - {name: w, shape: [512, 512]}\n"
URI = "file:///tmp/memfit-hardening/train.yaml"
CAPS = {"textDocument": {"hover": {"contentFormat": ["markdown"]}}}


def frame(payload) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class RawClient:
    """Writes bytes to the server's stdin; a thread parses its stdout into messages."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.messages: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0

    def _read(self) -> None:
        out = self.process.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line == b"\r\n":
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            self.messages.put(json.loads(out.read(length)))

    def send(self, payload) -> None:
        self.process.stdin.write(payload if isinstance(payload, bytes) and payload.startswith(b"Content-Length") else frame(payload))
        self.process.stdin.flush()

    def notify(self, method: str, params) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params, raw_id=None) -> dict:
        self.next_id += 1
        msg_id = self.next_id if raw_id is None else raw_id
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return self.answer(msg_id)

    def answer(self, msg_id) -> dict:
        """The response to msg_id (notifications the server sends meanwhile are kept in seen)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = self.messages.get(timeout=max(0.1, deadline - time.monotonic()))
            self.seen.append(message)
            if "method" not in message and message.get("id") == msg_id:
                return message

    def initialize(self) -> None:
        assert "result" in self.request("initialize", {"processId": None, "rootUri": None, "capabilities": CAPS})
        self.notify("initialized", {})

    def finish(self, *, shutdown: bool = True) -> int:
        if shutdown:
            assert self.request("shutdown", None)["result"] is None
        self.notify("exit", None)
        try:
            return self.process.wait(timeout=TIMEOUT)
        finally:
            self.process.stdin.close()
            self.process.stdout.close()
            self.stderr = self.process.stderr.read().decode()
            self.process.stderr.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            stream.close()


@pytest.fixture
def raw():
    client = RawClient()
    yield client
    client.kill()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# --- frames ------------------------------------------------------------------------------------


def test_a_frame_claiming_a_terabyte_is_refused_and_the_server_stays_up(raw):
    raw.initialize()
    before = rss_kib(raw.process.pid)
    raw.send(b"Content-Length: 1000000000000\r\n\r\n" + b"x" * (8 * 2**20))  # skipped, not held in memory
    refused = raw.messages.get(timeout=TIMEOUT)
    assert refused["id"] is None and refused["error"]["code"] == -32600
    assert "1,000,000,000,000 bytes is over the limit" in refused["error"]["message"]
    # no sleep: the 8 MiB write above returned only once the server had read all but a pipe's buffer of it (the
    # pipe is the synchronisation); the frame it is skipping claims a terabyte, so nothing after it is answered
    assert raw.process.poll() is None
    assert rss_kib(raw.process.pid) - before < 32 * 1024
    raw.process.stdin.close()  # the client goes away mid-frame: a clean end, no traceback
    assert raw.process.wait(timeout=TIMEOUT) == 0
    assert b"Traceback" not in raw.process.stderr.read()


def test_after_an_oversized_frame_the_next_message_is_read(raw):
    raw.initialize()
    raw.send(b"Content-Length: %d\r\n\r\n" % (lsp.MAX_MESSAGE_BYTES + 1) + b" " * (lsp.MAX_MESSAGE_BYTES + 1))
    assert raw.messages.get(timeout=TIMEOUT)["error"]["code"] == -32600
    assert raw.request("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}})["result"] is None
    assert raw.finish() == 0


def test_bad_headers_and_bodies_are_answered(raw):
    raw.initialize()
    raw.send(b"Content-Length: banana\r\n\r\n")
    assert raw.messages.get(timeout=TIMEOUT)["error"]["code"] == -32600
    raw.send(b"Content-Length" + b"X-Junk: " + b"a" * 100_000 + b"\r\n\r\n")  # a 100 kB header line, no length: nothing to read
    for body, code in [(b"{not json", -32700), (b"\xff\xfe\x00", -32700), (b"[1, 2]", -32600), (b"[" * 100_000, -32700), (b"42", -32600)]:
        raw.send(frame(body))
        answer = raw.messages.get(timeout=TIMEOUT)
        assert answer["id"] is None and answer["error"]["code"] == code, body[:20]
    assert raw.request("shutdown", None)["result"] is None  # still reading frames in step
    raw.notify("exit", None)
    assert raw.process.wait(timeout=TIMEOUT) == 0


# --- every request gets an answer ----------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"textDocument": {"uri": URI}, "position": {"line": -1, "character": 0}},
        {"textDocument": {"uri": URI}, "position": {"line": 2**40, "character": 0}},
        {"textDocument": {"uri": URI}, "position": {"line": 0}},
        {"textDocument": {"uri": 5}, "position": {"line": 0, "character": 0}},
        {"textDocument": None, "position": {"line": 0, "character": 0}},
        None,
        [1, 2, 3],
        "hover",
    ],
)
def test_invalid_params_get_an_invalid_params_error(raw, params):
    raw.initialize()
    answer = raw.request("textDocument/hover", params)
    assert answer["error"]["code"] == -32602, answer
    assert raw.finish() == 0


def test_requests_with_a_bad_id_or_version_are_answered(raw):
    raw.initialize()
    raw.send({"jsonrpc": "2.0", "id": [1], "method": "textDocument/hover", "params": {}})
    assert raw.answer(None)["error"]["code"] == -32600
    raw.send({"jsonrpc": "1.0", "id": 77, "method": "shutdown"})
    assert raw.answer(77)["error"]["code"] == -32600
    raw.send({"jsonrpc": "2.0", "id": 78})
    assert raw.answer(78)["error"]["code"] == -32600
    assert raw.request("no/such/method", {})["error"]["code"] == -32601
    assert raw.finish() == 0


def test_requests_before_initialize_are_refused_with_32002(raw):
    answer = raw.request("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}})
    assert answer["error"]["code"] == -32002
    raw.notify("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "yaml", "version": 1, "text": CONFIG}})  # dropped
    raw.initialize()
    assert raw.request("textDocument/codeLens", {"textDocument": {"uri": URI}})["result"] is None  # that open was dropped
    assert raw.finish() == 0


def test_requests_after_shutdown_are_refused_and_exit_then_exits_0(raw):
    raw.initialize()
    assert raw.request("shutdown", None)["result"] is None
    for method, params in [("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}}), ("shutdown", None)]:
        answer = raw.request(method, params)
        assert answer["error"]["code"] == -32600 and "shutting down" in answer["error"]["message"]
    assert raw.finish(shutdown=False) == 0


def test_exit_without_shutdown_exits_1(raw):
    raw.initialize()
    assert raw.finish(shutdown=False) == 1
    assert "Traceback" not in raw.stderr


# --- documents the client did not open ---------------------------------------------------------------


def test_changes_and_saves_of_unopened_documents_are_ignored(raw, tmp_path):
    raw.initialize()
    secret = tmp_path / "secret.yaml"
    secret.write_text(CONFIG.replace("1 GiB", "1 B"), encoding="utf-8")  # would publish a budget error if read
    for uri in ("file:///dev/zero", secret.as_uri()):
        raw.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
        raw.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": CONFIG}]})
        completion = raw.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 13}})
        assert completion["result"] is None
    answer = raw.request("textDocument/hover", {"textDocument": {"uri": secret.as_uri()}, "position": {"line": 0, "character": 0}})
    assert answer["result"] is None
    assert not [m for m in raw.seen if m.get("method") == "textDocument/publishDiagnostics"]
    assert raw.finish() == 0


# --- features ------------------------------------------------------------------------------------


def test_the_footprint_command_returns_the_footprint(raw):
    raw.initialize()
    raw.notify("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "yaml", "version": 1, "text": CONFIG}})
    lens = raw.request("textDocument/codeLens", {"textDocument": {"uri": URI}})["result"]
    command = lens[0]["command"]
    assert command["command"] == "memfit.footprint" and command["arguments"] == [URI]
    answer = raw.request("workspace/executeCommand", {"command": command["command"], "arguments": command["arguments"]})
    # [512, 512] float32 with Adam: 1,048,576 B weights, as much gradient, twice that of state
    assert answer["result"] == {"parameters": 1048576, "gradients": 1048576, "activations": 0, "optimizer_state": 2097152, "total": 4194304}
    unknown = raw.request("workspace/executeCommand", {"command": "memfit.footprint", "arguments": ["file:///not/open.yaml"]})
    assert unknown["result"] is None
    assert raw.finish() == 0


@pytest.mark.wallclock
def test_completion_after_a_long_word_is_linear(raw):
    raw.initialize()
    word = "b" * 60_000
    text = f"memfit: 1\noptimizer: adam\n{word}\n  - {{name: {word}, shape: [1]}}\ndtypes:\n  parameters: {word}\n"
    raw.notify("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "yaml", "version": 1, "text": text}})
    raw.request("textDocument/codeLens", {"textDocument": {"uri": URI}})  # the open's analysis is done
    started = time.monotonic()
    for line, character in [(2, 60_000), (3, 60_011), (3, 60_020), (5, 60_014), (1, 15)]:
        raw.request("textDocument/completion", {"textDocument": {"uri": URI}, "position": {"line": line, "character": character}})
    # a generous outer limit (the regex engine's work cannot be counted from Python): it was 30 s per request
    assert time.monotonic() - started < 30
    assert raw.finish() == 0


# --- in-process: the protocol object fed message by message ------------------------------------------




def test_no_future_is_kept_per_notification():
    """pygls 2.1.1 keeps one Future per notification in _request_futures for ever (about 5 MB
    per 3,000 open/close pairs); memfit's protocol drops each one when its handler is done."""
    pairs = []
    for i in range(500):
        uri = f"file:///tmp/memfit-leak/{i}.yaml"
        pairs.append({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": CONFIG}}})
        pairs.append({"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": uri}}})
    server, _ = session([INIT, {"jsonrpc": "2.0", "method": "initialized", "params": {}}, *pairs])
    assert server.protocol._request_futures == {}
    assert server.documents == {}


# --- property-based fuzzing ----------------------------------------------------------------------------

URIS = st.sampled_from([URI, "file:///dev/zero", "file:///tmp/memfit-hardening/other.yaml", "untitled:1", "", 5, None, [URI]])
INTS = st.one_of(st.integers(-3, 40), st.integers(-(2**64), 2**64))
POSITION = st.one_of(st.fixed_dictionaries({"line": INTS, "character": INTS}), st.fixed_dictionaries({"line": INTS}), st.none())
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
TEXTS = st.one_of(
    st.just(CONFIG),
    st.just(CONFIG.replace("1 GiB", "1 B")),
    st.just("memfit: 1\nmodel: {layers: [{type: Dense}]}\n"),
    st.text(alphabet="memfit: 1{}[]-\n\t'\"&*!#", max_size=60),
    st.integers(),
)
DOC = st.fixed_dictionaries({"uri": URIS})
PARAMS = {
    "initialize": st.just({"processId": None, "rootUri": None, "capabilities": {}}) | JSON,
    "shutdown": st.none() | JSON,
    "textDocument/hover": st.fixed_dictionaries({"textDocument": DOC, "position": POSITION}) | JSON,
    "textDocument/completion": st.fixed_dictionaries({"textDocument": DOC, "position": POSITION}),
    "textDocument/inlayHint": st.fixed_dictionaries({"textDocument": DOC, "range": st.fixed_dictionaries({"start": POSITION, "end": POSITION})}),
    "textDocument/codeLens": st.fixed_dictionaries({"textDocument": DOC}),
    "workspace/executeCommand": st.fixed_dictionaries({"command": st.sampled_from(["memfit.footprint", "nope"]), "arguments": st.lists(URIS | JSON, max_size=3)}),
    "no/such/method": JSON,
}
NOTIFICATIONS = {
    "initialized": st.just({}),
    "textDocument/didOpen": st.fixed_dictionaries({"textDocument": st.fixed_dictionaries({"uri": URIS, "languageId": st.just("yaml"), "version": INTS, "text": TEXTS})}),
    "textDocument/didChange": st.fixed_dictionaries(
        {"textDocument": st.fixed_dictionaries({"uri": URIS, "version": INTS}), "contentChanges": st.lists(st.fixed_dictionaries({"text": TEXTS}), max_size=2)}
    ),
    "textDocument/didSave": st.fixed_dictionaries({"textDocument": DOC}),
    "textDocument/didClose": st.fixed_dictionaries({"textDocument": DOC}),
    "$/cancelRequest": st.fixed_dictionaries({"id": INTS}),
    "$/setTrace": JSON,
}


@st.composite
def messages(draw):
    out = []
    for index in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["request", "request", "notification", "notification", "junk"]))
        if kind == "request":
            method = draw(st.sampled_from(sorted(PARAMS)))
            out.append({"jsonrpc": "2.0", "id": index, "method": method, "params": draw(PARAMS[method])})
        elif kind == "notification":
            method = draw(st.sampled_from(sorted(NOTIFICATIONS)))
            out.append({"jsonrpc": "2.0", "method": method, "params": draw(NOTIFICATIONS[method])})
        else:
            out.append(draw(st.one_of(st.binary(max_size=30), JSON.map(lambda value: json.dumps(value).encode()))))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.booleans(), sequence=messages())
def test_fuzz_every_request_is_answered_once_and_the_server_never_exits(start, sequence):
    sent = ([INIT] if start else []) + sequence
    _, replies = session(sent)  # a SystemExit (the server leaving on its own) fails the test
    asked = [m["id"] for m in sent if isinstance(m, dict) and "method" in m and "id" in m]
    answered = [m["id"] for m in replies if "method" not in m and m.get("id") is not None]
    assert sorted(answered, key=str) == sorted(asked, key=str)
    for reply in replies:
        assert reply.get("jsonrpc") == "2.0"
        assert ("result" in reply) != ("error" in reply) or "method" in reply


def test_tcp_bounds_header_lines_and_frames():
    server = subprocess.Popen([*SERVER, "--tcp", "127.0.0.1:0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = server.stderr.readline().decode()
        assert line.startswith("memfit lsp: listening on 127.0.0.1:"), line
        import socket

        with socket.create_connection(("127.0.0.1", int(line.rsplit(":", 1)[1])), timeout=TIMEOUT) as sock:
            stream = sock.makefile("rwb")

            def read_message() -> dict:
                length = None
                while (header := stream.readline()) != b"\r\n":
                    if header.lower().startswith(b"content-length:"):
                        length = int(header.split(b":")[1])
                return json.loads(stream.read(length))

            stream.write(b"X-Junk " + b"a" * 200_000 + b"\r\n\r\n")  # longer than the stream's buffer limit
            stream.write(b"Content-Length: 1000000000000\r\n\r\n" + b"x" * 2**20)
            stream.flush()
            refused = read_message()
            assert refused["error"]["code"] == -32600 and "over the limit" in refused["error"]["message"]
            # the client leaves mid-frame; the server's end of the connection closing is the event that it has read
            # (and skipped) everything sent, where a sleep guessed
            assert rss_kib(server.pid) < 200 * 1024  # read while it skips: it ends with its one connection (below)
            sock.shutdown(socket.SHUT_WR)
            assert stream.read() == b""
        # its client gone, the server ends (shutdown closes it), cleanly; reading its VmRSS after that raced its exit
        assert server.wait(TIMEOUT) == 0
    finally:
        server.kill()
        server.wait()
        server.stderr.close()
