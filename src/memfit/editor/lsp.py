"""`memfit lsp`: a Language Server Protocol shell over check() (pygls 2, lsprotocol types).

Handlers only translate: LSP positions <-> the core's code-point positions (in the encoding
negotiated with the client), Diagnostic -> lsp Diagnostic, editor.py's hover/hints/lens ->
LSP's. Diagnostics are exactly check.check(text, path, Options(skip_unrecognized=True)).
Imported only by `memfit lsp` (lsp_entry), never on the CLI/hook path.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.uris import from_fs_path, to_fs_path

from memfit import __version__
from memfit.check.pipeline import Options, Result, check, has_marker, internal_error
from memfit.editor.editor import STALE, Analysis, choices, completion_context, split_lines
from memfit.whatif.fixes import FIXABLE
from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import FILE_START, diagnostic
from memfit.diagnostics.units import human
from memfit.read.inputs import DEFAULT_MAX_FILE_SIZE

# A frame bigger than this is refused (and its bytes skipped) instead of read into memory: a
# config of 64 MiB is far past anything memfit checks, and a header claiming 10^12 bytes must not
# end the server. Header lines are bounded the same way.
MAX_MESSAGE_BYTES = 64 * 2**20
MAX_HEADER_LINE = 4096
_CHUNK = 2**20

# JSON-RPC / LSP error codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002

DEFAULT_DEBOUNCE_MS = 50  # edits closer together than this coalesce into one analysis
ANALYSIS_THREADS = 2  # analyses run off the event loop: one slow document never holds another's requests
OPTIONS = Options(skip_unrecognized=True)  # serve memfit configs only, silent on other YAML
SUMMARY_COMMAND = "memfit.footprint"

SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
}
COMPLETION_KIND = {
    "dtype": types.CompletionItemKind.EnumMember,
    "optimizer": types.CompletionItemKind.EnumMember,
    "unit": types.CompletionItemKind.Unit,
    "layer": types.CompletionItemKind.Class,
}


@dataclass
class Document:
    latest: Analysis | None = None  # the current text's analysis: its diagnostics are shown
    good: Analysis | None = None  # the last analysis with a footprint: hover, hints and lens use it
    published: bool = False  # the client holds non-empty diagnostics from us
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    finished: float = float("-inf")  # loop time when the last analysis ended
    task: asyncio.Task | None = field(default=None, repr=False)  # the last analysis asked for (running or queued)
    analysed: tuple | None = field(default=None, repr=False)  # (version, text) of the last analysis run

    @property
    def view(self) -> Analysis | None:
        if self.latest is not None and self.latest.config is not None:
            return self.latest
        return self.good


def _check(text: str, path: str) -> Result:
    """check() for the language server (run in an analysis thread): a bug is a diagnostic, never a dead server."""
    try:
        return check(text, path, OPTIONS)
    except Exception as error:  # noqa: BLE001
        return Result(path, [internal_error(error)])


def _plain_range(where) -> types.Range:
    return types.Range(
        start=types.Position(line=where.start_line, character=where.start_character),
        end=types.Position(line=where.end_line, character=where.end_character),
    )


class MemfitProtocol(LanguageServerProtocol):
    """pygls's protocol, made to answer every request and to survive any client:

    - a request gets exactly one answer: a result, or an error for a request that cannot be
      read (-32600/-32602), arrives before `initialize` (-32002) or after `shutdown` (-32600),
      or whose result cannot be serialised (-32603); pygls dropped the first, second and last
      silently and answered the second with null;
    - notifications before `initialize` are dropped (the spec's rule), except `exit`;
    - a notification's future is dropped once its handler is done: pygls 2.1.1 keeps it in
      `_request_futures` under a fresh UUID for ever (the leak in docs/editors.md).
    """

    def __init__(self, server, converter):
        super().__init__(server, converter)
        self.initialize_received = False

    # --- reading: bytes -> message --------------------------------------------------

    def receive(self, body: bytes) -> None:
        """Decode one frame's body and handle it; whatever it holds, a request is answered."""
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError):
            self.send_error(None, PARSE_ERROR, "Parse error: the message is not JSON")
            return
        if not isinstance(raw, dict):
            self.send_error(None, INVALID_REQUEST, "Invalid request: a message must be a JSON object")
            return
        request_id = raw.get("id") if _valid_id(raw.get("id")) else None
        is_request = "id" in raw and "method" in raw
        is_response = "method" not in raw and ("result" in raw or "error" in raw)
        if raw.get("jsonrpc") != "2.0" or not isinstance(raw.get("method", ""), str) or ("method" not in raw and not is_response):
            if "id" in raw and not is_response:
                self.send_error(request_id, INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 request or notification")
            return
        if is_request and not _valid_id(raw["id"]):
            self.send_error(None, INVALID_REQUEST, "Invalid request: an id must be a string or an integer")
            return
        try:
            message = self.structure_message(raw)
        except Exception as error:  # noqa: BLE001 -- any params a client sends must get an answer
            if is_request:
                code = INVALID_PARAMS if isinstance(error, JsonRpcInvalidParams) else INVALID_REQUEST
                self.send_error(request_id, code, f"Invalid params for {raw['method'][:100]!r}")
            return
        self.handle_message(message)

    def handle_message(self, message) -> None:
        method = getattr(message, "method", None)
        is_request = method is not None and hasattr(message, "id")
        if method == types.INITIALIZE:
            self.initialize_received = True
        elif method is not None and method != types.EXIT and not self.initialize_received:
            if is_request:
                self.send_error(message.id, SERVER_NOT_INITIALIZED, "Server not initialized: send initialize first")
            return
        if self._shutdown and method != types.EXIT:
            if is_request:
                self.send_error(message.id, INVALID_REQUEST, "Invalid request: the server is shutting down (only exit is accepted)")
            return
        if method in (types.TEXT_DOCUMENT_DID_CHANGE, types.TEXT_DOCUMENT_DID_SAVE) and not self._server.is_open(message.params.text_document.uri):
            return  # about a document that is not open (never opened, closed, or dropped as too large): ignored quietly
        super().handle_message(message)

    # --- writing ---------------------------------------------------------------------

    def send_error(self, msg_id, code: int, message: str) -> None:
        self.send_json({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def send_json(self, data: dict) -> None:
        self._write_body(json.dumps(data))

    def _send_data(self, data) -> None:
        """pygls's, except that a response whose body cannot be serialised becomes an error
        response (pygls logged it and the client waited for ever)."""
        if not data:
            return
        try:
            body = json.dumps(data, default=self._serialize_message)
        except Exception as error:  # noqa: BLE001
            msg_id = getattr(data, "id", None)
            if hasattr(data, "result") or hasattr(data, "error"):
                self.send_error(msg_id if _valid_id(msg_id) else None, INTERNAL_ERROR, f"Internal error: the result cannot be sent ({type(error).__name__})")
            return
        self._write_body(body)

    def _write_body(self, body: str) -> None:
        if self.writer is None:
            return
        header = f"Content-Length: {len(body.encode(self.CHARSET))}\r\n\r\n" if self._include_headers else ""
        result = self.writer.write((header + body).encode(self.CHARSET))
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            asyncio.ensure_future(result)

    # --- the notification-future leak --------------------------------------------------

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        answers_request = isinstance(callback, partial) and callback.func == self._send_handler_result
        if answers_request:
            return  # pygls pops a request's future itself, when it sends the answer
        future = self._request_futures.get(msg_id)
        if future is None:
            return
        if future.done():
            self._request_futures.pop(msg_id, None)
        else:
            future.add_done_callback(lambda _: self._request_futures.pop(msg_id, None))


def _valid_id(value) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool) and (not isinstance(value, int) or abs(value) < 2**53)


class _StdinReader:
    """Blocking reads of stdin in a thread, each bounded: a line at most MAX_HEADER_LINE bytes,
    a read at most one chunk."""

    def __init__(self, stream, executor) -> None:
        self.stream, self.executor = stream, executor

    async def readline(self) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.stream.readline, MAX_HEADER_LINE)

    async def read(self, n: int) -> bytes:
        """Up to n bytes (n <= _CHUNK): fewer only at the end of the stream."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.stream.read, n)


class _StreamReader:
    """The same interface over an asyncio stream (a TCP connection)."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream

    async def readline(self) -> bytes:
        try:
            return await self.stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:
            return end.partial
        except asyncio.LimitOverrunError as over:
            # a header line longer than the stream's buffer limit: drop what was buffered and
            # hand back a piece without its newline, which the frame loop treats as a bad header
            return await self.stream.read(min(over.consumed, MAX_HEADER_LINE)) or b"?"

    async def read(self, n: int) -> bytes:
        try:
            return await self.stream.readexactly(n)
        except asyncio.IncompleteReadError as end:
            return end.partial


async def read_frames(reader, protocol: MemfitProtocol, stop: threading.Event) -> None:
    """The base protocol's framing (`Content-Length: N` headers, a blank line, N bytes), with
    every read bounded. A frame over MAX_MESSAGE_BYTES is answered with an error and its bytes
    are skipped a chunk at a time; a bad header line is ignored. Returns at the end of input."""
    while not stop.is_set():
        length: int | None = None
        bad_length = False
        while True:
            line = await reader.readline()
            if not line:
                return
            if line in (b"\r\n", b"\n"):
                break
            name, colon, value = line.partition(b":")
            if colon and name.strip().lower() == b"content-length":
                text = value.strip()
                if text.isdigit() and len(text) <= 20:
                    length = int(text)
                else:
                    bad_length = True
        if length is None:
            if bad_length:
                protocol.send_error(None, INVALID_REQUEST, "Invalid message: its Content-Length is not a byte count")
            continue  # nothing to read: a stray blank line, or a header block without a length
        if length > MAX_MESSAGE_BYTES:
            protocol.send_error(None, INVALID_REQUEST, f"Invalid message: {length:,} bytes is over the limit of {MAX_MESSAGE_BYTES:,} bytes; skipped")
            while length > 0:
                piece = await reader.read(min(length, _CHUNK))
                if not piece:
                    return
                length -= len(piece)
            continue
        parts, left = [], length
        while left > 0:
            piece = await reader.read(min(left, _CHUNK))
            if not piece:
                return
            parts.append(piece)
            left -= len(piece)
        try:
            protocol.receive(b"".join(parts))
        except SystemExit:
            raise
        except Exception:
            logging.getLogger(__name__).exception("memfit lsp: a message could not be handled")


def _strict_str(value, _type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


def strict_converter():
    """lsprotocol's converter, except that a string field takes only a string: cattrs would turn
    `"uri": 5` into "5" and answer about a document that was never named."""
    converter = default_converter()
    converter.register_structure_hook(str, _strict_str)
    return converter


class MemfitServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("memfit", __version__, protocol_cls=MemfitProtocol, converter_factory=strict_converter)
        self.documents: dict[str, Document] = {}
        self.debounce = DEFAULT_DEBOUNCE_MS / 1000
        self.exit_code = 0
        self.max_file_size = DEFAULT_MAX_FILE_SIZE  # the CLI's limit on a config; a bigger document is not analysed
        self.analysis_pool = ThreadPoolExecutor(max_workers=ANALYSIS_THREADS, thread_name_prefix="memfit-analysis")

    def is_open(self, uri: str) -> bool:
        """Only documents the client opened are analysed: their text is the client's. A change or
        save of anything else is ignored, so no client can make the server read a path
        (file:///dev/zero) from disk."""
        return isinstance(uri, str) and unquote(uri) in self.workspace.text_documents

    def opened_text(self, uri: str):
        return self.workspace.text_documents.get(unquote(uri)) if isinstance(uri, str) else None

    # --- transport ----------------------------------------------------------------------

    def start_io(self, stdin=None, stdout=None) -> None:
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        reader = _StdinReader(stdin or sys.stdin.buffer, self.thread_pool)
        try:
            asyncio.run(read_frames(reader, self.protocol, self._stop_event))
        except SystemExit as stop:  # `exit`: 0 after shutdown, 1 without (the spec's codes)
            self.exit_code = stop.code if isinstance(stop.code, int) else 1
        except (BrokenPipeError, KeyboardInterrupt):
            pass
        finally:
            self.shutdown()

    def start_tcp(self, host: str, port: int) -> None:
        self._stop_event = stop = threading.Event()

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.protocol.set_writer(writer)
            await read_frames(_StreamReader(reader), self.protocol, stop)
            self.shutdown()

        async def main() -> None:
            self._server = await asyncio.start_server(connection, host, port, limit=MAX_HEADER_LINE * 2)
            addresses = ", ".join(str(sock.getsockname()) for sock in self._server.sockets)
            logging.getLogger("pygls.server").info(f"Serving on {addresses}")
            async with self._server:
                await self._server.serve_forever()

        try:
            asyncio.run(main())
        except SystemExit as stop:
            self.exit_code = stop.code if isinstance(stop.code, int) else 1
        except asyncio.CancelledError:
            pass

    # --- analysis -------------------------------------------------------------------

    def analyse(self, uri: str) -> asyncio.Task:
        """Check the document's current text off the event loop and publish the diagnostics.

        Returns the analysis task (its result: the Document, or None). Analyses of one document run
        one after another (a new one waits for the running one); one that starts when the text is
        the one last analysed does nothing, so a burst of edits costs the running analysis and one
        of the latest text. Other documents' analyses and requests never wait for it."""
        state = self.documents.setdefault(uri, Document())
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.task = asyncio.ensure_future(self._analysis(uri, state.task))
        return state.task

    async def _analysis(self, uri: str, previous: asyncio.Task | None) -> Document | None:
        if previous is not None and not previous.done():
            try:
                await asyncio.shield(previous)
            except Exception:  # noqa: BLE001 -- its failure is its own
                pass
        state = self.documents.get(uri)
        document = self.opened_text(uri)
        if document is None or state is None:
            self.documents.pop(uri, None)
            return None
        text, version = document.source, document.version
        if state.analysed is not None and state.analysed[0] == version and state.analysed[1] is text:
            return state  # superseded: a later analysis already covered this text
        state.analysed = (version, text)
        path = to_fs_path(uri) or uri
        result = await asyncio.get_running_loop().run_in_executor(self.analysis_pool, _check, text, path)
        if self.documents.get(uri) is not state:
            return None  # closed (or reopened) while it ran: nothing to say
        if state.task is not asyncio.current_task() and self._text_changed(uri, text):
            return state  # superseded while it ran: the queued analysis of the newer text publishes
        if result.skipped:
            # not (or no longer) a memfit config: say nothing, except to take back what we said
            fresh = Document(task=state.task, analysed=state.analysed)
            self.documents[uri] = fresh
            if state.published:
                self.publish(uri, None, version)
            return None
        analysis = Analysis(text, result, version)
        state.latest = analysis
        if result.config is not None:
            state.good = analysis
        self.publish(uri, analysis, version)
        state.finished = asyncio.get_running_loop().time()
        return state

    def _text_changed(self, uri: str, text: str) -> bool:
        document = self.opened_text(uri)
        return document is None or document.source is not text

    def too_large(self, uri: str) -> bool:
        """A document over the CLI's size limit is dropped from the workspace (its text is not kept,
        so edits cannot grow it without bound), told with one io diagnostic and not analysed;
        later changes to it are ignored until it is opened again."""
        document = self.opened_text(uri)
        if document is None:
            return False
        source = document.source
        if len(source) <= self.max_file_size // 4 or len(source.encode("utf-8", "surrogatepass")) <= self.max_file_size:
            return False
        size = len(source.encode("utf-8", "surrogatepass"))
        self.workspace.remove_text_document(uri)
        state = self.documents.pop(uri, None)
        if state is not None and state.timer is not None:
            state.timer.cancel()
        self.documents[uri] = Document(published=True)
        message = f"this document is {size:,} bytes, over the {self.max_file_size:,}-byte limit on a config: it is not analysed (reopen it once smaller)"
        problem = diagnostic(FILE_START, codes.IO, message)
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=uri,
                diagnostics=[types.Diagnostic(range=_plain_range(problem.range), message=message, severity=types.DiagnosticSeverity.Error, code=codes.IO, source="memfit")],
            )
        )
        return True

    def publish(self, uri: str, analysis: Analysis | None, version: int | None) -> None:
        diagnostics = [] if analysis is None else [self.diagnostic(analysis, d) for d in analysis.result.diagnostics]
        self.documents.setdefault(uri, Document()).published = bool(diagnostics)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=version))

    def diagnostic(self, analysis: Analysis, d) -> types.Diagnostic:
        if d.file is None:
            return types.Diagnostic(
                range=self.to_client(analysis.lines, d.range),
                message=d.message,
                severity=SEVERITY.get(d.severity, types.DiagnosticSeverity.Error),
                code=d.code,
                source="memfit",
            )
        # a problem inside a referenced file: shown on the key that refers to it, linked to the
        # place in that file (its columns are code points: that file's text is not open here)
        return types.Diagnostic(
            range=self.to_client(analysis.lines, d.related or d.range),
            message=d.message,
            severity=SEVERITY.get(d.severity, types.DiagnosticSeverity.Error),
            code=d.code,
            source="memfit",
            related_information=[
                types.DiagnosticRelatedInformation(
                    location=types.Location(uri=from_fs_path(d.file) or d.file, range=_plain_range(d.range)),
                    message=f"{d.code}: {d.message}",
                )
            ],
        )

    def changed(self, uri: str) -> None:
        """A change after a quiet spell is analysed at once (its latency is the analysis alone);
        changes that follow within the debounce delay -- typing, or edits that queued up while
        an analysis ran -- restart a timer instead, so a burst costs one more analysis, of the
        latest text."""
        state = self.documents.setdefault(uri, Document())
        loop = asyncio.get_running_loop()
        if state.timer is None and loop.time() - state.finished >= self.debounce:
            self.analyse(uri)
            return
        if state.timer is not None:
            state.timer.cancel()
        state.timer = loop.call_later(self.debounce, self._fire, uri)

    def _fire(self, uri: str) -> None:
        state = self.documents.get(uri)
        if state is not None:
            state.timer = None
            self.analyse(uri)

    async def current(self, uri: str) -> Document | None:
        """The document's state for a request, first flushing a pending (debounced) analysis and
        waiting for this document's own analysis, so that hover and hints never answer from a text
        older than the one on screen. Another document's analysis is never waited for."""
        state = self.documents.get(uri) if isinstance(uri, str) else None
        if state is None:
            return None
        if state.timer is not None:
            await self.analyse(uri)
        elif state.task is not None and not state.task.done():
            await asyncio.shield(state.task)
        return self.documents.get(uri)

    # --- positions ------------------------------------------------------------------

    @property
    def codec(self):
        return self.workspace.position_codec

    def to_client(self, lines: list[str], where) -> types.Range:
        return types.Range(
            start=self.position_to_client(lines, where.start_line, where.start_character),
            end=self.position_to_client(lines, where.end_line, where.end_character),
        )

    def position_to_client(self, lines: list[str], line: int, character: int) -> types.Position:
        if line >= len(lines):
            return types.Position(line=line, character=0)
        return types.Position(line=line, character=self.codec.client_num_units(lines[line][:character]))

    def position_from_client(self, lines: list[str], position: types.Position) -> tuple[int, int]:
        if position.line >= len(lines):
            return position.line, 0
        text, units, column = lines[position.line], 0, 0
        while column < len(text) and units < position.character:
            units += self.codec.client_num_units(text[column])
            column += 1
        return position.line, column


def settings_of(path: str) -> str | None:
    """The settings file that governs a document (read/native/settings.find), absolute."""
    from memfit.read.native.settings import find

    found = find(os.path.dirname(path))[0]
    return os.path.abspath(found) if found else None


def make_server() -> MemfitServer:
    server = MemfitServer()
    _document_sync(server)
    _views(server)
    _edits(server)
    return server


def _document_sync(server: MemfitServer) -> None:
    """Opening, changing, saving and closing a document, and the files its check read changing on disk."""

    @server.feature(types.INITIALIZE)
    def initialize(ls: MemfitServer, params: types.InitializeParams) -> None:
        options = params.initialization_options
        if isinstance(options, dict) and isinstance(options.get("debounce_ms"), (int, float)) and options["debounce_ms"] >= 0:
            ls.debounce = options["debounce_ms"] / 1000
        limit = options.get("max_file_size") if isinstance(options, dict) else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            ls.max_file_size = limit  # as --max-file-size on the command line

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: MemfitServer, params: types.DidOpenTextDocumentParams) -> None:
        if not ls.too_large(params.text_document.uri):
            ls.analyse(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: MemfitServer, params: types.DidChangeTextDocumentParams) -> None:
        if ls.is_open(params.text_document.uri) and not ls.too_large(params.text_document.uri):
            ls.changed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(ls: MemfitServer, params: types.DidSaveTextDocumentParams) -> None:
        if ls.is_open(params.text_document.uri):
            ls.analyse(params.text_document.uri)

    @server.feature(types.INITIALIZED)
    def initialized(ls: MemfitServer, params: types.InitializedParams) -> None:
        """Ask the client to tell us when the files a check reads change (a model's config.json, a DeepSpeed JSON,
        a launch config, the settings), where it can watch files for a server."""
        capabilities = getattr(ls, "client_capabilities", None)
        watched = getattr(getattr(capabilities, "workspace", None), "did_change_watched_files", None)
        if watched is None or not getattr(watched, "dynamic_registration", False):
            return
        watchers = [types.FileSystemWatcher(glob_pattern=glob) for glob in ("**/*.json", "**/*.yaml", "**/*.yml", "**/pyproject.toml", "**/memfit.toml")]
        ls.client_register_capability(types.RegistrationParams(registrations=[types.Registration(
            id="memfit-referenced-files", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=types.DidChangeWatchedFilesRegistrationOptions(watchers=watchers))]))

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: MemfitServer, params: types.DidChangeWatchedFilesParams) -> None:
        """A file an open document's check read changed on disk (its config.json, DeepSpeed JSON, launch config, or
        the settings file that governs it): the document is checked again, though its own text did not change."""
        changed = {os.path.abspath(to_fs_path(event.uri) or event.uri) for event in params.changes}
        for uri, state in list(ls.documents.items()):
            if not ls.is_open(uri) or state is None:
                continue
            path = os.path.abspath(to_fs_path(uri) or uri)
            result = state.latest.result if state.latest is not None else None
            read = set(getattr(result, "references", None) or [])
            settings_file = settings_of(path)
            governs = settings_file is not None and settings_file in changed
            settings_named = any(os.path.basename(c) in ("pyproject.toml", "memfit.toml") and path.startswith(os.path.dirname(c) + os.sep) for c in changed)
            if governs or settings_named or any(r == c or c.startswith(os.path.join(r, "")) for r in read for c in changed):
                state.analysed = None  # the same text, read against new files: not a superseded analysis
                ls.analyse(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: MemfitServer, params: types.DidCloseTextDocumentParams) -> None:
        state = ls.documents.pop(params.text_document.uri, None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
        if state.latest is not None or state.published:
            ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


def _views(server: MemfitServer) -> None:
    """What the editor shows of a document's analysis: hover, inlay hints, the code lens and its command."""

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(ls: MemfitServer, params: types.HoverParams) -> types.Hover | None:
        state = await ls.current(params.text_document.uri)
        view = state.view if state is not None else None
        if view is None:
            return None
        line, character = ls.position_from_client(view.lines, params.position)
        found = await asyncio.get_running_loop().run_in_executor(ls.analysis_pool, view.hover, line, character)  # may run a fit search
        if found is None:
            return None
        return types.Hover(
            contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=found.markdown),
            range=ls.to_client(view.lines, found.range),
        )

    @server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=False))
    async def inlay_hints(ls: MemfitServer, params: types.InlayHintParams) -> list[types.InlayHint] | None:
        state = await ls.current(params.text_document.uri)
        view = state.view if state is not None else None
        if view is None:
            return None
        start = ls.position_from_client(view.lines, params.range.start)
        end = ls.position_from_client(view.lines, params.range.end)
        hints = []
        stale = view is not state.latest
        found = await asyncio.get_running_loop().run_in_executor(ls.analysis_pool, lambda: list(view.hints(start[0], end[0], stale=stale)))
        for hint in found:
            if not start <= (hint.line, hint.character) <= end:
                continue
            hints.append(
                types.InlayHint(
                    position=ls.position_to_client(view.lines, hint.line, hint.character),
                    label=hint.label,
                    padding_left=True,
                    tooltip=hint.tooltip,
                )
            )
        return hints

    @server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))
    async def code_lens(ls: MemfitServer, params: types.CodeLensParams) -> list[types.CodeLens] | None:
        state = await ls.current(params.text_document.uri)
        view = state.view if state is not None else None
        if view is None or view.summary() is None or view.summary_range() is None:
            return None
        title = view.summary() + (STALE if view is not state.latest else "")
        lens_range = ls.to_client(view.lines, view.summary_range())
        return [
            types.CodeLens(
                range=lens_range, command=types.Command(title=title, command=SUMMARY_COMMAND, arguments=[params.text_document.uri])
            )
        ]

    @server.command(SUMMARY_COMMAND)
    def footprint(ls: MemfitServer, *arguments) -> dict | None:
        # pygls 2 passes a command's arguments spread out: the code lens sends [uri]
        uri = arguments[0] if arguments else None
        state = ls.documents.get(uri) if isinstance(uri, str) else None
        view = state.view if state is not None else None
        return dict(view.config.footprint) if view is not None else None


def _edits(server: MemfitServer) -> None:
    """What the editor offers to write: quick fixes and completions."""

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
    async def code_action(ls: MemfitServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        """Quick fixes on the budget diagnostics: each fix's edit, applied as a workspace edit."""
        asked = [d for d in params.context.diagnostics if d.code in FIXABLE and d.source == "memfit"]
        if not asked:
            return None
        uri = params.text_document.uri
        state = await ls.current(uri)
        analysis = state.latest if state is not None else None
        if analysis is None or analysis.config is None:
            return None
        actions = []
        fixes = await asyncio.get_running_loop().run_in_executor(ls.analysis_pool, lambda: analysis.fixes)  # what-if checks: off the loop
        for i, fix in enumerate(f for f in fixes if f.edits):  # a fix without a safe edit is shown by --suggest in words only
            edits = [types.TextEdit(range=ls.to_client(analysis.lines, e.range), new_text=e.new_text) for e in fix.edits]
            actions.append(
                types.CodeAction(
                    title=f"memfit: {fix.title} (total {human(fix.total)})",
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=asked,
                    is_preferred=i == 0,
                    edit=types.WorkspaceEdit(changes={uri: edits}),
                )
            )
        return actions

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[" "]))
    def completion(ls: MemfitServer, params: types.CompletionParams) -> types.CompletionList | None:
        document = ls.opened_text(params.text_document.uri)
        if document is None:
            return None  # never a file the client did not open (get_text_document reads the disk)
        text = document.source
        if not has_marker(text):
            return None
        lines = split_lines(text)
        line, character = ls.position_from_client(lines, params.position)
        context = completion_context(lines, line, character)
        if context is None:
            return None
        vocabulary, start = context
        edit_range = types.Range(start=ls.position_to_client(lines, line, start), end=ls.position_to_client(lines, line, character))
        items = [
            types.CompletionItem(
                label=choice.label,
                kind=COMPLETION_KIND[choice.kind],
                detail=choice.detail,
                text_edit=types.TextEdit(range=edit_range, new_text=choice.label),
            )
            for choice in choices(vocabulary)
        ]
        return types.CompletionList(is_incomplete=False, items=items)


_SOCKET_NAME = re.compile(r"\('([^']*)', (\d+)")


class _Announce(logging.Handler):
    """pygls logs the bound address once listening; say it on stderr, so that a client (or a
    person who asked for port 0) knows where to connect and that it can connect now."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Serving on "):
            # "Serving on ('127.0.0.1', 2087), ..." (socket names) -> 127.0.0.1:2087
            where = ", ".join(f"{host}:{port}" for host, port in _SOCKET_NAME.findall(message)) or message
            sys.stderr.write(f"memfit lsp: listening on {where}\n")
            sys.stderr.flush()


def _announce_address() -> None:
    log = logging.getLogger("pygls.server")
    log.setLevel(logging.INFO)
    log.addHandler(_Announce(logging.INFO))


def serve(args) -> int:
    server = make_server()
    # What is alive now -- the modules, classes and functions of pygls, lsprotocol, cattrs and memfit, about 50,000
    # objects the collector tracks -- lives as long as the server: out of every later collection's walk (a full one
    # spent two thirds of its time on them, and full collections fall inside requests: docs/speed.md).
    gc.freeze()
    tcp = getattr(args, "tcp", None)
    if tcp:
        host, _, port = tcp.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            sys.stderr.write(f"memfit lsp: --tcp wants HOST:PORT (e.g. 127.0.0.1:2087; port 0 picks a free one), not {tcp!r}\n")
            return 2
        _announce_address()
        server.start_tcp(host, int(port))
    else:
        server.start_io()
    return server.exit_code
