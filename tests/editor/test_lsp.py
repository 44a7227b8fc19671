"""`memfit lsp` end to end: a real LSP client (pytest-lsp) drives `python -m memfit lsp` over
stdio. Notifications are awaited (a queue per document fed by the client's publishDiagnostics
handler); nothing waits by sleeping. Expected numbers are worked out by hand in comments."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
from pathlib import Path

import needs
import pytest

needs.module("pygls")
pytest_lsp = needs.module("pytest_lsp")

from lsprotocol import types
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "memfit", "lsp"]
TIMEOUT = 20  # a safety net against a hung server, never the synchronisation itself

# fc.weight [512, 6400]: 3,276,800 elements; bf16 6,553,600 B, f32 grad 13,107,200 B,
#   adam 2 x f32 26,214,400 B -> 45,875,200 B
# fc.bias [512] x 12: 12,288 + 24,576 + 49,152 = 86,016 B
# emb [1000, 64] frozen bf16: 128,000 B
# activations [32, 512] f32: 65,536 B
# total 46,154,752 B; budget 1 GiB - 64 MiB = 1,006,632,960 B; headroom 960,478,208 B; 4.6%
BASE = """\
memfit: 1
name: tiny
device: {memory: 1 GiB, reserve: 64 MiB}
optimizer: adam
dtypes: {parameters: bfloat16}
parameters:
  - {name: fc.weight, shape: [512, 6400]}
  - {name: fc.bias, shape: [512], count: 12}
  - {name: emb, shape: [1000, 64], trainable: false}
activations:
  - [32, 512]
"""


def make_client() -> LanguageClient:
    """pytest-lsp's client, whose publishDiagnostics handler also queues each notification per uri."""
    client = LanguageClient(converter_factory=default_converter)
    client.published = collections.defaultdict(asyncio.Queue)

    def publish(c: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        c.diagnostics[params.uri] = params.diagnostics
        c.published[params.uri].put_nowait(list(params.diagnostics))

    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES, types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: publish})
    return client


CONFIG = ClientServerConfig(server_command=SERVER, client_factory=make_client)


def capabilities(encodings=None) -> types.ClientCapabilities:
    return types.ClientCapabilities(
        general=types.GeneralClientCapabilities(position_encodings=encodings) if encodings else None,
        text_document=types.TextDocumentClientCapabilities(
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True),
            hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown]),
            inlay_hint=types.InlayHintClientCapabilities(),
            code_lens=types.CodeLensClientCapabilities(),
            completion=types.CompletionClientCapabilities(completion_item=types.ClientCompletionItemOptions(snippet_support=False)),
            publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
        ),
    )


async def _start(client: LanguageClient, encodings=None, options=None) -> types.InitializeResult:
    return await client.initialize_session(types.InitializeParams(capabilities=capabilities(encodings), initialization_options=options))


@pytest_lsp.fixture(config=CONFIG)
async def client(lsp_client: LanguageClient):
    lsp_client.init = await _start(lsp_client)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=CONFIG)
async def client_utf8(lsp_client: LanguageClient):
    lsp_client.init = await _start(lsp_client, ["utf-8", "utf-16"])
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=CONFIG)
async def client_utf32(lsp_client: LanguageClient):
    lsp_client.init = await _start(lsp_client, ["utf-32"])
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=CONFIG)
async def patient_client(lsp_client: LanguageClient):
    """A server whose debounce is a minute: only a save or a request makes it analyse a change."""
    lsp_client.init = await _start(lsp_client, options={"debounce_ms": 60_000})
    yield
    await lsp_client.shutdown_session()


# --- helpers ---------------------------------------------------------------------------------


def uri_of(tmp_path: Path, name: str) -> str:
    return (tmp_path / name).as_uri()


def open_doc(client: LanguageClient, uri: str, text: str, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="yaml", version=version, text=text))
    )


def replace(client: LanguageClient, uri: str, text: str, version: int) -> None:
    change = types.TextDocumentContentChangeWholeDocument(text=text)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(uri=uri, version=version), [change])
    )


async def published(client: LanguageClient, uri: str) -> list:
    return await asyncio.wait_for(client.published[uri].get(), TIMEOUT)


def span(d) -> tuple:
    return (d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character)


def at(text: str, line: int, needle: str, offset: int = 0) -> types.Position:
    return types.Position(line=line, character=text.splitlines()[line].index(needle) + offset)


async def hover(client: LanguageClient, uri: str, position: types.Position):
    return await client.text_document_hover_async(types.HoverParams(types.TextDocumentIdentifier(uri=uri), position))


async def hints(client: LanguageClient, uri: str, first: int, last: int, last_character: int = 0):
    whole = types.Range(start=types.Position(line=first, character=0), end=types.Position(line=last, character=last_character))
    return await client.text_document_inlay_hint_async(
        types.InlayHintParams(text_document=types.TextDocumentIdentifier(uri=uri), range=whole)
    )


async def complete(client: LanguageClient, uri: str, text: str, line: int):
    position = types.Position(line=line, character=len(text.splitlines()[line]))
    return await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)
    )


# --- diagnostics -------------------------------------------------------------------------------

BAD = """\
memfit: 1
device: {memory: 24 GiB}
optimizer: adam
dtypes: {parameters: bfloat61}
parameters:
  - {name: w, shape: [2, -3]}
"""


async def test_open_publishes_exactly_the_cli_diagnostics(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD, encoding="utf-8")
    uri = path.as_uri()
    open_doc(client, uri, BAD)
    diagnostics = await published(client, uri)

    assert [(span(d), d.code, d.source, d.severity) for d in diagnostics] == [
        ((3, 21, 3, 29), "unknown-dtype", "memfit", types.DiagnosticSeverity.Error),  # 'bfloat61'
        ((5, 25, 5, 27), "schema", "memfit", types.DiagnosticSeverity.Error),  # '-3'
    ]
    # the same function as the CLI: the json report of the same file says exactly this (ASCII, so
    # UTF-16 columns are the CLI's code-point columns)
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memfit", "check", "--format", "json", str(path), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await cli.communicate()
    assert cli.returncode == 1
    expected = json.loads(out)["files"][0]["diagnostics"]
    names = {types.DiagnosticSeverity.Error: "error", types.DiagnosticSeverity.Warning: "warning"}
    got = [
        {
            "range": {"start": {"line": a, "character": b}, "end": {"line": c, "character": e}},
            "severity": names[d.severity],
            "code": d.code,
            "message": d.message,
        }
        for d in diagnostics
        for a, b, c, e in [span(d)]
    ]
    assert got == expected


async def test_change_updates_diagnostics_until_the_budget_is_exceeded(client: LanguageClient, tmp_path: Path):
    uri = uri_of(tmp_path, "model.yaml")
    open_doc(client, uri, BASE)
    assert await published(client, uri) == []

    # fc.weight 100x wider: 327,680,000 elements x (2 + 4 + 8) B = 4,587,520,000 B, plus the
    # other tensors' 279,552 B = 4,587,799,552 B; over the 1,006,632,960 B budget by 3,581,166,592 B
    bigger = BASE.replace("[512, 6400]", "[512, 640000]")
    replace(client, uri, bigger, 2)
    (exceeded,) = await published(client, uri)
    assert exceeded.code == "budget-exceeded"
    assert exceeded.severity == types.DiagnosticSeverity.Error
    assert span(exceeded) == (2, 17, 2, 22)  # the '1 GiB' of device.memory
    assert "total 4,587,799,552 B (4.27 GiB)" in exceeded.message
    assert "by 3,581,166,592 B (3.34 GiB)" in exceeded.message

    # an incremental edit back: '640000' -> '6400' (delete two characters)
    line6 = bigger.splitlines()[6]
    start = line6.index("640000") + 4
    edit = types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(line=6, character=start), end=types.Position(line=6, character=start + 2)), text=""
    )
    client.text_document_did_change(types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(uri=uri, version=3), [edit]))
    assert await published(client, uri) == []


async def test_typing_fast_is_one_analysis_of_the_latest_text(patient_client: LanguageClient, tmp_path: Path):
    client = patient_client
    uri = uri_of(tmp_path, "typing.yaml")
    open_doc(client, uri, BASE)
    assert await published(client, uri) == []

    # five edits in a row, each a different budget; only the last one's analysis is published:
    # 100 MiB - 64 MiB = 37,748,736 B, less than the 46,154,752 B total
    for version, memory in enumerate(["2 GiB", "3 GiB", "512 MiB", "700 MiB", "100 MiB"], start=2):
        replace(client, uri, BASE.replace("1 GiB", memory), version)
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    (diagnostic,) = await published(client, uri)
    assert diagnostic.code == "budget-exceeded"
    assert "the budget 37,748,736 B (36.00 MiB)" in diagnostic.message
    assert client.published[uri].empty()

    # more typing, then a request: the pending analysis runs before the answer, exactly once
    for version, memory in enumerate(["2 GiB", "4 GiB"], start=7):
        replace(client, uri, BASE.replace("1 GiB", memory), version)
    answer = await hover(client, uri, at(BASE, 2, "1 GiB"))
    assert await published(client, uri) == []
    assert client.published[uri].empty()
    # 4 GiB - 64 MiB = 4,227,858,432 B
    assert "**budget**: 4,227,858,432 B (3.94 GiB)" in answer.contents.value


async def test_close_clears_and_other_yaml_is_left_alone(client: LanguageClient, tmp_path: Path):
    other = uri_of(tmp_path, "pod.yaml")
    open_doc(client, other, "apiVersion: v1\nkind: Pod\nmetadata: {name: x\n")  # not memfit, and broken
    uri = uri_of(tmp_path, "bad.yaml")
    open_doc(client, uri, BAD)
    assert len(await published(client, uri)) == 2
    # the server handles messages in order, so the pod's diagnostics would have come first
    assert client.published[other].empty() and other not in client.diagnostics
    assert await hover(client, other, types.Position(line=1, character=2)) is None
    assert await hints(client, other, 0, 3) is None

    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    assert await published(client, uri) == []


async def test_a_document_that_stops_being_a_config_is_cleared(client: LanguageClient, tmp_path: Path):
    uri = uri_of(tmp_path, "was.yaml")
    open_doc(client, uri, BAD)
    assert len(await published(client, uri)) == 2
    replace(client, uri, BAD.replace("memfit: 1", "kind: other"), 2)
    assert await published(client, uri) == []


# --- positions in the client's encoding ------------------------------------------------------

EMOJI = """\
memfit: 1
device: {memory: 1 GiB}
optimizer: sgd
parameters:
  - {name: "😀 漢字 weight", shape: [4, -8]}
"""
# '-8' is at code points 37..39 of line 4; before it, one astral emoji (2 UTF-16 units,
# 4 UTF-8 bytes) and two CJK characters (1 UTF-16 unit, 3 UTF-8 bytes each)


async def test_non_ascii_name_before_a_shape_utf16(client: LanguageClient, tmp_path: Path):
    assert client.init.capabilities.position_encoding in (None, types.PositionEncodingKind.Utf16)
    uri = uri_of(tmp_path, "emoji.yaml")
    open_doc(client, uri, EMOJI)
    (diagnostic,) = await published(client, uri)
    assert diagnostic.code == "schema"
    assert span(diagnostic) == (4, 38, 4, 40)


async def test_non_ascii_name_before_a_shape_utf8(client_utf8: LanguageClient, tmp_path: Path):
    assert client_utf8.init.capabilities.position_encoding == types.PositionEncodingKind.Utf8
    uri = uri_of(tmp_path, "emoji.yaml")
    open_doc(client_utf8, uri, EMOJI)
    (diagnostic,) = await published(client_utf8, uri)
    assert span(diagnostic) == (4, 44, 4, 46)


async def test_non_ascii_name_before_a_shape_utf32(client_utf32: LanguageClient, tmp_path: Path):
    assert client_utf32.init.capabilities.position_encoding == types.PositionEncodingKind.Utf32
    uri = uri_of(tmp_path, "emoji.yaml")
    open_doc(client_utf32, uri, EMOJI)
    (diagnostic,) = await published(client_utf32, uri)
    assert span(diagnostic) == (4, 37, 4, 39)


async def test_non_ascii_hint_and_hover_positions_utf16(client: LanguageClient, tmp_path: Path):
    text = EMOJI.replace("-8", "8")
    uri = uri_of(tmp_path, "emoji.yaml")
    open_doc(client, uri, text)
    assert await published(client, uri) == []
    # the shape '[4, 8]' ends at code point 39 = UTF-16 unit 40; 32 elements x 4 B = 128 B
    (hint,) = await hints(client, uri, 4, 5)
    assert (hint.position.line, hint.position.character) == (4, 40)
    assert hint.label == "128 B (256 B in training)"  # sgd: no state; a float32 gradient
    # a requested range is read in UTF-16 too: ending at unit 39 (code point 38) leaves the hint out
    assert list(await hints(client, uri, 4, 4, 39)) == []
    assert len(await hints(client, uri, 4, 4, 40)) == 1
    # the '8' is code point 37 = UTF-16 unit 38; its tensor's item spans code points 4..40 = units 4..41
    answer = await hover(client, uri, types.Position(line=4, character=38))
    assert answer.contents.value.startswith("**😀 漢字 weight**: parameter [4, 8]")
    assert span(answer) == (4, 4, 4, 41)


# --- hover -----------------------------------------------------------------------------------


async def test_hover_tensor_budget_dtype_and_optimizer(client: LanguageClient, tmp_path: Path):
    uri = uri_of(tmp_path, "model.yaml")
    open_doc(client, uri, BASE)
    await published(client, uri)

    tensor = await hover(client, uri, at(BASE, 6, "6400", 1))
    assert tensor.contents.kind == types.MarkupKind.Markdown
    assert tensor.contents.value.splitlines() == [
        "**fc.weight**: parameter [512, 6400]",
        "3,276,800 elements",
        "",
        "- parameter (bfloat16, 2 bytes per element): 6,553,600 B (6.25 MiB)",
        "- gradient (float32, 4 bytes per element): 13,107,200 B (12.50 MiB)",
        "- optimizer state (adam: 2 × float32, 4 bytes per element): 26,214,400 B (25.00 MiB)",
        "- together: 45,875,200 B (43.75 MiB)",
    ]
    line6 = BASE.splitlines()[6]
    assert span(tensor) == (6, line6.index("{"), 6, len(line6))  # the whole item

    frozen = await hover(client, uri, at(BASE, 8, "emb"))
    assert "- parameter (bfloat16, 2 bytes per element): 128,000 B (125.00 KiB)" in frozen.contents.value
    assert "no gradient, no optimizer state" in frozen.contents.value
    assert "gradient (" not in frozen.contents.value

    activation = await hover(client, uri, at(BASE, 10, "512"))
    assert "- activation (float32, 4 bytes per element): 65,536 B (64.00 KiB)" in activation.contents.value

    budget = await hover(client, uri, at(BASE, 2, "GiB"))
    lines = budget.contents.value.splitlines()
    assert lines[:3] == [
        "**budget**: 1,006,632,960 B (960.00 MiB) (device.memory 1 GiB - reserve 64 MiB)",
        "**total**: 46,154,752 B (44.02 MiB), 4.6% of the budget",
        "**headroom**: 960,478,208 B (915.98 MiB)",
    ]
    assert "- optimizer_state: 26,263,552 B (25.05 MiB)" in lines

    dtype = await hover(client, uri, at(BASE, 4, "bfloat16", 2))
    assert dtype.contents.value == "**bfloat16**: 2 bytes per element (brain float, 8-bit exponent)"
    assert span(dtype) == (4, 21, 4, 29)

    optimizer = await hover(client, uri, at(BASE, 3, "adam"))
    assert optimizer.contents.value.startswith("**adam**: 2 state tensors per trainable parameter")
    assert "8 bytes per trainable parameter element" in optimizer.contents.value

    assert await hover(client, uri, at(BASE, 1, "tiny")) is None  # a name: nothing to say


async def test_hover_layer(client: LanguageClient, tmp_path: Path):
    text = """\
memfit: 1
device: {memory: 24 GiB}
optimizer: adam
model:
  input_shape: [80, 80, 4]
  batch_size: 32
  layers:
    - {type: Conv2D, filters: 32, kernel_size: [8, 8], strides: [4, 4], padding: same}
    - {type: ReLU}
"""
    uri = uri_of(tmp_path, "cnn.yaml")
    open_doc(client, uri, text)
    await published(client, uri)
    answer = await hover(client, uri, at(text, 7, "Conv2D"))
    assert answer is not None
    # Keras: 8*8*4*32 + 32 = 8,224 parameters; 'same' with stride 4 on 80x80 -> 20x20x32 (batch 32);
    # float32 weight + gradient + 2 adam states: 8,224 x 16 B = 131,584 B = 128.50 KiB;
    # the conv keeps its float32 input for backward: 32 x 80 x 80 x 4 x 4 B = 3,276,800 B
    lines = answer.contents.value.splitlines()
    assert lines[0].startswith("**layer 0**: Conv2D")
    assert "- output shape: [32, 20, 20, 32]" in lines
    assert "- parameters: 8,224" in lines
    assert lines[3].endswith("= 128.50 KiB")
    assert lines[4].endswith(": 3,276,800 B (3.13 MiB)")
    (hint,) = await hints(client, uri, 7, 7, 200)
    assert hint.label == "→ [32, 20, 20, 32], 8,224 params"


async def test_hover_on_hf_config_and_hints_on_training(client: LanguageClient, tmp_path: Path):
    config = {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = """\
memfit: 1
device: {memory: 24 GiB}
optimizer: adam
model:
  hf_config: config.json
training:
  micro_batch: 2
  seq_len: 16
  attention: eager
"""
    uri = uri_of(tmp_path, "llama.yaml")
    open_doc(client, uri, text)
    assert await published(client, uri) == []
    answer = await hover(client, uri, at(text, 4, "config.json"))
    lines = answer.contents.value.splitlines()
    # 96*64 embedding + 2 layers of (4 * 64*64 + 3 * 64*80 + 2*64 = 31,872) + final norm 64 + lm_head 96*64 = 76,096
    assert lines[0] == "**LlamaForCausalLM: 76,096 parameters**  "
    assert "| layer | 2 | 31,872 |" in answer.contents.value
    found = {h.position.line: h.label for h in await hints(client, uri, 6, 8, 200)}
    assert sorted(found) == [6, 7, 8]
    assert found[8].startswith("activations: eager ") and " · sdpa " in found[8] and " · flash " in found[8]


# --- inlay hints and the summary ------------------------------------------------------------


async def test_inlay_hints_honour_the_range(client: LanguageClient, tmp_path: Path):
    uri = uri_of(tmp_path, "model.yaml")
    open_doc(client, uri, BASE)
    await published(client, uri)

    some = await hints(client, uri, 7, 8, 200)  # fc.bias and emb only
    lines = BASE.splitlines()
    assert [(h.position.line, h.position.character, h.label) for h in some] == [
        (7, lines[7].index("[512]") + 5, "× 12 = 12.00 KiB (84.00 KiB in training)"),
        (8, lines[8].index("[1000, 64]") + 10, "125.00 KiB (frozen)"),
    ]
    everything = await hints(client, uri, 0, len(lines))
    assert [h.position.line for h in everything] == [0, 6, 7, 8, 10]
    assert everything[0].label == "memfit: total 44.02 MiB = 4.6% of 960.00 MiB, headroom 915.98 MiB"
    assert (everything[0].position.line, everything[0].position.character) == (0, 9)
    assert everything[-1].label == "64.00 KiB"

    (lens,) = await client.text_document_code_lens_async(types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert span(lens) == (0, 0, 0, 6)
    assert lens.command.title == "memfit: total 44.02 MiB = 4.6% of 960.00 MiB, headroom 915.98 MiB"


async def test_a_syntax_error_keeps_the_last_good_analysis(client: LanguageClient, tmp_path: Path):
    uri = uri_of(tmp_path, "model.yaml")
    open_doc(client, uri, BASE)
    await published(client, uri)

    broken = BASE + "  - {shape: [1, 2\n"  # an unclosed flow mapping
    replace(client, uri, broken, 2)
    (syntax,) = await published(client, uri)
    assert syntax.code == "yaml-syntax"

    tensor = await hover(client, uri, at(BASE, 6, "6400"))
    assert "- together: 45,875,200 B (43.75 MiB)" in tensor.contents.value
    assert [h.label for h in await hints(client, uri, 7, 7, 200)] == ["× 12 = 12.00 KiB (84.00 KiB in training)"]
    (summary,) = await hints(client, uri, 0, 0, 200)
    assert summary.label == "memfit: total 44.02 MiB = 4.6% of 960.00 MiB, headroom 915.98 MiB (last valid version)"
    (lens,) = await client.text_document_code_lens_async(types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert lens.command.title.endswith("(last valid version)")
    assert "44.02 MiB" in lens.command.title


# --- completion ------------------------------------------------------------------------------


async def test_completion_of_closed_vocabularies(client: LanguageClient, tmp_path: Path):
    text = """\
memfit: 1
device: {memory: 24 Gi
optimizer: ad
dtypes:
  gradients: bf
parameters:
  - {name: w, shape: [2], dtype: in
  - {name: ad
"""
    uri = uri_of(tmp_path, "typing.yaml")
    open_doc(client, uri, text)
    await published(client, uri)  # a syntax error, but completion works on the text as typed

    units = await complete(client, uri, text, 1)
    assert {"GiB", "GB", "MiB", "B"} <= {i.label for i in units.items}
    gib = next(i for i in units.items if i.label == "GiB")
    assert gib.detail == "1,073,741,824 bytes"
    assert (gib.text_edit.range.start.character, gib.text_edit.range.end.character) == (20, 22)  # replaces 'Gi'

    optimizers = {i.label for i in (await complete(client, uri, text, 2)).items}
    assert {"adam", "adamw", "sgd"} <= optimizers

    dtypes = await complete(client, uri, text, 4)
    bf16 = next(i for i in dtypes.items if i.label == "bfloat16")
    assert bf16.detail == "2 bytes per element: brain float, 8-bit exponent"
    assert bf16.text_edit.range.start.character == 13

    assert "int8" in {i.label for i in (await complete(client, uri, text, 6)).items}
    assert await complete(client, uri, text, 7) is None  # a name is free text


# --- the command line around it ---------------------------------------------------------------


def test_lsp_without_pygls_exits_2_with_the_install_hint():
    # None in sys.modules makes `import pygls` fail exactly as if it were not installed
    code = "import sys; sys.modules['pygls'] = None; from memfit.cli.main import main; sys.exit(main(['lsp']))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    from memfit.editor.lsp_entry import MISSING_EXTRA

    assert run.stderr == MISSING_EXTRA + "\n"
    assert f"`{MISSING_EXTRA}`" in (ROOT / "docs" / "editors.md").read_text()  # the docs quote the message verbatim
    assert run.stdout == ""


def test_the_check_path_never_imports_pygls(tmp_path: Path):
    config = tmp_path / "model.yaml"
    config.write_text(BASE, encoding="utf-8")
    code = (
        "import sys; from memfit.cli.main import main; status = main(['check', sys.argv[1]]);"
        "print([m for m in sys.modules if m.split('.')[0] in ('pygls', 'lsprotocol', 'cattrs')], status)"
    )
    run = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=60, check=False)
    assert run.stdout.splitlines()[-1] == "[] 0"


def test_tcp_wants_host_and_port():
    run = subprocess.run(SERVER + ["--tcp", "localhost"], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "--tcp wants HOST:PORT" in run.stderr


@pytest.mark.slow
async def test_tcp_serves_the_same_diagnostics(tmp_path: Path):
    # port 0: the server picks a free port and says which on stderr once it is listening
    server = await asyncio.create_subprocess_exec(
        *SERVER, "--tcp", "127.0.0.1:0", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    client = make_client()
    try:
        line = (await asyncio.wait_for(server.stderr.readline(), TIMEOUT)).decode()
        assert line.startswith("memfit lsp: listening on 127.0.0.1:"), line
        await client.start_tcp("127.0.0.1", int(line.rsplit(":", 1)[1]))
        await _start(client)
        uri = uri_of(tmp_path, "bad.yaml")
        open_doc(client, uri, BAD)
        assert [d.code for d in await published(client, uri)] == ["unknown-dtype", "schema"]
        await client.shutdown_session()
    finally:
        await client.stop()
        if server.returncode is None:
            server.kill()
        await asyncio.wait_for(server.wait(), TIMEOUT)


# --- issue 23: a server that stays up for everyone ---------------------------------------------------


GATED = [sys.executable, str(Path(__file__).resolve().parents[1] / "support" / "lsp_gated.py")]


@pytest_lsp.fixture(config=ClientServerConfig(server_command=GATED, client_factory=make_client))
async def gated_client(lsp_client: LanguageClient):
    """The server with a gate on gated*.yaml's analysis (tests/support/lsp_gated.py): it is under way from
    `<file>.started` until the test creates `<file>.release`."""
    lsp_client.init = await _start(lsp_client)
    yield
    await lsp_client.shutdown_session()


async def until(path: Path) -> None:
    """Wait for the gate's event (a file the server's analysis thread creates)."""
    for _ in range(int(TIMEOUT / 0.005)):
        if path.exists():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{path.name} never appeared")


async def test_a_slow_document_never_delays_another_documents_requests(gated_client, tmp_path: Path):
    client = gated_client
    healthy, slow = (tmp_path / "healthy.yaml").as_uri(), (tmp_path / "gated.yaml").as_uri()
    open_doc(client, healthy, BASE)
    await published(client, healthy)
    position = at(BASE, 6, "fc.weight")
    assert await hover(client, healthy, position) is not None
    open_doc(client, slow, BASE)
    slow_done = asyncio.ensure_future(published(client, slow))
    await until(tmp_path / "gated.yaml.started")  # the slow document's analysis is under way, and stays so
    for _ in range(5):
        found = await hover(client, healthy, position)
        assert found is not None and "fc.weight" in found.contents.value
    # an edit of the healthy document is analysed beside the slow one, not after it
    replace(client, healthy, BASE.replace("count: 12", "count: 24"), 2)
    changed = await hover(client, healthy, at(BASE, 7, "fc.bias"))
    assert changed is not None
    assert await published(client, healthy) == []
    assert not slow_done.done()  # everything above was answered while the slow document's analysis was held
    (tmp_path / "gated.yaml.release").touch()
    diagnostics = await slow_done
    assert diagnostics == []  # and the slow document was analysed all the same


@pytest_lsp.fixture(config=CONFIG)
async def small_limit_client(lsp_client: LanguageClient):
    """A server whose size limit on a document is 4,096 bytes (the CLI's --max-file-size, as an initialization option)."""
    lsp_client.init = await _start(lsp_client, options={"max_file_size": 4096})
    yield
    await lsp_client.shutdown_session()


async def test_documents_over_the_size_limit_are_not_kept_or_analysed(small_limit_client, tmp_path: Path):
    lsp_client = small_limit_client
    big, small = (tmp_path / "big.yaml").as_uri(), (tmp_path / "small.yaml").as_uri()
    open_doc(lsp_client, small, BASE)
    assert await published(lsp_client, small) == []
    text = BASE + "# padding\n" * 500  # 5,000+ bytes
    open_doc(lsp_client, big, text)
    (d,) = await published(lsp_client, big)
    assert d.code == "io" and "over the 4,096-byte limit" in d.message
    # edits cannot grow it (its text is not kept) and requests about it are answered with nothing
    for version in range(2, 5):
        lsp_client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=big, version=version),
                [types.TextDocumentContentChangePartial(range=types.Range(types.Position(0, 0), types.Position(0, 0)), text="#" * 3000 + "\n")],
            )
        )
    assert await hover(lsp_client, big, types.Position(line=0, character=0)) is None
    # growing an open document past the limit drops it the same way
    replace(lsp_client, small, text, 2)
    (d,) = await published(lsp_client, small)
    assert d.code == "io"
    assert lsp_client.messages == [] and [m for m in lsp_client.log_messages if m.type == types.MessageType.Error] == []


async def test_requests_about_closed_or_unopened_documents_are_ignored_quietly(client: LanguageClient, tmp_path: Path):
    uri = (tmp_path / "gone.yaml").as_uri()
    open_doc(client, uri, BASE)
    await published(client, uri)
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    assert await published(client, uri) == []  # its diagnostics are taken back
    replace(client, uri, BASE, 2)  # a change after the close: pygls raised KeyError and the editor showed it
    client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    never = (tmp_path / "never.yaml").as_uri()
    replace(client, never, BASE, 3)
    assert await hover(client, uri, types.Position(line=0, character=0)) is None
    assert await hover(client, never, types.Position(line=0, character=0)) is None
    assert await hints(client, never, 0, 3) is None
    assert client.messages == [] and [m for m in client.log_messages if m.type == types.MessageType.Error] == []
    assert client.published[uri].empty() and client.published[never].empty()


async def test_a_superseded_analysis_publishes_nothing(gated_client, tmp_path: Path):
    """An edit while a slow analysis runs: the stale result (a budget error) is never shown; the newer text's is."""
    client = gated_client
    uri = (tmp_path / "gated.yaml").as_uri()
    open_doc(client, uri, BASE.replace("1 GiB", "1 MiB"))  # held at the gate; its result would be an error
    await until(tmp_path / "gated.yaml.started")
    replace(client, uri, BASE, 2)
    (tmp_path / "gated.yaml.release").touch()
    assert await published(client, uri) == []  # the first publication is of version 2 (it fits)
    assert await hover(client, uri, at(BASE, 6, "fc.weight")) is not None
    assert client.published[uri].empty()


async def test_a_referenced_file_or_settings_change_rechecks_the_open_document(client: LanguageClient, tmp_path: Path):
    """Issue 33: an open document's verdict follows its config.json and its settings file when they change on disk
    (workspace/didChangeWatchedFiles), though its own text did not change."""
    raw = json.loads((ROOT / "examples" / "models" / "gpt2.json").read_text(encoding="utf-8"))
    model = tmp_path / "gpt2.json"
    model.write_text(json.dumps(raw), encoding="utf-8")
    settings = tmp_path / "memfit.toml"
    settings.write_text('device = "H100"\n', encoding="utf-8")
    text = "memfit: 1\noptimizer: adamw\nmodel: {hf_config: gpt2.json}\ntraining: {micro_batch: 1, seq_len: 128}\n"
    uri = uri_of(tmp_path, "run.yaml")
    (tmp_path / "run.yaml").write_text(text, encoding="utf-8")
    open_doc(client, uri, text)
    assert await published(client, uri) == []

    def changed(path: Path) -> None:
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[types.FileEvent(uri=path.as_uri(), type=types.FileChangeType.Changed)]))

    # the model grows past the H100: 48 layers of width 8192 (about 39 billion parameters, 16 bytes each under AdamW)
    model.write_text(json.dumps({**raw, "n_layer": 48, "n_embd": 8192, "n_head": 64}), encoding="utf-8")
    changed(model)
    (exceeded,) = await published(client, uri)
    assert exceeded.code == "budget-exceeded"
    model.write_text(json.dumps(raw), encoding="utf-8")
    changed(model)
    assert await published(client, uri) == []
    # the settings now give a 100 MB budget, with the model as it was: the budget changed, not the text
    settings.write_text('budget = "100 MB"\n', encoding="utf-8")
    changed(settings)
    (over,) = await published(client, uri)
    assert over.code == "budget-exceeded" and "100,000,000 B" in over.message
