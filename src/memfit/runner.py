"""Wires a parsed command line to the pipeline: paths -> check -> reporter -> exit code."""

from __future__ import annotations

import os
import sys

from .check import Options, Result, safe_check
from .inputs import expand

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def check_paths(paths: list[str], options: Options, jobs: int = 0) -> list[Result]:
    targets = expand(paths)
    results: list[Result | None] = [Result(p, [d]) if d else None for p, d in targets]
    todo = [p for p, d in targets if d is None]
    from .pool import map_checked

    checked = iter(map_checked(todo, options, jobs))
    return [r if r is not None else next(checked) for r in results]


def run(args) -> int:
    if args.command == "schema":
        from .schemagen import schema_text

        sys.stdout.write(schema_text())
        return EXIT_OK
    if args.command == "lsp":
        from .lsp_entry import start

        return start(args)
    options = Options(
        budget=args.budget,
        warn_at=args.warn_at,
        skip_unrecognized=getattr(args, "skip_unrecognized", False),
        max_file_size=args.max_file_size,
    )
    if args.command == "explain":
        from .explain import render

        result = safe_check(args.path, options)
        colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and "NO_COLOR" not in os.environ)
        sys.stdout.write(render(result, colour))
        return EXIT_FAILED if result.failed else EXIT_OK

    from .reporters import REPORTERS, summary_markdown

    results = check_paths(args.paths, options, args.jobs)
    try:
        if args.output:
            with open(args.output, "w", encoding="utf-8") as out:
                REPORTERS[args.format](out).report(results)
        else:
            REPORTERS[args.format](sys.stdout).report(results)
        if args.summary_md:
            # appended, not replaced: $GITHUB_STEP_SUMMARY collects every step's summary
            with open(args.summary_md, "a", encoding="utf-8") as out:
                out.write(summary_markdown(results))
    except BrokenPipeError:
        raise  # the CLI's own handling: `memfit check ... | head` is not an error
    except OSError as error:
        sys.stderr.write(f"memfit: cannot write {error.filename}: {error.strerror or error}\n")
        return EXIT_USAGE
    return EXIT_FAILED if any(r.failed for r in results) else EXIT_OK
