"""`memfit lsp`: imports pygls only here, so the hook and CLI never pay for it."""

from __future__ import annotations

import sys


def start(args) -> int:
    try:
        from .lsp import serve
    except ImportError as error:
        if getattr(error, "name", "") and error.name.split(".")[0] in ("pygls", "lsprotocol"):
            sys.stderr.write("memfit lsp needs the language-server extra: pip install 'memfit[lsp]'\n")
            return 2
        raise
    return serve(args)
