"""The language server's work on each edit of benchmarks/lsp_latency.py, replayed in one process and timed by the
thread's CPU clock (which the load of a shared machine moves far less than the wall clock), with the time Python's
cyclic garbage collector spends inside each step:

    python benchmarks/lsp_replay.py [--tensors 5000] [--rounds 40]

Per edit: check() as the server runs it (`lsp._check`), the diagnostics converted and serialised as `publish` does,
the first and the next inlay hint of a 60-line viewport in the middle, and the code action's fixes where the budget
is exceeded (every other edit). What `memfit lsp` does to the collector before its first message (`lsp.serve`) is
done here too, read from the tree under test, so that two trees compare as they serve."""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import statistics
import time

from lsprotocol import types
from lsp_latency import document
from pygls.workspace import PositionCodec

import memfit.editor.lsp as lsp
from memfit.editor.editor import Analysis

STEPS = ("check", "publish", "first inlay hint", "next inlay hint", "code action")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    server = lsp.make_server()
    codec = PositionCodec(types.PositionEncodingKind.Utf16)  # what a client without a choice gets
    lsp.MemfitServer.codec = property(lambda self: codec)  # no initialize handshake here
    freezes = "gc.freeze()" in inspect.getsource(lsp.serve)
    if freezes:
        gc.freeze()
    texts = [document(args.tensors, "24 GiB"), document(args.tensors, "1 GiB")]
    clock = time.thread_time
    spent: dict[str, list[float]] = {step: [] for step in STEPS}
    collector: dict[str, float] = dict.fromkeys(STEPS, 0.0)
    step = [STEPS[0]]
    started = [0.0]

    def collecting(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = clock()
        else:
            collector[step[0]] += clock() - started[0]

    def timed(name: str, work) -> None:
        step[0] = name
        start = clock()
        work()
        spent[name].append(clock() - start)

    gc.callbacks.append(collecting)
    unstructure = server.protocol._converter.unstructure
    for version in range(2, args.rounds + 2):
        text = texts[version % 2]
        middle = text.count("\n") // 2
        found: dict = {}
        timed("check", lambda: found.update(result=lsp._check(text, "x.yaml")))
        result = found["result"]

        def publish() -> None:
            found["analysis"] = analysis = Analysis(text, result, version)
            diagnostics = [server.diagnostic(analysis, d) for d in result.diagnostics]
            json.dumps(unstructure(types.PublishDiagnosticsParams(uri="file:///x.yaml", diagnostics=diagnostics, version=version)))

        timed("publish", publish)
        analysis = found["analysis"]
        timed("first inlay hint", lambda: (analysis.lines, list(analysis.hints(middle, middle + 60))))
        timed("next inlay hint", lambda: list(analysis.hints(middle, middle + 60)))
        if result.budget is not None and result.config.footprint["total"] > result.budget:
            timed("code action", lambda: analysis.fixes)
    gc.callbacks.remove(collecting)
    print(f"document: {args.tensors:,} tensors; {args.rounds} edits; imports frozen as lsp.serve does: {freezes}")
    for name in STEPS:
        ms = sorted(t * 1000 for t in spent[name])
        p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
        print(f"{name:<18} median {statistics.median(ms):6.1f}  p90 {p90:6.1f}  ms CPU (n={len(ms)}); collector {1000 * collector[name] / len(ms):5.1f} ms a request")


if __name__ == "__main__":
    main()
