"""Time from didChange to the published diagnostics, on a 5,000-tensor document, through a real
client talking to `python -m memfit lsp` over stdio.

    python benchmarks/lsp_latency.py [--tensors 5000] [--rounds 20]

Three ways: debounce_ms=0 (the analysis and the protocol alone); the default debounce with a
pause before each edit (an edit after a quiet spell is analysed at once); and the default debounce
with edits back to back (an edit inside a burst waits out the debounce delay: what a user waits
for after the last keystroke of fast typing). Also times check() in-process on the same text, to
show how much of the latency is the core's."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from memfit.check.pipeline import Options, check
from memfit.editor.lsp import DEFAULT_DEBOUNCE_MS

URI = "file:///tmp/memfit-latency.yaml"


def document(tensors: int, memory: str) -> str:
    params = tensors * 4 // 5
    lines = ["memfit: 1", f"device: {{memory: {memory}}}", "optimizer: adam", "dtypes: {parameters: bfloat16}", "parameters:"]
    lines += [f"  - {{name: block{i}.weight, shape: [{i % 97 + 1}, 512]}}" for i in range(params)]
    lines.append("activations:")
    lines += [f"  - [32, 128, {i % 50 + 1}]" for i in range(tensors - params)]
    return "\n".join(lines) + "\n"


async def measure(debounce_ms: int | None, texts: list[str], rounds: int, pause: float = 0.0, hints: dict | None = None) -> list[float]:
    """didChange -> publishDiagnostics times; with `hints`, also the time of the first and of a
    second inlayHint request (a 60-line viewport) after each analysis, into hints["first"/"again"]."""
    client = LanguageClient("latency", "1")
    waiting: list[asyncio.Future] = []

    last: list = []

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def published(params: types.PublishDiagnosticsParams) -> None:
        last[:] = params.diagnostics
        if waiting and not waiting[0].done():
            waiting[0].set_result(time.perf_counter())

    await client.start_io(sys.executable, "-m", "memfit", "lsp")
    options = None if debounce_ms is None else {"debounce_ms": debounce_ms}
    await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities(), initialization_options=options))
    client.initialized(types.InitializedParams())

    async def round_trip(send) -> float:
        waiting[:] = [asyncio.get_running_loop().create_future()]
        start = time.perf_counter()
        send()
        return (await asyncio.wait_for(waiting[0], 60)) - start

    await round_trip(
        lambda: client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=URI, language_id="yaml", version=1, text=texts[0]))
        )
    )
    times = []
    for version in range(2, rounds + 2):
        text = texts[version % len(texts)]
        change = types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=URI, version=version), [types.TextDocumentContentChangeWholeDocument(text=text)]
        )
        if pause:
            await asyncio.sleep(pause)  # the user stops typing (a scenario, not synchronisation)
        times.append(await round_trip(lambda change=change: client.text_document_did_change(change)))
        if hints is not None:
            middle = text.count("\n") // 2
            viewport = types.Range(start=types.Position(line=middle, character=0), end=types.Position(line=middle + 60, character=0))
            request = types.InlayHintParams(text_document=types.TextDocumentIdentifier(uri=URI), range=viewport)
            for key in ("first", "again"):
                start = time.perf_counter()
                answer = await client.text_document_inlay_hint_async(request)
                hints.setdefault(key, []).append(time.perf_counter() - start)
                assert answer and len(answer) >= 60, answer
            over = [d for d in last if d.code == "budget-exceeded"]
            if over:  # the quick fixes on the budget diagnostic (computed on first request per version)
                request = types.CodeActionParams(
                    text_document=types.TextDocumentIdentifier(uri=URI), range=over[0].range, context=types.CodeActionContext(diagnostics=over)
                )
                start = time.perf_counter()
                await client.text_document_code_action_async(request)
                hints.setdefault("actions", []).append(time.perf_counter() - start)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return times


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(t * 1000 for t in seconds)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return f"{label:<36} median {statistics.median(ms):7.1f} ms   p90 {p90:7.1f} ms   min {ms[0]:7.1f} ms   (n={len(ms)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    # alternate a budget that fits with one that is exceeded: each change alters the diagnostics
    texts = [document(args.tensors, "24 GiB"), document(args.tensors, "1 GiB")]
    print("time from didChange to the published diagnostics (the client's clock):")
    print(f"document: {args.tensors:,} tensors, {len(texts[0].splitlines()):,} lines, {len(texts[0]):,} characters")

    core = []
    for i in range(args.rounds):
        start = time.perf_counter()
        check(texts[i % 2], "x.yaml", Options(skip_unrecognized=True))
        core.append(time.perf_counter() - start)
    print(summary("check() in-process", core))
    hints: dict = {}
    print(summary("debounce 0", asyncio.run(measure(0, texts, args.rounds, hints=hints))))
    pause = 4 * DEFAULT_DEBOUNCE_MS / 1000
    print(summary(f"debounce {DEFAULT_DEBOUNCE_MS} ms, edit after a pause", asyncio.run(measure(None, texts, args.rounds, pause))))
    print(summary(f"debounce {DEFAULT_DEBOUNCE_MS} ms, edit inside a burst", asyncio.run(measure(None, texts, args.rounds))))
    print("inlayHint for a 60-line viewport after an analysis:")
    print(summary("first request (builds the path index)", hints["first"]))
    print(summary("next request (index cached)", hints["again"]))
    print("codeAction on the budget-exceeded diagnostic (its quick fixes), after an analysis:")
    print(summary("codeAction", hints["actions"]))


if __name__ == "__main__":
    main()
