"""`memfit lsp`: imports pygls only here, so the hook and CLI never pay for it."""

from __future__ import annotations

import sys

MISSING_EXTRA = (
    "memfit lsp needs the language-server extra (pygls): pip install '.[lsp]' in a clone of memfit,"
    " or pip install 'memfit[lsp] @ git+<memfit's git URL>'"
)


def start(args) -> int:
    try:
        from memfit.editor.lsp import serve
    except ImportError as error:
        if getattr(error, "name", "") and error.name.split(".")[0] in ("pygls", "lsprotocol"):
            # memfit is not on the package index: the extra comes from a clone or the repository's URL
            sys.stderr.write(MISSING_EXTRA + "\n")
            return 2
        raise
    return serve(args)
