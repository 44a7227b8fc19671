"""A model_type no memfit family describes, without importing torch: is the trace extra installed, which family
is nearest by structure, and what the unsupported-model message says (models/hf_config.validate asks for it;
models/traced.py does the trace when the extra is there)."""

from __future__ import annotations

INSTALL = "pip install 'memfit[trace]'"


def available() -> bool:
    """Whether the trace extra (torch and transformers) is installed; imports neither."""
    from importlib.util import find_spec

    try:
        return find_spec("torch") is not None and find_spec("transformers") is not None
    except (ImportError, ValueError):
        return False


def nearest_family(raw: dict) -> tuple[str | None, float]:
    """The family whose config fields overlap `raw`'s keys most (Jaccard of the key sets, the fields every
    config has left out), and that overlap; (None, 0.0) when no family shares a structural key."""
    from memfit.models.families import BASE_FIELDS, FAMILIES

    keys = {k for k in raw if isinstance(k, str)} - set(BASE_FIELDS) - {"model_type", "transformers_version"}
    best, score = None, 0.0
    for name, family in FAMILIES.items():
        fields = (set(family.fields) | set(family.attribute_map)) - set(BASE_FIELDS)
        union = keys | fields
        overlap = len(keys & fields) / len(union) if union else 0.0
        if overlap > score:
            best, score = name, overlap
    return best, score


def unknown_message(raw: dict, shown: str) -> str:
    """The unsupported-model message for `raw` (its model_type `shown` as quoted): the families, the fallback and
    how to get it, the nearest family."""
    from memfit.models.families import SUPPORTED

    near, score = nearest_family(raw)
    nearest = (
        f"; nearest family by structure: {near} ({score:.0%} of config keys shared; relabelling it is an approximation)"
        if near
        else ""
    )
    if available():
        fallback = f"any other transformers architecture is built on the meta device ({INSTALL} is installed)"
    else:
        fallback = f"any other transformers architecture is derived by tracing it on the meta device: {INSTALL}"
    return f"model_type {shown} has no memfit family (families: {', '.join(SUPPORTED)}); {fallback}{nearest}"
