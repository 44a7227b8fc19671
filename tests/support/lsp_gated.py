"""`memfit lsp` with a gate on the analysis of documents named gated*.yaml, so that a test knows, by an event and not
by a sleep, that an analysis is under way: the analysis thread creates `<file>.started`, then waits until the test
creates `<file>.release` (at most a minute: a safety net), then checks the text as the server always does.

    python tests/support/lsp_gated.py [memfit lsp's arguments]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from memfit.editor import lsp

_check = lsp._check
SAFETY_NET = 60.0


def gated_check(text: str, path: str):
    file = Path(path)
    if file.name.startswith("gated"):
        Path(f"{file}.started").touch()
        deadline = time.monotonic() + SAFETY_NET
        while not Path(f"{file}.release").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    return _check(text, path)


def main() -> int:
    lsp._check = gated_check
    from memfit.cli.main import main as memfit

    return memfit(["lsp", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
