"""torchtune recipe configs (pytorch/torchtune recipes/configs/): recognised by their
`model._component_`; the builders' shapes are not mapped yet, so a torchtune config is reported
as not read rather than checked with a guessed model."""

from __future__ import annotations

from memfit.diagnostics import codes
from memfit.read.native.base import Reader


def read(r: Reader, ctx) -> dict:
    model = r.data.get("model") if isinstance(r.data.get("model"), dict) else {}
    at = r.at("model", "_component_") if "_component_" in model else r.at("model", on_key=True)
    r.native.root = at
    r.error(at, codes.NATIVE_CONFIG, f"torchtune builder {model.get('_component_', '?')}: memfit does not read torchtune's model builders yet (write a memfit config for this run)")
    return {}
