"""The config stage as check runs it: config.build, then the layout the document declares, which placement
reads (the config stage sits below placement, so check, which wires the stages, joins the two)."""

from __future__ import annotations

from dataclasses import replace

from memfit.config.build import build
from memfit.diagnostics import codes
from memfit.diagnostics.diagnostic import Problem


def configure(data: dict) -> tuple:
    """The config stage (config.build), then the layout the document declares: placement reads `parallel`,
    `training.gradient_accumulation` and `host.memory` (the config stage sits below placement)."""
    config, problems = build(data)
    if "parallel" in data or "host" in data:
        from memfit.placement.sharding import from_config

        parallel, host, found = from_config(data)
        config = replace(config, parallel=parallel, host_memory=host)
        code = {"error": codes.BAD_UNIT, "note": codes.NO_HOST_BUDGET}
        problems = problems + [Problem(path, code[severity], message, on_key=severity == "note") for path, message, severity in found]
    return config, problems
