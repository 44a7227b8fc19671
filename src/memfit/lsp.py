"""`memfit lsp`: a Language Server Protocol shell over check() (pygls 2, lsprotocol types).

Handlers only translate: LSP positions <-> the core's code-point positions (in the encoding
negotiated with the client), Diagnostic -> lsp Diagnostic, editor.py's hover/hints/lens ->
LSP's. Diagnostics are exactly check.check(text, path, Options(skip_unrecognized=True)).
Imported only by `memfit lsp` (lsp_entry), never on the CLI/hook path.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from dataclasses import dataclass, field

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from . import __version__
from .check import Options, Result, check, has_marker
from .editor import STALE, Analysis, choices, completion_context, split_lines
from .fixes import FIXABLE
from .runner import internal_error
from .units import human

DEFAULT_DEBOUNCE_MS = 50  # edits closer together than this coalesce into one analysis
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

    @property
    def view(self) -> Analysis | None:
        if self.latest is not None and self.latest.config is not None:
            return self.latest
        return self.good


class MemfitServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("memfit", __version__)
        self.documents: dict[str, Document] = {}
        self.debounce = DEFAULT_DEBOUNCE_MS / 1000

    # --- analysis -------------------------------------------------------------------

    def analyse(self, uri: str) -> Document | None:
        """Check the document's current text now and publish the diagnostics."""
        state = self.documents.setdefault(uri, Document())
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        document = self.workspace.get_text_document(uri)
        text = document.source
        path = to_fs_path(uri) or uri
        try:
            result = check(text, path, OPTIONS)
        except Exception as error:  # noqa: BLE001 -- a bug in memfit is a diagnostic, never a dead server
            result = Result(path, [internal_error(error)])
        if result.skipped:
            # not (or no longer) a memfit config: say nothing, except to take back what we said
            self.documents[uri] = Document()
            if state.published:
                self.publish(uri, None, document.version)
            return None
        analysis = Analysis(text, result, document.version)
        state.latest = analysis
        if result.config is not None:
            state.good = analysis
        self.publish(uri, analysis, document.version)
        state.finished = asyncio.get_running_loop().time()
        return state

    def publish(self, uri: str, analysis: Analysis | None, version: int | None) -> None:
        diagnostics = [] if analysis is None else [self.diagnostic(analysis, d) for d in analysis.result.diagnostics]
        self.documents.setdefault(uri, Document()).published = bool(diagnostics)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=version))

    def diagnostic(self, analysis: Analysis, d) -> types.Diagnostic:
        return types.Diagnostic(
            range=self.to_client(analysis.lines, d.range),
            message=d.message,
            severity=SEVERITY.get(d.severity, types.DiagnosticSeverity.Error),
            code=d.code,
            source="memfit",
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

    def current(self, uri: str) -> Document | None:
        """The document's state for a request, first flushing a pending (debounced) analysis
        so that hover and hints never answer from a text older than the one on screen."""
        state = self.documents.get(uri)
        if state is not None and state.timer is not None:
            state = self.analyse(uri)
        return state

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


def make_server() -> MemfitServer:
    server = MemfitServer()

    @server.feature(types.INITIALIZE)
    def initialize(ls: MemfitServer, params: types.InitializeParams) -> None:
        options = params.initialization_options
        if isinstance(options, dict) and isinstance(options.get("debounce_ms"), (int, float)) and options["debounce_ms"] >= 0:
            ls.debounce = options["debounce_ms"] / 1000

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: MemfitServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.analyse(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: MemfitServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.changed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(ls: MemfitServer, params: types.DidSaveTextDocumentParams) -> None:
        ls.analyse(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: MemfitServer, params: types.DidCloseTextDocumentParams) -> None:
        state = ls.documents.pop(params.text_document.uri, None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
        if state.latest is not None or state.published:
            ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: MemfitServer, params: types.HoverParams) -> types.Hover | None:
        state = ls.current(params.text_document.uri)
        view = state.view if state is not None else None
        if view is None:
            return None
        line, character = ls.position_from_client(view.lines, params.position)
        found = view.hover(line, character)
        if found is None:
            return None
        return types.Hover(
            contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=found.markdown),
            range=ls.to_client(view.lines, found.range),
        )

    @server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=False))
    def inlay_hints(ls: MemfitServer, params: types.InlayHintParams) -> list[types.InlayHint] | None:
        state = ls.current(params.text_document.uri)
        view = state.view if state is not None else None
        if view is None:
            return None
        start = ls.position_from_client(view.lines, params.range.start)
        end = ls.position_from_client(view.lines, params.range.end)
        hints = []
        for hint in view.hints(start[0], end[0], stale=view is not state.latest):
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
    def code_lens(ls: MemfitServer, params: types.CodeLensParams) -> list[types.CodeLens] | None:
        state = ls.current(params.text_document.uri)
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
    def footprint(ls: MemfitServer, arguments) -> dict | None:
        uri = arguments[0] if arguments else None
        state = ls.documents.get(uri) if isinstance(uri, str) else None
        view = state.view if state is not None else None
        return dict(view.config.footprint) if view is not None else None

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
    def code_action(ls: MemfitServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        """Quick fixes on the budget diagnostics: each fix's edit, applied as a workspace edit."""
        asked = [d for d in params.context.diagnostics if d.code in FIXABLE and d.source == "memfit"]
        if not asked:
            return None
        uri = params.text_document.uri
        state = ls.current(uri)
        analysis = state.latest if state is not None else None
        if analysis is None or analysis.config is None:
            return None
        actions = []
        for i, fix in enumerate(analysis.fixes):
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
        document = ls.workspace.get_text_document(params.text_document.uri)
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

    return server


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
    return 0
