"""The checker on config text: each problem at its exact (line, col), 1-based as printed."""

import textwrap
import tracemalloc

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.check.pipeline import Options, check
from memfit.diagnostics.units import parse_bytes

BASE = """\
memfit: 1
device:
  memory: 24 GiB
optimizer: adam
parameters:
  - [512, 6400]
activations:
  - [32, 512]
"""


def run(source: str, **options):
    return check(textwrap.dedent(source), "config.yaml", Options(**options))


def problems(source: str, **options):
    return [(d.range.start_line + 1, d.range.start_character + 1, d.code) for d in run(source, **options).diagnostics]


def only(source: str, **options):
    found = run(source, **options).diagnostics
    assert len(found) == 1, found
    return found[0]


def test_a_fitting_config_has_no_diagnostics_and_exact_totals():
    result = run(BASE)
    assert result.diagnostics == []
    # 3,276,800 fp32 parameters: 13,107,200 B, as many gradients, Adam's two states 26,214,400 B; 16,384 fp32 activations
    assert 512 * 6400 == 3_276_800 and 32 * 512 * 4 == 65_536
    assert result.footprint == {"parameters": 13_107_200, "gradients": 13_107_200, "activations": 65_536, "optimizer_state": 26_214_400,
                                "total": 52_494_336}
    assert result.budget == 24 * 2**30


def test_unknown_key_points_at_the_key_and_suggests():
    d = only(BASE.replace("optimizer: adam", "optimizer: adam\noptimiser: adam"))
    assert (d.range.start_line, d.range.start_character, d.range.end_character) == (4, 0, 9)
    assert d.code == "schema" and "did you mean 'optimizer'" in d.message


def test_schema_error_points_at_the_element():
    source = BASE.replace("  - [512, 6400]", "  - [512, 6400]\n  - {name: w, shape: [3, -3]}")
    d = only(source)
    assert (d.range.start_line + 1, d.range.start_character + 1) == (7, 26)
    assert d.message == "parameters[1].shape[1] is -3; dims must be non-negative integers"


@pytest.mark.parametrize("bad", ["yes", "2.0", "2.5", "'4'", "null", "1e3"])
def test_booleans_floats_and_strings_are_not_dims(bad):
    d = only(BASE.replace("[512, 6400]", f"[512, {bad}]"))
    assert (d.range.start_line + 1, d.range.start_character + 1, d.code) == (6, 11, "schema")
    assert "dims must be non-negative integers" in d.message


def test_duplicate_key_is_an_error_at_its_second_occurrence():
    assert problems(BASE + "optimizer: sgd\n") == [(9, 1, "duplicate-key")]


def test_unknown_dtype_suggests_the_nearest():
    d = only(BASE + "dtypes:\n  parameters: bfloat61\n")
    assert (d.range.start_line + 1, d.range.start_character + 1, d.code) == (10, 15, "unknown-dtype")
    assert "did you mean bfloat16" in d.message


def test_unknown_optimizer_lists_the_known_ones():
    d = only(BASE.replace("optimizer: adam", "optimizer: adamm"))
    assert (d.range.start_line + 1, d.range.start_character + 1, d.code) == (4, 12, "unknown-optimizer")
    assert "known: adadelta, adagrad, adam" in d.message


@pytest.mark.parametrize(
    "memory, fragment",
    [("24 GIB", "did you mean GiB"), ("24 KB", "ambiguous"), ("0.3 B", "not a whole number"), ("24", "not a byte quantity"), ("lots", "not a byte quantity")],
)
def test_bad_units_are_diagnostics_not_guesses(memory, fragment):
    d = only(BASE.replace("24 GiB", f"'{memory}'"))
    assert (d.range.start_line + 1, d.range.start_character + 1, d.code) == (3, 11, "bad-unit")
    assert fragment in d.message


def test_negative_budget_is_a_bad_unit():
    assert problems(BASE.replace("24 GiB", "-1 GiB")) == [(3, 11, "bad-unit")]
    assert problems(BASE.replace("24 GiB", "-5")) == [(3, 11, "bad-unit")]



def test_a_budget_of_zero_or_less_is_a_bad_budget():
    # reserve > memory: a budget below zero (issue 10: its own code, no longer bad-unit)
    assert problems(BASE.replace("24 GiB", "1 GiB\n  reserve: 2 GiB")) == [(4, 12, "bad-budget")]
    # reserve == memory: nothing fits; the footprint is still computed
    result = run(BASE.replace("24 GiB", "1 GiB\n  reserve: 100%"))
    assert [(d.range.start_line + 1, d.range.start_character + 1, d.code, d.severity) for d in result.diagnostics] == [(3, 11, "bad-budget", "error")]
    assert "the budget is 0 B (device.memory 1 GiB - reserve 100%)" in result.diagnostics[0].message
    assert result.footprint["total"] > 0
    assert problems(BASE, budget=0) == [(1, 1, "bad-budget")]


@pytest.mark.parametrize(
    "text, expected",
    [("1.5 GiB", 3 * 2**29), ("80GB", 80 * 10**9), ("512 MiB", 2**29), ("1 kB", 1000), (" 7 B ", 7), ("2 TiB", 2**41), (".5 KiB", 512)],
)
def test_unit_parsing(text, expected):
    assert parse_bytes(text) == expected


def test_budget_exceeded_sits_on_device_memory_with_total_budget_and_overshoot():
    source = BASE.replace("24 GiB", "40 MB")
    d = only(source)
    total = run(source).footprint["total"]
    assert total == 2 * 512 * 6400 * 4 + 2 * 512 * 6400 * 4 + 32 * 512 * 4 == 52_494_336
    assert (d.range.start_line + 1, d.range.start_character + 1, d.code, d.severity) == (3, 11, "budget-exceeded", "error")
    assert "total 52,494,336 B (50.06 MiB)" in d.message
    assert "budget 40,000,000 B (38.15 MiB)" in d.message
    assert "by 12,494,336 B (11.92 MiB)" in d.message


def test_equal_to_the_budget_passes_and_one_byte_less_fails():
    total = run(BASE).footprint["total"]
    assert problems(BASE.replace("24 GiB", str(total)), warn_at=1) == []
    assert problems(BASE.replace("24 GiB", str(total - 1))) == [(3, 11, "budget-exceeded")]


def test_reserve_and_percent_reserve_shrink_the_budget():
    assert run(BASE.replace("24 GiB", "24 GiB\n  reserve: 1 GiB")).budget == 23 * 2**30
    # 10% of 1001 bytes is 100.1: the reserve rounds up so the budget is never overstated
    assert run(BASE.replace("24 GiB", "1001\n  reserve: 10%")).budget == 900


def test_high_water_warning_default_and_configurable():
    total = run(BASE).footprint["total"]
    near = BASE.replace("24 GiB", str(total * 100 // 95))
    d = only(near)
    assert (d.code, d.severity) == ("near-budget", "warning")
    assert problems(near, warn_at=__import__("fractions").Fraction(96, 100)) == []
    assert problems(near.replace("device:", "device:\n  warn_at: 99%")) == []


def test_budget_from_the_command_line_overrides_and_supplies():
    no_device = BASE.replace("device:\n  memory: 24 GiB\n", "")
    assert problems(no_device) == [(1, 1, "no-budget")]
    assert run(no_device, budget=10**12).diagnostics == []
    d = only(BASE, budget=1000)
    assert d.code == "budget-exceeded" and "from --budget" in d.message and d.range.start_line == 0


def test_mapping_tensors_count_dtype_and_frozen():
    source = """\
    memfit: 1
    device: {memory: 1 TB}
    dtypes: {parameters: bf16, gradients: fp32, activations: half, optimizer_state: float32}
    optimizer: adam
    parameters:
      - {name: blocks.w, shape: [64, 64], count: 12}
      - {name: base, shape: [1000, 3], dtype: nf4, trainable: false}
      - {name: scale, shape: [], dtype: float64}
    activations:
      - {name: a, shape: [8, 64], count: 3, dtype: int8}
    """
    fp = run(source).footprint
    blocks = 12 * 64 * 64  # 49,152 elements: bf16 parameters, fp32 gradients, Adam's two fp32 states
    # the frozen nf4 base: 3,000 elements at half a byte, no gradient, no state; the float64 scalar: 8 B, its fp32
    # gradient 4 B and two fp32 states 8 B
    assert fp["parameters"] == 2 * blocks + 3000 // 2 + 8 == 99_812
    assert fp["gradients"] == 4 * blocks + 4 == 196_612
    assert fp["optimizer_state"] == 2 * 4 * blocks + 2 * 4 == 393_224
    assert fp["activations"] == 3 * 8 * 64 * 1 == 1_536  # int8
    assert fp["total"] == 99_812 + 196_612 + 393_224 + 1_536


def test_huge_dims_are_exact():
    fp = run(BASE.replace("[512, 6400]", f"[{10**30}, 3]"), budget=2**200).footprint
    assert fp["parameters"] == 12 * 10**30 and fp["total"] == 48 * 10**30 + 32 * 512 * 4


@pytest.mark.parametrize(
    "source, expected",
    [
        ("memfit: 1\noptimizer: [adam\n", [(2, 12, "yaml-syntax")]),  # where the unclosed [ opened
        ("", [(1, 1, "not-a-config")]),
        ("- memfit: 1\n", [(1, 1, "not-a-config")]),
        ("42\n", [(1, 1, "not-a-config")]),
        ("name: x\n", [(1, 1, "not-a-config")]),
        ("memfit: 1\noptimizer: !!python/object:os.system {}\n", [(2, 12, "yaml-syntax")]),
        ("memfit: 2\noptimizer: sgd\ndevice: {memory: 1}\n", [(1, 9, "schema")]),
        ("memfit: 1\ndevice: {memory: 1}\n", [(1, 1, "schema")]),
        ("memfit: 1\noptimizer: sgd\ndevice: {memory: 9}\n---\nmemfit: 1\n", [(4, 1, "yaml-syntax")]),
        ("memfit: 1\noptimizer: sgd\nparameters: &a [*a]\n", [(3, 17, "yaml-syntax")]),
        ("memfit: 1\noptimizer: sgd\n[1, 2]: x\n", [(3, 1, "yaml-syntax")]),
    ],
)
def test_bad_documents(source, expected):
    assert problems(source) == expected


def test_skip_unrecognized_skips_other_yaml_even_broken():
    gitlab_job_named_memfit = "memfit:\n  image: python:3.12\n  script:\n    - memfit check configs/\n"
    gitlab_reference = ".setup:\n  script: [x]\nmemfit:\n  script:\n    - !reference [.setup, script]\n"
    cloudformation = "Resources:\n  memfit: !Ref Thing\n"
    for text in ("name: x\n", "- 1\n", "", "key: [unclosed\n", "{{ helm }}: x\n", gitlab_job_named_memfit, gitlab_reference, cloudformation, "jobs:\n  memfit: 1\n"):
        result = check(text, "other.yaml", Options(skip_unrecognized=True))
        assert result.skipped and result.diagnostics == []
    assert not check("memfit: 1\noptimizer: [\n", "c.yaml", Options(skip_unrecognized=True)).skipped


def test_a_bom_before_the_marker_is_still_a_config():
    assert check("\ufeffmemfit: 1\noptimizer: [\n", "c.yaml", Options(skip_unrecognized=True)).diagnostics


@pytest.mark.parametrize("dim", ["064", "1:30", "1_000", "0b101"])
def test_yaml_1_1_only_number_forms_are_not_silently_dims(dim):
    d = only(BASE.replace("[512, 6400]", f"[512, {dim}]"))
    assert (d.range.start_line + 1, d.range.start_character + 1, d.code) == (6, 11, "schema")
    assert f"is '{dim}'; dims must be" in d.message


def test_hex_and_signed_decimal_stay_numbers():
    assert run(BASE.replace("[512, 6400]", "[0x200, +6400]")).footprint == run(BASE).footprint


def test_no_footprint_when_the_numbers_would_be_wrong():
    unknown_optimizer = run(BASE.replace("optimizer: adam", "optimizer: adamm"))
    assert unknown_optimizer.footprint is None and unknown_optimizer.budget is None
    bad_unit = run(BASE.replace("24 GiB", "0.3 B"))  # schema-valid, but not whole bytes
    assert bad_unit.footprint == run(BASE).footprint and bad_unit.budget is None  # only the budget is unknown


def test_alias_bomb_is_refused_in_bounded_time_and_memory():
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = "memfit: 1\noptimizer: sgd\n" + "\n".join(lines) + "\nparameters: *j\n"
    tracemalloc.start()
    found = problems(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert found and found[0][2] == "yaml-syntax"
    assert peak < 50 * 2**20  # the bomb expanded is 9^10 strings: bounded by bytes, not by the clock


def test_aliases_within_reason_are_fine():
    source = BASE + "extra_shapes: &s [64, 64]\n"
    assert problems(source) == [(9, 1, "schema")]  # the unknown key, not the alias
    ok = BASE.replace("  - [512, 6400]", "  - &w [512, 6400]\n  - *w")
    assert run(ok).footprint["parameters"] == 2 * 512 * 6400 * 4


def test_merge_keys_are_applied_and_local_keys_win():
    source = """\
    memfit: 1
    optimizer: sgd
    device: {memory: 1 MB}
    parameters:
      - &base {name: a, shape: [10], trainable: false}
      - {<<: *base, name: b}
      - {<<: *base, trainable: true}
    """
    result = run(source)
    assert result.diagnostics == []
    assert [(t.name, t.trainable) for t in result.config.tensors] == [("a", False), ("b", False), ("a", True)]


def test_ten_megabyte_config():
    body = "".join(f"  - {{name: layer{i}.w, shape: [{i % 97 + 1}, {i % 89 + 1}]}}\n" for i in range(260_000))
    source = BASE.replace("  - [512, 6400]\n", body)
    assert len(source) > 10 * 10**6
    result = run(source, budget=10**12)
    assert result.diagnostics == []
    elements = sum((i % 97 + 1) * (i % 89 + 1) for i in range(260_000))
    fp32, adam = 4 * elements, 2 * 4 * elements
    assert result.footprint == {"parameters": fp32, "gradients": fp32, "activations": 65_536, "optimizer_state": adam, "total": 2 * fp32 + 65_536 + adam}


yaml_data = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
config_keys = st.sampled_from(["memfit", "name", "device", "dtypes", "optimizer", "parameters", "activations", "memory", "shape", "count", "trainable", "dtype", "reserve"])
config_like = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.sampled_from(["adam", "sgd", "24 GiB", "bf16", "10%", "x"]) | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(config_keys, children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_raises(text):
    result = check(text, "fuzz.yaml")
    assert isinstance(result.diagnostics, list)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(yaml_data | config_like.map(lambda d: {"memfit": 1, **d} if isinstance(d, dict) else d))
def test_arbitrary_yaml_data_never_raises(data):
    text = yaml.safe_dump(data, allow_unicode=True)
    result = check(text, "fuzz.yaml")
    for d in result.diagnostics:
        assert d.range.start_line >= 0 and d.code and d.message
    if result.footprint is not None:
        assert all(type(v) is int for v in result.footprint.values())
