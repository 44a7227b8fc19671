"""A Hugging Face config.json: read it (with positions), validate it, normalize it.

`load(path)` reads one file and parses it as JSON, keeping where every key and value is, so a
problem inside config.json is reported at its own line:column. `validate(raw)` checks what
models/hf.py relies on and returns problems with stable codes at key paths of that dict (the
caller places them: in config.json through `Positions`, or in the YAML for an inline
`transformer:` mapping). `normalize(raw)` gives the dict transformers' config class would
serialize (`AutoConfig.for_model(model_type, **raw).to_dict()`), defaults from models/families/.

Nothing here imports transformers or fetches anything; messages quote at most a short excerpt
of the referenced file.
"""

from __future__ import annotations


import bisect
import json
import math
import os
import re
import stat
from dataclasses import replace
from functools import lru_cache

from memfit.diagnostics.diagnostic import Range
from memfit.diagnostics.records import record
from memfit.models.families import (BASE_FIELDS, CLIP_VISION_FIELDS, DROPPED_KEYS, EXPERTS_KEY, FAMILIES, LLAVA_TEXT_FAMILIES,
                                     LLAVA_VISION_DEFAULTS, QWEN_VL_BLOCKS, SUPPORTED, Family)

IO = "io"
JSON_SYNTAX = "json-syntax"
UNSUPPORTED_MODEL = "unsupported-model"
BAD_MODEL_CONFIG = "bad-model-config"
SHAPE_MISMATCH = "shape-mismatch"
TOO_LARGE = "too-large"

MAX_BYTES = 4 * 1024 * 1024  # real config.json files are a few kB; a label map can make them larger
EXCERPT = 40  # characters of a referenced file's content a message may quote

# Sizes that must be at least 1 for the model to be built at all.
POSITIVE = frozenset(
    {
        "vocab_size", "hidden_size", "n_embd", "intermediate_size", "n_inner", "num_hidden_layers", "n_layer",
        "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "n_positions", "type_vocab_size", "num_local_experts", "num_experts_per_tok", "num_labels",
        "original_max_position_embeddings", "pretraining_tp", "sliding_window", "num_kv_heads", "ffn_hidden_size",
        "num_ln_in_parallel_attn", "decoder_sparse_step", "moe_intermediate_size", "shared_expert_intermediate_size",
        # encoder-decoder families' own spellings (T5)
        "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads", "relative_attention_num_buckets",
        "relative_attention_max_distance",
        # DeepSeek-V3's latent attention and experts
        "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "n_group", "topk_group", "n_shared_experts",
    }
)
NON_NEGATIVE = frozenset({"chunk_size_feed_forward", "max_window_layers", "num_experts"})
# Probabilities: torch's nn.Dropout refuses p outside [0, 1].
PROBABILITIES = frozenset(
    {
        "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "hidden_dropout", "classifier_dropout", "dropout_rate",
    }
)
# Other numbers memfit does not compute with but a model does: finite and not negative.
NON_NEGATIVE_NUMBERS = frozenset(
    {"initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "router_aux_loss_coef", "router_jitter_noise",
     "initializer_factor"}
)
# Read from config.json by every family with a rotary embedding (models/families.Family.rope_theta_default), beside
# the family's own fields; GPT-NeoX's legacy spellings by it alone (Family.rope_legacy).
ROPE_FIELDS = {
    "rope_theta": (None, "number?"),
    "partial_rotary_factor": (None, "number?"),
    "rope_scaling": (None, "dict?"),
}
# A rotary embedding's fraction of each head (`int(head_dim * factor)` dims rotate): documented as a fraction.
FRACTIONS = frozenset({"partial_rotary_factor", "rotary_pct"})
POSITIVE_NUMBERS = frozenset({"rope_theta", "rotary_emb_base", "factor"})
# The peak walks the step's events layer by layer (ledger/step.py): about 0.4 ms a layer, so this bound keeps
# a check under a second. The largest published models have under 200 layers.
MAX_LAYERS = 2048
MAX_LABELS = 1 << 17  # a sequence-classification head of more labels than this is not a config.json memfit derives
MAX_DIGITS = 1000  # an integer literal longer than this is refused at parse time (Python converts at most 4,300)
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")  # chunked: Llama 4's rope layers
_LABEL_ID = re.compile(r"-?[0-9]{1,18}")


@record(frozen=True, slots=True)
class HFProblem:
    """A problem inside a config.json, at a key path of it."""

    path: tuple  # key path inside the config dict; () is the whole document
    code: str
    message: str
    on_key: bool = False  # about the key itself rather than its value


@record(frozen=True, slots=True)
class Loaded:
    """A parsed config.json and the positions of its keys."""

    raw: object  # the parsed JSON (a dict when it is a usable config)
    positions: Positions


class LoadError(Exception):
    """The file cannot be used: `code` is io or json-syntax; `range` is in config.json (None: no position there)."""

    def __init__(self, code: str, message: str, range: Range | None = None):
        super().__init__(message)
        self.code, self.message, self.range = code, message, range


def excerpt(value, limit: int = EXCERPT) -> str:
    """A value of the referenced file as JSON, cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Reading


def load(path: str) -> Loaded:
    """Read and parse config.json at `path`; raise LoadError for anything unusable."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise LoadError(IO, f"cannot read {path}: {error.strerror or error}") from None
    if stat.S_ISDIR(info.st_mode):
        raise LoadError(IO, f"{path} is a directory, not a config.json")
    if not stat.S_ISREG(info.st_mode):
        raise LoadError(IO, f"{path} is not a regular file")
    if info.st_size > MAX_BYTES:
        raise LoadError(IO, f"{path} is {info.st_size} bytes; a config.json is at most {MAX_BYTES} bytes")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise LoadError(IO, f"cannot read {path}: {error.strerror or error}") from None
    if b"\0" in data:
        raise LoadError(IO, f"{path} is a binary file (it contains NUL bytes), not a config.json")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start)
        column = len(data[data.rfind(b"\n", 0, error.start) + 1 : error.start].decode("utf-8", "replace"))
        raise LoadError(IO, f"{path} is not UTF-8 text (byte {error.start})", Range(line, column, line, column + 1)) from None
    return parse(text)


class HugeInteger(str):
    """An integer literal of more than MAX_DIGITS digits, kept as its text (validate reports it where it is)."""


def _parse_int(literal: str):
    return HugeInteger(literal) if len(literal) > MAX_DIGITS else int(literal)


def parse(text: str) -> Loaded:
    try:
        raw = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as error:
        line, column = error.lineno - 1, error.colno - 1
        raise LoadError(JSON_SYNTAX, f"invalid JSON: {error.msg}", Range(line, column, line, column + 1)) from None
    except RecursionError:
        raise LoadError(JSON_SYNTAX, "invalid JSON: nested too deeply", Range(0, 0, 0, 1)) from None
    return Loaded(raw, Positions(text))


# validate() places problems at most two keys deep (rope_parameters.factor, id2label's keys, architectures[0]):
# deeper nodes are walked over, not recorded (a 4 MB label map is not turned into a million entries).
MAX_POSITION_DEPTH = 2
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


class Positions:
    """Where each key and value of a (valid) JSON text is: key path -> (key range, value range).

    Built lazily, on the first problem that needs a position: a valid config is never scanned.
    """

    def __init__(self, text: str):
        self.text = text
        self._map: dict | None = None
        self._lines: list[int] | None = None

    def _point(self, offset: int) -> tuple[int, int]:
        if self._lines is None:
            self._lines = [m.end() for m in re.finditer("\n", self.text)]
        line = bisect.bisect_right(self._lines, offset)
        return line, offset - (self._lines[line - 1] if line else 0)

    def _range(self, start: int, end: int) -> Range:
        (a, b), (c, d) = self._point(start), self._point(end)
        return Range(a, b, c, d)

    def _build(self) -> dict:
        found: dict = {}
        tokens = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(self.text)]
        index = 0

        def value(path: tuple) -> tuple[int, int]:
            nonlocal index
            token, start, _ = tokens[index]
            if token == "{":
                index += 1
                deep = len(path) >= MAX_POSITION_DEPTH
                while tokens[index][0] != "}":
                    if tokens[index][0] == ",":
                        index += 1
                        continue
                    key_token, key_start, key_end = tokens[index]
                    key = None if deep else json.loads(key_token)  # below the depth problems are placed at, only skipped
                    index += 2  # the key and ':'
                    value_start, value_end = value(path + (key,))
                    if not deep:
                        found[path + (key,)] = ((key_start, key_end), (value_start, value_end))
                end = tokens[index][2]
                index += 1
                return start, end
            if token == "[":
                index += 1
                item = 0
                deep = len(path) >= MAX_POSITION_DEPTH
                while tokens[index][0] != "]":
                    if tokens[index][0] == ",":
                        index += 1
                        continue
                    item_start, item_end = value(path + (item,))
                    if not deep:
                        found[path + (item,)] = ((item_start, item_end), (item_start, item_end))
                    item += 1
                end = tokens[index][2]
                index += 1
                return start, end
            index += 1
            return start, tokens[index - 1][2]

        if tokens:
            start, end = value(())
            found[()] = ((start, start + 1), (start, end))
        return found

    def range(self, path: tuple, on_key: bool = False) -> Range:
        """The range of the value (or key) at `path`; its nearest located ancestor when it is absent."""
        if self._map is None:
            self._map = self._build()
        while path and path not in self._map:
            path = path[:-1]
        if path not in self._map:
            return Range(0, 0, 0, 0)
        (key_start, key_end), (value_start, value_end) = self._map[path]
        if on_key or not path:
            # a missing key or the whole document: the opening brace, not the whole file
            return self._range(key_start, key_end)
        return self._range(value_start, value_end)


# ---------------------------------------------------------------------------------------------
# Validation


def _type_ok(value, kind: str) -> bool:
    if isinstance(value, HugeInteger):
        return False
    if value is None:
        return kind.endswith("?")
    base = kind.rstrip("?")
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base in ("float", "number"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "bool":
        return isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base == "ids":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
    if base == "strs":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if base == "strs|str":   # DeBERTa-v2's pos_att_type: a list, or the string "p2c|c2p" its __post_init__ splits
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if base == "ints":
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if base == "dict":
        return isinstance(value, dict)
    return True


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "number": "a number",
    "bool": "true or false",
    "str": "a string",
    "ids": "an integer or a list of integers",
    "ints": "a list of integers",
    "strs": "a list of strings",
    "strs|str": "a list of strings or a string",
    "dict": "an object",
}


def _shown(value) -> str:
    if isinstance(value, HugeInteger):
        return f"an integer of {len(value.lstrip('-')):,} digits"
    return excerpt(value)


def _range_problem(key: str, value) -> str | None:
    """What is wrong with a well-typed number `value` of `key`, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key} must be a finite number, not {value}"
    if key in POSITIVE and value < 1:
        return f"{key} must be at least 1, not {value}"
    if key in NON_NEGATIVE | NON_NEGATIVE_NUMBERS and value < 0:
        return f"{key} must not be negative, not {value}"
    if key in PROBABILITIES and not 0 <= value <= 1:
        return f"{key} is a dropout probability: between 0 and 1, not {value}"
    if key in FRACTIONS and not 0 < value <= 1:
        return f"{key} is the fraction of each head's dimensions that rotate: above 0 and at most 1, not {value}"
    if key in POSITIVE_NUMBERS and not value > 0:
        return f"{key} must be above 0, not {value}"
    if key == "num_labels" and value > MAX_LABELS:
        return f"num_labels {value:,} is more than {MAX_LABELS:,}: a classification head that large is not modeled"
    if key in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers") and value > MAX_LAYERS:
        return f"{key} {value:,} is more than {MAX_LAYERS:,}: memfit walks a training step layer by layer and stops there"
    return None


def _expected(kind: str) -> str:
    words = _TYPE_WORDS[kind.rstrip("?")]
    return words + " or null" if kind.endswith("?") else words


def family_of(raw) -> Family | None:
    if isinstance(raw, dict):
        return FAMILIES.get(raw.get("model_type")) if isinstance(raw.get("model_type"), str) else None
    return None


def validate(raw) -> list[HFProblem]:
    """Problems that keep memfit from deriving this model, each at a key path of `raw`."""
    if not isinstance(raw, dict):
        return [HFProblem((), BAD_MODEL_CONFIG, f"a model config is a JSON object of keys, not {type(raw).__name__}")]
    if "model_type" not in raw:
        return [HFProblem((), BAD_MODEL_CONFIG, f"no model_type: name the model family ({', '.join(SUPPORTED)})")]
    model_type = raw["model_type"]
    family = family_of(raw)
    if family is None and model_type == "llama4" and isinstance(raw.get("text_config"), dict):
        names = raw.get("architectures")
        if isinstance(names, list) and names and names[0] != "Llama4ForCausalLM":
            # Llama4ForConditionalGeneration: a vision tower and projector around a Llama 4 text model (llama4_text)
            return [HFProblem(("architectures", 0), UNSUPPORTED_MODEL,
                              f"architecture {excerpt(names[0])} of model_type llama4 is the multimodal model (a vision tower "
                              "and projector around the text model); memfit models the text model (llama4_text: "
                              "Llama4ForCausalLM): give text_config as the config.json (it is one, with model_type "
                              "llama4_text), or name Llama4ForCausalLM here; the vision tower is not modeled")]
        # AutoModelForCausalLM builds Llama4ForCausalLM from the text_config alone: read it as llama4_text
        return [replace(p, path=("text_config",) + p.path) for p in validate(llama4_text(raw))]
    if family is None:
        from memfit.models.unknown import unknown_message  # the families, the fallback, the nearest family

        return [HFProblem(("model_type",), UNSUPPORTED_MODEL, unknown_message(raw, excerpt(model_type)))]

    problems = _field_problems(raw, family)
    if problems:
        return problems
    if family.block == "llava":
        return _llava_problems(raw)
    if family.block in QWEN_VL_BLOCKS:   # Qwen2-VL, Qwen2.5-VL (issue 34): models/qwen_vl.py
        return _qwen_vl_problems(raw)
    if family.block == "mllama":   # Llama 3.2 Vision: models/mllama.py
        return _mllama_problems(raw)
    problems = _architecture_problems(raw, family)
    return problems + _shape_problems(raw, family, normalize(raw))


def _field_problems(raw: dict, family: Family) -> list[HFProblem]:
    """Each key's type and range, where config.json spells it, and the activation's name."""
    problems: list[HFProblem] = []
    kinds = read_fields(family)
    for given, value in raw.items():
        key = family.attribute_map.get(given, given)  # checked as the field, placed where config.json spells it
        if key not in kinds:
            continue  # a key the family's class does not read: transformers keeps it as an attribute, unused
        kind = kinds[key][1]
        if isinstance(value, HugeInteger):
            problems.append(HFProblem((given,), BAD_MODEL_CONFIG, f"{given} is {_shown(value)}: memfit reads integers of up to {MAX_DIGITS:,} digits"))
            continue
        if not _type_ok(value, kind):
            problems.append(HFProblem((given,), BAD_MODEL_CONFIG, f"{given} must be {_expected(kind)}, not {_shown(value)}"))
            continue
        wrong = _range_problem(given if given == key else key, value)
        if wrong is not None and key == "type_vocab_size" and value == 0 and family.post_init == "deberta_v2":
            wrong = None  # DeBERTa-v2 (v3's configs: 0) has no token-type embedding then
        if wrong is not None and key == "sliding_window" and value == 0 and family.post_init == "qwen2_moe":
            wrong = None  # Qwen2MoeConfig writes 0 for "no window" (its to_dict without use_sliding_window)
        if wrong is not None:
            too_large = key in ("num_labels", "num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers") and value > 0
            problems.append(HFProblem((given,), TOO_LARGE if too_large else BAD_MODEL_CONFIG, wrong))
        elif isinstance(value, dict):
            problems += _nested(given, key, value)
        elif key == "layer_types" and value is not None:
            problems += [
                HFProblem((given, i), BAD_MODEL_CONFIG, f"layer_types[{i}] must be one of {', '.join(LAYER_TYPES)}, not {excerpt(item)}")
                for i, item in enumerate(value)
                if item not in LAYER_TYPES
            ][:1]
    if "feed_forward_proj" in family.fields and isinstance(raw.get("feed_forward_proj"), str):
        problems += _feed_forward_problems(raw["feed_forward_proj"])
    if _act_key(family) in raw and isinstance(raw[_act_key(family)], str):
        from memfit.models.hf_activations import ACTIVATIONS

        name = raw[_act_key(family)]
        if family.gelu_means_tanh and name == "gelu":
            name = "gelu_pytorch_tanh"
        if name not in ACTIVATIONS:
            problems.append(
                HFProblem(
                    (_act_key(family),),
                    UNSUPPORTED_MODEL,
                    f"{_act_key(family)} {excerpt(raw[_act_key(family)])} is not an activation memfit models; modeled: {', '.join(sorted(ACTIVATIONS))}: "
                    "give one of these names (transformers' ACT2FN spelling) if the model uses one of them",
                )
            )
    return problems


def _architecture_problems(raw: dict, family: Family) -> list[HFProblem]:
    """An architecture the family does not build, and a setup (cross-attention) memfit does not model."""
    problems: list[HFProblem] = []
    architectures = raw.get("architectures")
    if architectures:
        name = architectures[0]
        if name not in family.architectures:
            problems.append(
                HFProblem(
                    ("architectures", 0),
                    UNSUPPORTED_MODEL,
                    f"architecture {excerpt(name)} is not supported for {family.model_type}; supported: {', '.join(family.architectures)}: "
                    f"name one of them in architectures[0], or leave architectures out for {family.default_architecture}",
                )
            )
    for key in ("add_cross_attention",):
        if raw.get(key) is True:
            problems.append(HFProblem((key,), UNSUPPORTED_MODEL, "cross-attention (an encoder-decoder setup) is not modeled: set "
                                      f"{key} to false to check the model without it (an encoder-decoder family, t5, models its own)"))
    return problems


def _shape_problems(raw: dict, family: Family, cfg: dict) -> list[HFProblem]:
    """Sizes that do not fit together (heads, key/value groups, the padding row, experts), read from the
    normalized config `cfg` and placed where `raw` spells them."""
    problems: list[HFProblem] = []
    hidden, heads = cfg[family.hidden_key], cfg[family.heads_key]
    heads_key = family.heads_key
    # T5's d_kv (its head_dim) is always explicit: its heads need not divide d_model
    explicit_head_dim = (family.head_dim_key and _given(raw, family, "head_dim") is not None) or "head_dim" in family.attribute_map
    # (DeepSeek-V3's latent attention sizes its heads by qk_nope_head_dim, qk_rope_head_dim and v_head_dim)
    if hidden % heads and (not explicit_head_dim or family.model_type == "llama") and family.block != "deepseek_v3":
        problems.append(
            HFProblem(
                (_where(raw, family, family.hidden_key),),
                SHAPE_MISMATCH,
                f"{family.hidden_key} {hidden} is not divisible by {heads_key} {heads}: each head gets an equal share",
            )
        )
    kv = cfg.get("num_key_value_heads")
    if family.kv_heads_default or "num_key_value_heads" in family.fields:
        if kv is not None and heads % kv:
            problems.append(
                HFProblem(
                    (_where(raw, family, "num_key_value_heads"),),
                    SHAPE_MISMATCH,
                    f"{heads_key} {heads} is not divisible by num_key_value_heads {kv}: each key/value head serves a whole group",
                )
            )
    pad = cfg.get("pad_token_id")
    if family.padding_idx and pad is not None and not -cfg["vocab_size"] <= pad < cfg["vocab_size"]:
        problems.append(
            HFProblem(
                (_where(raw, family, "pad_token_id"),),
                SHAPE_MISMATCH,
                f"pad_token_id {pad} is outside the vocabulary (vocab_size {cfg['vocab_size']}): the embedding's padding row must exist",
            )
        )
    if family.block == "falcon":
        problems += _falcon_layout(raw, cfg)
    if family.block == "gpt_oss" and cfg.get("sliding_window") is None:
        # GptOssModel.forward builds the sliding-window mask on every call, whatever layer_types says
        problems.append(HFProblem((_where(raw, family, "sliding_window"),), UNSUPPORTED_MODEL,
                                  "sliding_window null: GptOssModel.forward builds a sliding-window mask on every call and "
                                  "transformers refuses it without a window (create_sliding_window_causal_mask: "
                                  "'Could not find a `sliding_window` argument'): set sliding_window (gpt-oss's published configs: 128)"))
    if family.block == "llama4":
        problems += _llama4_layers(raw, cfg)
    experts_key = EXPERTS_KEY.get(family.model_type)
    experts = cfg.get(experts_key) if experts_key else None
    if experts_key and isinstance(experts, int) and not isinstance(experts, bool) and experts > 0 and cfg["num_experts_per_tok"] > experts:
        problems.append(
            HFProblem(
                (_where(raw, family, "num_experts_per_tok"),),
                SHAPE_MISMATCH,
                f"num_experts_per_tok {cfg['num_experts_per_tok']} exceeds {experts_key} {experts}",
            )
        )
    elif experts_key and not (isinstance(experts, int) and not isinstance(experts, bool) and experts >= 0):
        problems.append(HFProblem((_where(raw, family, experts_key),), BAD_MODEL_CONFIG, f"{experts_key} must be an integer of at least 0, not {_shown(experts)}"))
    if family.block == "deepseek_v3":
        problems += _deepseek_problems(raw, cfg, family)
    return problems


def _deepseek_problems(raw: dict, cfg: dict, family) -> list[HFProblem]:
    """What DeepseekV3 cannot run: its key and value already have every head (repeat_kv by num_attention_heads //
    num_key_value_heads would repeat them again), and the router views the experts as n_group equal groups, topk_group
    of them chosen, each group's top two scored (so at least two experts in a group)."""
    out = []
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads")
    if isinstance(kv, int) and kv != heads:
        out.append(HFProblem((_where(raw, family, "num_key_value_heads"),), SHAPE_MISMATCH,
                             f"num_key_value_heads {kv} is not num_attention_heads {heads}: DeepSeek-V3's latent attention "
                             "expands every head's key and value, and transformers' repeat_kv would repeat them again"))
    experts, groups, chosen = cfg.get("n_routed_experts"), cfg.get("n_group"), cfg.get("topk_group")
    moe_layers = cfg["num_hidden_layers"] > (cfg.get("first_k_dense_replace") or 0)
    if moe_layers and isinstance(experts, int) and isinstance(groups, int) and groups > 0:
        if experts % groups or experts // groups < 2:
            out.append(HFProblem((_where(raw, family, "n_group"),), SHAPE_MISMATCH,
                                 f"n_group {groups} does not split n_routed_experts {experts} into equal groups of at least "
                                 "two: the router scores each group by its top two experts"))
        elif isinstance(chosen, int) and chosen > groups:
            out.append(HFProblem((_where(raw, family, "topk_group"),), SHAPE_MISMATCH,
                                 f"topk_group {chosen} exceeds n_group {groups}"))
    return out


def _llava_problems(raw: dict) -> list[HFProblem]:
    """LLaVA: architectures, the text model (one of LLAVA_TEXT_FAMILIES, validated as its own config.json), the CLIP
    vision tower's keys, the projector's activation and which vision layer feeds it."""
    from memfit.models.hf_activations import ACTIVATIONS

    out: list[HFProblem] = []
    names = raw.get("architectures")
    if names and names[0] not in FAMILIES["llava"].architectures:
        out.append(HFProblem(("architectures", 0), UNSUPPORTED_MODEL, f"architecture {excerpt(names[0])} is not supported for llava; "
                             f"supported: {', '.join(FAMILIES['llava'].architectures)}"))
    text = raw.get("text_config") or {}
    kind = text.get("model_type", "llama")
    if kind not in LLAVA_TEXT_FAMILIES:
        out.append(HFProblem(("text_config", "model_type"), UNSUPPORTED_MODEL, f"a LLaVA text model of model_type {excerpt(kind)} "
                             f"is not modeled; modeled: {', '.join(LLAVA_TEXT_FAMILIES)}: give a text_config of one of them to check "
                             "that shape"))
    else:
        out += [HFProblem(("text_config",) + p.path, p.code, "text_config." + p.message if p.path else p.message, p.on_key)
                for p in validate({**text, "model_type": kind})]
    vision = raw.get("vision_config") or {}
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        out.append(HFProblem(("vision_config", "model_type"), UNSUPPORTED_MODEL, f"a LLaVA vision tower of model_type "
                             f"{excerpt(vision.get('model_type'))} is not modeled; modeled: clip_vision_model: give a CLIP "
                             "vision_config to check that shape"))
    for key, value in vision.items():
        if key in CLIP_VISION_FIELDS:
            kind_ = CLIP_VISION_FIELDS[key][1]
            if not _type_ok(value, kind_):
                out.append(HFProblem(("vision_config", key), BAD_MODEL_CONFIG, f"vision_config.{key} must be {_expected(kind_)}, not {_shown(value)}"))
            elif key in POSITIVE | {"num_channels", "image_size", "patch_size"} and value < 1:
                out.append(HFProblem(("vision_config", key), BAD_MODEL_CONFIG, f"vision_config.{key} must be at least 1, not {value}"))
    if out:
        return out
    cfg = normalize(raw)
    v = cfg["vision_config"]
    if v["hidden_size"] % v["num_attention_heads"]:
        out.append(HFProblem(("vision_config", "hidden_size"), SHAPE_MISMATCH, f"vision_config.hidden_size {v['hidden_size']} is not "
                             f"divisible by num_attention_heads {v['num_attention_heads']}"))
    if v["hidden_act"] not in ACTIVATIONS:
        out.append(HFProblem(("vision_config", "hidden_act"), UNSUPPORTED_MODEL, f"vision_config.hidden_act {excerpt(v['hidden_act'])} is "
                             f"not an activation memfit models; modeled: {', '.join(sorted(ACTIVATIONS))}"))
    if cfg["projector_hidden_act"] not in ACTIVATIONS:
        out.append(HFProblem(("projector_hidden_act",), UNSUPPORTED_MODEL, f"projector_hidden_act {excerpt(cfg['projector_hidden_act'])} "
                             f"is not an activation memfit models; modeled: {', '.join(sorted(ACTIVATIONS))}"))
    if cfg["vision_feature_select_strategy"] not in ("default", "full"):
        out.append(HFProblem(("vision_feature_select_strategy",), BAD_MODEL_CONFIG, "vision_feature_select_strategy is default "
                             f"(drop the CLS token) or full, not {excerpt(cfg['vision_feature_select_strategy'])}"))
    layers = cfg["vision_feature_layer"]
    for layer in layers if isinstance(layers, list) else [layers]:
        if not -v["num_hidden_layers"] - 1 <= layer <= v["num_hidden_layers"]:
            out.append(HFProblem(("vision_feature_layer",), BAD_MODEL_CONFIG, f"vision_feature_layer {layer} is not a hidden state of "
                                 f"the {v['num_hidden_layers']}-layer vision tower"))
            break
    return out


def _qwen_vl_problems(raw: dict) -> list:
    """The text model's keys (typed as Qwen2VLTextConfig reads them, flat or under text_config), the vision tower's,
    and the shapes transformers needs: heads dividing the widths, key/value groups, the merge dividing nothing odd."""
    from memfit.diagnostics import codes
    from memfit.models.qwen_vl import _fields, _text_given, normalize as normalize_vl

    mt = raw["model_type"]
    text_fields, vision_fields = _fields(mt)
    out = []
    names = raw.get("architectures")
    if names and names[0] not in FAMILIES[mt].architectures:
        out.append(HFProblem(("architectures", 0), codes.UNSUPPORTED_MODEL, f"architecture {excerpt(names[0])} is not supported "
                             f"for {mt}; supported: {', '.join(FAMILIES[mt].architectures)}"))
    nested = isinstance(raw.get("text_config"), dict)
    where = ("text_config",) if nested else ()
    given = _text_given(raw)
    for key, value in given.items():
        if key in text_fields and not _type_ok(value, text_fields[key][1]):
            out.append(HFProblem(where + (key,), codes.BAD_MODEL_CONFIG, f"{key} must be {_expected(text_fields[key][1])}, not {_shown(value)}"))
        elif key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size") and value < 1:
            out.append(HFProblem(where + (key,), codes.BAD_MODEL_CONFIG, f"{key} must be at least 1, not {value}"))
    vision = raw.get("vision_config")
    for key, value in (vision or {}).items():
        key_ = {"num_attention_heads": "num_heads", "num_hidden_layers": "depth"}.get(key, key)
        if key_ in vision_fields:
            kind = vision_fields[key_][1]
            if not _type_ok(value, kind):
                out.append(HFProblem(("vision_config", key), codes.BAD_MODEL_CONFIG, f"vision_config.{key} must be {_expected(kind)}, not {_shown(value)}"))
            elif kind == "int" and value < 1 and key_ != "depth":
                out.append(HFProblem(("vision_config", key), codes.BAD_MODEL_CONFIG, f"vision_config.{key} must be at least 1, not {value}"))
    if out:
        return out
    cfg = normalize_vl(raw)
    text, v = cfg["text_config"], cfg["vision_config"]
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    if text["hidden_size"] % heads:
        out.append(HFProblem(where + ("hidden_size",), codes.SHAPE_MISMATCH, f"hidden_size {text['hidden_size']} is not divisible by "
                             f"num_attention_heads {heads}: each head gets an equal share"))
    if heads % kv:
        out.append(HFProblem(where + ("num_key_value_heads" if "num_key_value_heads" in given else "num_attention_heads",),
                             codes.SHAPE_MISMATCH, f"num_attention_heads {heads} is not divisible by num_key_value_heads {kv} "
                             f"(Qwen2VLTextConfig's default is 8): each key/value head serves a whole group"))
    width = v["embed_dim"] if mt == "qwen2_vl" else v["hidden_size"]
    if width % v["num_heads"] or (width // v["num_heads"]) % 4:
        out.append(HFProblem(("vision_config", "num_heads"), codes.SHAPE_MISMATCH, f"the vision tower's width {width} over "
                             f"num_heads {v['num_heads']} is not a head dim divisible by 4: its 2D rotary splits each head "
                             "into height and width halves"))
    from memfit.models.hf_activations import ACTIVATIONS

    for key, value in (("hidden_act", text["hidden_act"]), ("vision_config.hidden_act", v["hidden_act"])):
        if value not in ACTIVATIONS:
            path = ("vision_config", "hidden_act") if key.startswith("vision") else where + ("hidden_act",)
            out.append(HFProblem(path, codes.UNSUPPORTED_MODEL, f"{key} {excerpt(value)} is not an activation memfit models"))
    return out


def _mllama_problems(raw: dict) -> list:
    """The text model's and the vision tower's keys (typed as their config classes read them), and the shapes
    transformers needs: heads dividing the widths, key/value groups, the vision features the projector reads."""
    from memfit.diagnostics import codes
    from memfit.models.families.mllama import TEXT_FIELDS, VISION_FIELDS
    from memfit.models.hf_act_ops import ACTIVATIONS
    from memfit.models.mllama import normalize as normalize_mllama

    out = []
    names = raw.get("architectures")
    if names and names[0] not in FAMILIES["mllama"].architectures:
        out.append(HFProblem(("architectures", 0), codes.UNSUPPORTED_MODEL, f"architecture {excerpt(names[0])} is not supported "
                             f"for mllama; supported: {', '.join(FAMILIES['mllama'].architectures)}"))
    for part, fields in (("text_config", TEXT_FIELDS), ("vision_config", VISION_FIELDS)):
        for key, value in (raw.get(part) or {}).items():
            key_ = "attention_heads" if part == "vision_config" and key == "num_attention_heads" else key
            if key_ not in fields:
                continue
            kind = fields[key_][1]
            if not _type_ok(value, kind):
                out.append(HFProblem((part, key), codes.BAD_MODEL_CONFIG, f"{part}.{key} must be {_expected(kind)}, not {_shown(value)}"))
            elif kind == "int" and key_ not in ("bos_token_id", "eos_token_id", "pad_token_id", "num_global_layers") and value < 1:
                out.append(HFProblem((part, key), codes.BAD_MODEL_CONFIG, f"{part}.{key} must be at least 1, not {value}"))
    if out:
        return out
    cfg = normalize_mllama(raw)
    text, v = cfg["text_config"], cfg["vision_config"]
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    if text["hidden_size"] % heads:
        out.append(HFProblem(("text_config", "hidden_size"), codes.SHAPE_MISMATCH, f"text_config.hidden_size {text['hidden_size']} "
                             f"is not divisible by num_attention_heads {heads}: each head gets an equal share"))
    if heads % kv:
        out.append(HFProblem(("text_config", "num_key_value_heads"), codes.SHAPE_MISMATCH, f"text_config.num_attention_heads "
                             f"{heads} is not divisible by num_key_value_heads {kv}: each key/value head serves a whole group"))
    if v["hidden_size"] % v["attention_heads"]:
        out.append(HFProblem(("vision_config", "hidden_size"), codes.SHAPE_MISMATCH, f"vision_config.hidden_size {v['hidden_size']} "
                             f"is not divisible by attention_heads {v['attention_heads']}"))
    layers = v["intermediate_layers_indices"]
    if any(not -v["num_hidden_layers"] <= i < v["num_hidden_layers"] for i in layers):
        out.append(HFProblem(("vision_config", "intermediate_layers_indices"), codes.BAD_MODEL_CONFIG, "vision_config."
                             f"intermediate_layers_indices {layers} are not all layers of the {v['num_hidden_layers']}-layer "
                             "vision transformer"))
    elif v["vision_output_dim"] != v["hidden_size"] * (len(layers) + 1):
        out.append(HFProblem(("vision_config", "vision_output_dim"), codes.SHAPE_MISMATCH, f"vision_config.vision_output_dim "
                             f"{v['vision_output_dim']} is not hidden_size x (len(intermediate_layers_indices) + 1) = "
                             f"{v['hidden_size'] * (len(layers) + 1)}: the projector reads the last and intermediate layers' "
                             "features concatenated"))
    for part, value in (("text_config", text["hidden_act"]), ("vision_config", v["hidden_act"])):
        if value not in ACTIVATIONS:
            out.append(HFProblem((part, "hidden_act"), codes.UNSUPPORTED_MODEL, f"{part}.hidden_act {excerpt(value)} is not an "
                                 "activation memfit models"))
    return out


def model_view(cfg: dict) -> dict:
    """The dict models/hf.py and hf_activations.py read: a family's normalized config as it is; LLaVA's with its text
    model's keys at the top (model_type "llava") and the vision tower and projector under "llava"."""
    if cfg.get("model_type") in QWEN_VL_BLOCKS:
        from memfit.models import qwen_vl

        return qwen_vl.model_view(cfg)
    if cfg.get("model_type") == "mllama":
        from memfit.models import mllama

        return mllama.model_view(cfg)
    if cfg.get("model_type") != "llava":
        return cfg
    text = dict(cfg["text_config"])
    own = {key: cfg[key] for key in FAMILIES["llava"].fields if key not in ("vision_config", "text_config")}
    return {**text, "model_type": "llava", "architectures": cfg["architectures"], "tie_word_embeddings": cfg["tie_word_embeddings"],
            "llava": {**own, "vision": dict(cfg["vision_config"]), "text_model_type": text["model_type"]}}


def _llava_subconfigs(out: dict, extra: dict) -> None:
    """LlavaConfig.__post_init__: text_config and vision_config as their config classes serialize nested (a given dict
    over the class's defaults; LLaVA's init_kwargs only for a vision_config not given), tie_word_embeddings from the text
    model's when the top one is false."""
    text = dict(out["text_config"] or {})
    text = normalize({**text, "model_type": text.get("model_type", "llama")})
    text.pop("transformers_version", None)
    out["text_config"] = text
    given = out["vision_config"]
    vision = {key: _copy(default) for key, (default, _) in BASE_FIELDS.items() if key != "transformers_version"}
    vision.update({key: default for key, (default, _) in CLIP_VISION_FIELDS.items()})
    vision.update(LLAVA_VISION_DEFAULTS if given is None else {k: _copy(v) for k, v in given.items() if k != "transformers_version"})
    if vision.get("id2label") is None:
        labels = vision.pop("num_labels", None) or 2
        vision["id2label"] = {i: f"LABEL_{i}" for i in range(labels)}
        vision["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    vision["_name_or_path"] = ""
    vision["model_type"] = "clip_vision_model"
    vision["output_attentions"] = bool(vision.get("output_attentions", False))
    out["vision_config"] = vision
    if not out["tie_word_embeddings"] and text.get("tie_word_embeddings"):
        out["tie_word_embeddings"] = True


def _falcon_layout(raw: dict, cfg: dict) -> list[HFProblem]:
    """Switch combinations FalconDecoderLayer builds but cannot run (modeling_falcon.py): its __init__ picks the norms
    from parallel_attn and num_ln_in_parallel_attn, its forward from new_decoder_architecture as well."""
    new, parallel, lns = cfg["new_decoder_architecture"], cfg["parallel_attn"], cfg["num_ln_in_parallel_attn"]
    lns = 2 if lns is None and new else lns
    out = []
    if new and not parallel:
        out.append(HFProblem(("parallel_attn",), UNSUPPORTED_MODEL, "new_decoder_architecture with parallel_attn false: "
                             "FalconDecoderLayer builds input_layernorm and post_attention_layernorm but its forward calls ln_attn: "
                             "set parallel_attn to true (as Falcon-40B's and -180B's configs do)"))
    elif parallel and lns == 2 and not new:
        out.append(HFProblem(("num_ln_in_parallel_attn",), UNSUPPORTED_MODEL, "num_ln_in_parallel_attn 2 without "
                             "new_decoder_architecture: FalconDecoderLayer builds ln_attn and ln_mlp but its forward calls input_layernorm: "
                             "set new_decoder_architecture to true, or num_ln_in_parallel_attn to 1"))
    elif new and parallel and lns not in (1, 2):
        out.append(HFProblem(("num_ln_in_parallel_attn",), UNSUPPORTED_MODEL, f"num_ln_in_parallel_attn {lns} with "
                             "new_decoder_architecture: FalconDecoderLayer's forward gives the MLP no input (1 or 2 norms only): "
                             "set num_ln_in_parallel_attn to 1 or 2"))
    if new and cfg["num_attention_heads"] % cfg["num_kv_heads"]:
        where = "num_kv_heads" if "num_kv_heads" in raw else "num_attention_heads"
        out.append(HFProblem((where,), SHAPE_MISMATCH, f"num_attention_heads {cfg['num_attention_heads']} is not divisible by "
                             f"num_kv_heads {cfg['num_kv_heads']}: each key/value head serves a whole group"))
    return out


def _feed_forward_problems(value: str) -> list[HFProblem]:
    """T5's feed_forward_proj: "ACT" or "gated-ACT" (T5Config.validate_architecture), ACT one memfit models."""
    from memfit.models.hf_activations import ACTIVATIONS

    parts = value.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        return [HFProblem(("feed_forward_proj",), BAD_MODEL_CONFIG, f"feed_forward_proj {excerpt(value)} must be an activation or gated-<activation> (relu, gated-gelu)")]
    name = "gelu_new" if value == "gated-gelu" else parts[-1]
    if name not in ACTIVATIONS:
        return [HFProblem(("feed_forward_proj",), UNSUPPORTED_MODEL, f"feed_forward_proj {excerpt(value)}: {excerpt(name)} is not an activation memfit models; modeled: {', '.join(sorted(ACTIVATIONS))}: give one of them, or gated-<one of them>")]
    return []


def _post_init_t5(out: dict, extra: dict, raw: dict) -> None:
    """T5Config.__post_init__ (transformers 5.24): the decoder's layers default to the encoder's; feed_forward_proj
    splits into dense_act_fn / is_gated_act (gated-gelu means gelu_new); tie_word_embeddings is always True (the
    head is the shared embedding), and a config.json's false only turns off the d_model ** -0.5 output rescale."""
    if out["num_decoder_layers"] is None:
        out["num_decoder_layers"] = out["num_layers"]
    parts = out["feed_forward_proj"].split("-")
    out["dense_act_fn"] = "gelu_new" if out["feed_forward_proj"] == "gated-gelu" else parts[-1]
    out["is_gated_act"] = parts[0] == "gated"
    out["scale_decoder_outputs"] = raw.get("tie_word_embeddings") is not False
    out["tie_word_embeddings"] = True



def _act_key(family: Family) -> str:
    if "activation_function" in family.fields:
        return "activation_function"
    if "activation" in family.fields:   # Falcon
        return "activation"
    return "hidden_activation" if "hidden_activation" in family.fields else "hidden_act"


def read_fields(family: Family) -> dict:
    """The keys of a config.json the family's transformers class reads: name -> (default, type)."""
    kinds = dict(BASE_FIELDS)
    kinds.update(family.fields)
    if family.head_dim_key and "head_dim" not in kinds:
        kinds["head_dim"] = (None, "int?")  # read through getattr by the attention
    if family.layer_pattern_key:
        kinds[family.layer_pattern_key] = (None, "int?")  # Gemma 3's legacy sliding_window_pattern
    for alias in family.init_aliases:
        kinds[alias] = (None, "int?")  # Falcon's n_embed, popped by the config class's __post_init__
    kinds.update(family.getattr_keys)  # read by the model with getattr, or by its config's __post_init__
    kinds["num_labels"] = (None, "int?")  # PreTrainedConfig builds id2label from it
    kinds["torch_dtype"] = (None, "str?")  # the legacy spelling of dtype
    if family.rope_theta_default is not None:
        kinds.update(ROPE_FIELDS)
        for legacy in family.rope_legacy:
            kinds[legacy] = (None, "number?")
    return kinds


def _nested(given: str, key: str, value: dict) -> list[HFProblem]:
    """The numbers inside rope_parameters / rope_scaling, and the label maps."""
    out = []
    if key in ("rope_parameters", "rope_scaling"):
        for name, item in value.items():
            if name == "rope_type" or name == "type":
                if not isinstance(item, str):
                    out.append(HFProblem((given, name), BAD_MODEL_CONFIG, f"{given}.{name} must be a string, not {_shown(item)}"))
            elif name in FRACTIONS | POSITIVE_NUMBERS or name.endswith(("_factor", "_theta", "_embeddings")):
                if isinstance(item, bool) or not isinstance(item, (int, float)):
                    if item is not None or name in FRACTIONS:
                        out.append(HFProblem((given, name), BAD_MODEL_CONFIG, f"{given}.{name} must be a number, not {_shown(item)}"))
                    continue
                wrong = _range_problem(name, item)
                if wrong is None and name.endswith("_embeddings") and item < 1:
                    wrong = f"{name} must be at least 1, not {item}"
                if wrong is not None:
                    out.append(HFProblem((given, name), BAD_MODEL_CONFIG, f"{given}.{wrong}"))
            elif isinstance(item, float) and not math.isfinite(item) or isinstance(item, HugeInteger):
                out.append(HFProblem((given, name), BAD_MODEL_CONFIG, f"{given}.{name} must be a finite number, not {_shown(item)}"))
    elif key == "id2label":
        if len(value) > MAX_LABELS:
            return [HFProblem((given,), TOO_LARGE, f"id2label has {len(value):,} labels, more than {MAX_LABELS:,}: a classification head that large is not modeled")]
        for label in value:
            # a config.json's keys are strings ("0"); inline YAML gives integers (0): both are label ids
            if isinstance(label, bool) or not (isinstance(label, int) or (isinstance(label, str) and _LABEL_ID.fullmatch(label))):
                out.append(HFProblem((given, label), BAD_MODEL_CONFIG, f"id2label keys are label ids (integers), not {excerpt(label)}", on_key=True))
                break
    elif key == "label2id":
        for label, index in value.items():
            if isinstance(index, bool) or not isinstance(index, int):
                out.append(HFProblem((given, label), BAD_MODEL_CONFIG, f"label2id values are label ids (integers), not {_shown(index)}"))
                break
    return out


def _given(raw: dict, family: Family, key: str):
    for alias, target in family.attribute_map.items():
        if target == key and alias in raw:
            return raw[alias]
    return raw.get(key)


def _where(raw: dict, family: Family, key: str):
    """The key as config.json spells it (an alias when that is what it uses)."""
    if key in raw:
        return key
    for alias, target in family.attribute_map.items():
        if target == key and alias in raw:
            return alias
    return key


# ---------------------------------------------------------------------------------------------
# Normalization


def normalize(raw: dict) -> dict:
    """The dict transformers' config class for raw["model_type"] serializes to (to_dict()), defaults filled.

    `raw` must have passed validate() (a supported model_type, well-typed values).
    """
    if raw.get("model_type") == "llama4":
        return normalize(llama4_text(raw))
    family = FAMILIES[raw["model_type"]]
    if family.block in QWEN_VL_BLOCKS:
        from memfit.models import qwen_vl

        return qwen_vl.normalize(raw)
    if family.block == "mllama":
        from memfit.models import mllama

        return mllama.normalize(raw)
    fields = family.fields
    out = {key: _copy(default) for key, (default, _) in BASE_FIELDS.items()}
    out.update({key: _copy(default) for key, (default, _) in fields.items()})
    extra: dict = {}
    ignored = _ignored(family)
    aliases = {alias: target for alias, target in family.init_aliases.items() if raw.get(alias) is not None}
    for key, value in raw.items():
        key = family.attribute_map.get(key, key)
        if key in aliases:   # FalconConfig.__post_init__: n_embed, when given, replaces hidden_size
            out[aliases[key]] = _copy(value)
            continue
        if key in aliases.values():
            continue
        if key in out:
            out[key] = _copy(value)
        elif key not in ignored:
            extra[key] = _copy(value)

    # PreTrainedConfig.__post_init__ and the family's own, in their order
    if family.kv_heads_default and out.get(family.kv_heads_key) is None:
        out[family.kv_heads_key] = out["num_attention_heads"]
    if family.ffn_default and out.get(family.ffn_default) is None:
        out[family.ffn_default] = out["hidden_size"] * 4   # FalconConfig.__post_init__
    if family.head_dim_default and out.get("head_dim") is None:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    if family.sliding_window_flag:
        if not out["use_sliding_window"]:
            out["sliding_window"] = None
        if out["layer_types"] is None:
            window, first = out["sliding_window"], out["max_window_layers"]
            out["layer_types"] = [
                "sliding_attention" if window is not None and i >= first else "full_attention" for i in range(out["num_hidden_layers"])
            ]
    if family.nope_layers:   # SmolLM3Config.__post_init__
        n = out["num_hidden_layers"]
        if out["no_rope_layers"] is None:
            out["no_rope_layers"] = [int((i + 1) % out["no_rope_layer_interval"] != 0) for i in range(n)]
        if out["layer_types"] is None:
            window = out["use_sliding_window"] and out["sliding_window"] is not None
            out["layer_types"] = ["sliding_attention" if window and not out["no_rope_layers"][i] else "full_attention" for i in range(n)]
    if family.rope_per_layer_type and out.get("use_bidirectional_attention"):
        out["sliding_window"] = out["sliding_window"] // 2 + 1  # Gemma3TextConfig.__post_init__
    pattern = family.layer_pattern
    if family.layer_pattern_key:
        pattern = extra.get(family.layer_pattern_key, family.layer_pattern)
        out["_sliding_window_pattern"] = pattern  # kept (and serialized) by Gemma3TextConfig
    if family.layer_pattern is not None and out["layer_types"] is None:
        # Gemma 2/3: every pattern-th layer attends globally, the others through the sliding window
        out["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(out["num_hidden_layers"])]
    if family.post_init:
        _POST_INIT[family.post_init](out, extra, raw)
    if family.gelu_means_tanh and out["hidden_act"] == "gelu":
        out["hidden_act"] = "gelu_pytorch_tanh"

    torch_dtype = extra.pop("torch_dtype", None)
    if torch_dtype is not None and out["dtype"] is None:
        out["dtype"] = torch_dtype
    if isinstance(out["dtype"], str) and out["dtype"].startswith("torch."):
        out["dtype"] = out["dtype"][len("torch.") :]

    if out["id2label"] is None:
        labels = extra.pop("num_labels", None)
        labels = 2 if labels is None else labels
        out["id2label"] = {i: f"LABEL_{i}" for i in range(labels)}
        if out["label2id"] is None:
            out["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    else:
        extra.pop("num_labels", None)
        out["id2label"] = {int(key): value for key, value in out["id2label"].items()}
        if out["label2id"] is None:
            out["label2id"] = {value: key for key, value in out["id2label"].items()}

    if family.rope_theta_default is not None:
        _rope(out, extra, family)

    out["output_attentions"] = bool(extra.pop("output_attentions", False))
    out["_name_or_path"] = str(extra.pop("name_or_path", ""))
    for key in DROPPED_KEYS:
        if key not in fields and key not in BASE_FIELDS:
            extra.pop(key, None)
    extra.pop("transformers_version", None)
    out.update(extra)
    if family.block == "llava":
        _llava_subconfigs(out, extra)
    out["model_type"] = family.model_type
    out["transformers_version"] = "5.24.0"
    return out


def _qwen2_moe(out: dict, extra: dict, raw: dict) -> None:
    """Qwen2MoeConfig.__post_init__: mlp_only_layers defaults to [], the window is 0 without
    use_sliding_window, and every other layer below max_window_layers slides when it is on."""
    out["mlp_only_layers"] = [] if out["mlp_only_layers"] is None else out["mlp_only_layers"]
    out["sliding_window"] = out["sliding_window"] if out["use_sliding_window"] else 0
    if out["layer_types"] is None:
        out["layer_types"] = [
            "sliding_attention" if (i + 1) % 2 and i < out["max_window_layers"] and out["use_sliding_window"] else "full_attention"
            for i in range(out["num_hidden_layers"])
        ]


def _qwen3_moe(out: dict, extra: dict, raw: dict) -> None:
    """Qwen3MoeConfig.__post_init__: the window is None without use_sliding_window; mlp_only_layers
    defaults to []. Its num_experts field is stored as num_local_experts (the class's attribute_map)."""
    out["sliding_window"] = out["sliding_window"] if out["use_sliding_window"] else None
    out["mlp_only_layers"] = [] if out["mlp_only_layers"] is None else out["mlp_only_layers"]
    default = out.pop("num_experts")
    extra.setdefault("num_local_experts", default)


def _deepseek_v3(out: dict, extra: dict, raw: dict) -> None:
    """DeepseekV3Config.__post_init__: qk_head_dim = qk_nope_head_dim + qk_rope_head_dim, and head_dim is the rotary
    part (qk_rope_head_dim: what the rotary embedding reads). Its attribute_map stores num_mtp_layers under
    num_nextn_predict_layers (the published config.json's key), leaving the declared field unset."""
    out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    out["head_dim"] = out["qk_rope_head_dim"]
    default = out.pop("num_mtp_layers")
    extra.setdefault("num_nextn_predict_layers", default)


def _gpt_oss(out: dict, extra: dict, raw: dict) -> None:
    """GptOssConfig.__post_init__: without rope_parameters, yarn (factor 32 over 4096 positions); layer_types (every
    second layer full, the others sliding) is the Family's layer_pattern 2. A legacy rope_scaling still wins (_rope)."""
    if out["rope_parameters"] is None:
        out["rope_parameters"] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                  "original_max_position_embeddings": 4096}



def llama4_text(raw: dict) -> dict:
    """A llama4 (multimodal) config.json's text model as its own config.json: what AutoModelForCausalLM builds
    (Llama4ForCausalLM over text_config)."""
    text = {k: v for k, v in raw["text_config"].items() if k != "model_type"}
    return {"model_type": "llama4_text", **text}


def _llama4_layers(raw: dict, cfg: dict) -> list[HFProblem]:
    """Llama 4's per-layer lists: no_rope_layers needs an entry per layer (Llama4TextAttention reads
    no_rope_layers[layer_idx]); layer_types one per layer; a moe_layers index past the last layer makes no MoE layer."""
    n, out = cfg["num_hidden_layers"], []
    for key in ("no_rope_layers", "layer_types"):
        if key in raw and raw[key] and len(cfg[key]) < n:
            out.append(HFProblem((key,), SHAPE_MISMATCH, f"{key} has {len(cfg[key])} entries for {n} layers: one per layer"))
    if cfg.get("layer_types") and "sliding_attention" in cfg["layer_types"]:
        out.append(HFProblem(("layer_types",), BAD_MODEL_CONFIG, "llama4_text's layer types are full_attention and chunked_attention"))
    return out


def _llama4_text(out: dict, extra: dict, raw: dict) -> None:
    """Llama4TextConfig.__post_init__: no_rope_layers (when empty) from no_rope_layer_interval (every interval-th layer
    NoPE), moe_layers from interleave_moe_layer_step, layer_types from them (a rope layer attends in chunks when
    attention_chunk_size is set)."""
    n = out["num_hidden_layers"]
    if not out["no_rope_layers"]:
        out["no_rope_layers"] = [int((i + 1) % out["no_rope_layer_interval"] != 0) for i in range(n)]
    if out["moe_layers"] is None:
        step = out["interleave_moe_layer_step"]
        out["moe_layers"] = list(range(step - 1, n, step))
    if out["layer_types"] is None:
        chunked = out["attention_chunk_size"] is not None
        out["layer_types"] = ["chunked_attention" if rope and chunked else "full_attention" for rope in out["no_rope_layers"]]


def _deberta_v2(out: dict, extra: dict, raw: dict) -> None:
    """DebertaV2Config.__post_init__: pos_att_type "p2c|c2p" split into a list; pooler_hidden_size (hidden_size unless
    given)."""
    if isinstance(out["pos_att_type"], str):
        out["pos_att_type"] = [x.strip() for x in out["pos_att_type"].lower().split("|")]
    out["pooler_hidden_size"] = extra.pop("pooler_hidden_size", out["hidden_size"])


def _modernbert(out: dict, extra: dict, raw: dict) -> None:
    """ModernBertConfig.__post_init__ and convert_rope_params_to_dict: layer_types from global_attn_every_n_layers (3;
    layer i global when i is a multiple), one rope_parameters dict per layer type (global_rope_theta 160000,
    local_rope_theta 10000, rope_scaling applied to both); to_dict drops reference_compile."""
    if out["layer_types"] is None:
        every = extra.get("global_attn_every_n_layers", 3)
        every = every if isinstance(every, int) and not isinstance(every, bool) and every > 0 else 3
        out["layer_types"] = ["sliding_attention" if i % every else "full_attention" for i in range(out["num_hidden_layers"])]
    scaling = extra.pop("rope_scaling", None)
    given = out.get("rope_parameters")
    parameters = {key: dict(value) if isinstance(value, dict) else value for key, value in given.items()} if given else {
        "sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}}
    if isinstance(scaling, dict):
        for kind in ("full_attention", "sliding_attention"):
            if isinstance(parameters.get(kind), dict):
                parameters[kind].update(scaling)
    for kind, key, default in (("full_attention", "global_rope_theta", 160000.0), ("sliding_attention", "local_rope_theta", 10000.0)):
        if not isinstance(parameters.get(kind), dict):
            parameters[kind] = {"rope_type": "default"}
        theta = extra.pop(key, default)
        parameters[kind].setdefault("rope_theta", theta)
        parameters[kind].setdefault("rope_type", parameters[kind].get("type", "default"))
    out["rope_parameters"] = parameters
    extra.pop("reference_compile", None)


_POST_INIT = {"qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "t5": _post_init_t5, "deepseek_v3": _deepseek_v3,
              "gpt_oss": _gpt_oss, "llama4_text": _llama4_text, "deberta_v2": _deberta_v2, "modernbert": _modernbert}


def _ignored(family: Family) -> frozenset:
    """Keys another family's class reads and this one's does not (head_dim on gpt2, num_key_value_heads on
    bert...): transformers keeps them as attributes the model never reads, so they are left out here, where
    memfit's model code would read them by name."""
    return _ignored_by_type(family.model_type)


@lru_cache(maxsize=None)
def _ignored_by_type(model_type: str) -> frozenset:
    from memfit.models.family_keys import READ_KEYS  # every family's keys, without importing every family

    family = FAMILIES[model_type]
    return frozenset(READ_KEYS - set(read_fields(family)) - set(family.attribute_map) - set(family.attribute_map.values()))


def _rope(out: dict, extra: dict, family: Family) -> None:
    if family.rope_per_layer_type:
        return _rope_per_layer_type(out, extra, family)
    scaling = extra.pop("rope_scaling", None)
    parameters = scaling or out.get("rope_parameters")
    parameters = dict(parameters) if parameters else {}
    theta = extra.pop("rope_theta", None)
    partial = extra.get("partial_rotary_factor") if family.rope_partial_kept else extra.pop("partial_rotary_factor", None)
    for legacy, key in family.rope_legacy.items():
        if legacy in extra:
            value = extra.pop(legacy)
            if key == "rope_theta":
                theta = value
            else:
                partial = value
    parameters.setdefault("rope_theta", family.rope_theta_default if theta is None else theta)
    if partial is not None:
        parameters.setdefault("partial_rotary_factor", partial)
    elif family.rope_partial_default is not None:
        parameters.setdefault("partial_rotary_factor", family.rope_partial_default)
    parameters.setdefault("rope_type", parameters.get("type", "default"))
    if parameters["rope_type"] in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in out:
            parameters["original_max_position_embeddings"] = out["original_max_position_embeddings"]
        else:
            parameters.setdefault("original_max_position_embeddings", out["max_position_embeddings"])
    if family.model_type == "phi3" and parameters["rope_type"] in ("su", "yarn"):
        parameters["rope_type"] = "longrope"
    out["rope_parameters"] = parameters


def _rope_per_layer_type(out: dict, extra: dict, family: Family) -> None:
    """Gemma3TextConfig.convert_rope_params_to_dict: one rope_parameters dict per layer type."""
    scaling = extra.pop("rope_scaling", None)
    parameters = out.get("rope_parameters")
    parameters = {key: dict(value) for key, value in parameters.items()} if parameters else {
        "sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}}
    if scaling is not None:
        parameters["full_attention"].update(scaling)
    theta, local = extra.pop("rope_theta", None), extra.pop("rope_local_base_freq", None)
    if parameters.get("full_attention") is None:
        parameters["full_attention"] = {"rope_type": "default"}
    parameters["full_attention"].setdefault("rope_theta", family.rope_theta_default["global"] if theta is None else theta)
    if parameters.get("sliding_attention") is None:
        parameters["sliding_attention"] = {"rope_type": "default"}
    parameters["sliding_attention"].setdefault("rope_theta", family.rope_theta_default["local"] if local is None else local)
    for value in parameters.values():
        value.setdefault("rope_type", value.get("type", "default"))
    out["rope_parameters"] = parameters


def _copy(value):
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):  # a tuple default (WhisperConfig's begin_suppress_tokens) serializes as a list
        return [_copy(item) for item in value]
    return value
