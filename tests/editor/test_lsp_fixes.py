"""Code actions and the micro_batch hover through a real LSP client (pytest-lsp driving
`python -m memfit lsp`): the client applies the quick fix's workspace edit itself, sends the
new text, and the server's diagnostics for it say it fits."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import needs
import pytest

needs.module("pygls")
pytest_lsp = needs.module("pytest_lsp")

from lsprotocol import types
from pytest_lsp import LanguageClient
from test_lsp import CONFIG, capabilities, open_doc, published, replace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sample_configs import KERAS  # over its 2 MiB budget at batch 512; test_fit checks the arithmetic against memfit check


@pytest_lsp.fixture(config=CONFIG)
async def client(lsp_client: LanguageClient):
    caps = capabilities()
    caps.text_document.code_action = types.CodeActionClientCapabilities(
        code_action_literal_support=types.ClientCodeActionLiteralOptions(
            code_action_kind=types.ClientCodeActionKindOptions(value_set=[types.CodeActionKind.QuickFix])
        )
    )
    lsp_client.init = await lsp_client.initialize_session(types.InitializeParams(capabilities=caps))
    yield
    await lsp_client.shutdown_session()


def apply(text: str, edits: list[types.TextEdit]) -> str:
    """A client's application of LSP text edits (UTF-16 positions; this text is ASCII)."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(position: types.Position) -> int:
        return min(starts[position.line] + position.character, len(text)) if position.line < len(lines) else len(text)

    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]
    return text


async def actions(client: LanguageClient, uri: str, diagnostics: list):
    whole = diagnostics[0].range
    return await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=whole,
            context=types.CodeActionContext(diagnostics=diagnostics, only=[types.CodeActionKind.QuickFix]),
        )
    )


async def test_quick_fix_applied_by_the_client_makes_the_config_fit(client: LanguageClient, tmp_path: Path):
    uri = (tmp_path / "keras.yaml").as_uri()
    open_doc(client, uri, KERAS)
    diagnostics = await published(client, uri)
    assert [d.code for d in diagnostics] == ["budget-exceeded"]
    found = await actions(client, uri, diagnostics)
    # the 8-bit optimizer (recipes) comes first; this test applies the batch fix
    assert [a.title.split(" ")[1] for a in found] == ["optimizer", "micro_batch"]
    assert found[0].is_preferred and not found[1].is_preferred
    action = found[1]
    assert action.kind == types.CodeActionKind.QuickFix
    assert action.title.startswith("memfit: micro_batch 512 → 480 ")
    edits = action.edit.changes[uri]
    assert [(e.range.start.line, e.range.start.character, e.range.end.character, e.new_text) for e in edits] == [(5, 14, 17, "480")]
    fixed = apply(KERAS, edits)
    assert fixed == KERAS.replace("batch_size: 512", "batch_size: 480")  # formatting and comment kept
    replace(client, uri, fixed, 2)
    # 480 is 99.6% of the budget: it fits, with the near-budget warning; its own quick fix clears that
    after = await published(client, uri)
    assert [d.code for d in after] == ["near-budget"]
    clear = (await actions(client, uri, after))[-1]
    replace(client, uri, apply(fixed, clear.edit.changes[uri]), 3)
    assert await published(client, uri) == []


async def test_no_actions_for_other_diagnostics(client: LanguageClient, tmp_path: Path):
    uri = (tmp_path / "bad.yaml").as_uri()
    open_doc(client, uri, KERAS.replace("optimizer: adam", "optimizer: adma"))
    diagnostics = await published(client, uri)
    assert [d.code for d in diagnostics] == ["unknown-optimizer"]
    assert not await actions(client, uri, diagnostics)


async def test_hover_on_the_batch_axis_shows_the_largest_that_fits(client: LanguageClient, tmp_path: Path):
    uri = (tmp_path / "keras.yaml").as_uri()
    open_doc(client, uri, KERAS)
    await published(client, uri)
    position = types.Position(line=5, character=16)
    hover = await client.text_document_hover_async(types.HoverParams(types.TextDocumentIdentifier(uri=uri), position))
    assert hover.contents.value.startswith("**micro_batch**: the largest that fits is **480** (now 512)")


@pytest.mark.wallclock
async def test_code_actions_answer_at_once_on_the_latency_document(client: LanguageClient):
    """Their speed is benchmarks/bench.py's business (100 ms there); here a generous outer limit only."""
    from lsp_latency import document

    uri = "file:///tmp/memfit-code-actions.yaml"
    open_doc(client, uri, document(5000, "1 GiB"))
    diagnostics = await published(client, uri)
    assert [d.code for d in diagnostics] == ["budget-exceeded"]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        await actions(client, uri, diagnostics)
        times.append(time.perf_counter() - start)
    assert sorted(times)[len(times) // 2] < 2.0, times


async def test_combined_quick_fix_applied_by_the_client_makes_the_config_fit(client: LanguageClient, tmp_path: Path):
    """GPT-2 small on a 2 GiB budget: no single change fits, so the quick fixes are combinations (the same as
    `check --suggest`); the client applies the first, and the server then reports no problem."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    text = (examples / "gpt2-small.yaml").read_text(encoding="utf-8")
    text = text.replace("memory: 40 GiB", "memory: 4 GiB").replace("hf_config: models/gpt2.json", f"hf_config: {examples / 'models' / 'gpt2.json'}")
    uri = (tmp_path / "gpt2.yaml").as_uri()
    open_doc(client, uri, text)
    diagnostics = await published(client, uri)
    assert [d.code for d in diagnostics] == ["budget-exceeded"]
    found = await actions(client, uri, diagnostics)
    assert found and all(" + " in a.title for a in found), [a.title for a in found]
    assert found[0].is_preferred
    replace(client, uri, apply(text, found[0].edit.changes[uri]), 2)
    assert [d.code for d in await published(client, uri) if d.severity == types.DiagnosticSeverity.Error] == []
