import inspect
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memfit import compute_footprint
from memfit.recipe.calculator import OPTIMIZER_STATES

KEYS = ["parameters", "gradients", "activations", "optimizer_state", "total"]

SEED_EXAMPLES = [
    (
        ([[4, 3], [3]], 2, 4, [[2, 4]], 2, "adam", 4),
        {"parameters": 30, "gradients": 60, "activations": 16, "optimizer_state": 120, "total": 226},
    ),
    (
        ([[2, 2]], 4, 4, [], 4, "sgd", 4),
        {"parameters": 16, "gradients": 16, "activations": 0, "optimizer_state": 0, "total": 32},
    ),
    (
        ([[128, 64], [64]], 2, 2, [[32, 128]], 2, "adagrad", 4),
        {"parameters": 16512, "gradients": 16512, "activations": 8192, "optimizer_state": 33024, "total": 74240},
    ),
]


def call(param_shapes=((2, 2),), pw=4, gw=4, act=(), aw=4, opt="sgd", ow=4):
    return compute_footprint(list(map(list, param_shapes)), pw, gw, list(map(list, act)), aw, opt, ow)


@pytest.mark.parametrize("args, expected", SEED_EXAMPLES)
def test_seed_examples(args, expected):
    result = compute_footprint(*args)
    assert result == expected
    assert list(result) == KEYS
    assert all(type(v) is int for v in result.values())


def test_keyword_call_with_exact_parameter_names():
    names = list(inspect.signature(compute_footprint).parameters)
    assert names == [
        "param_shapes",
        "param_bytes_per_element",
        "grad_bytes_per_element",
        "activation_shapes",
        "activation_bytes_per_element",
        "optimizer",
        "optimizer_bytes_per_element",
    ]
    args, expected = SEED_EXAMPLES[0]
    assert compute_footprint(**dict(zip(names, args))) == expected


def test_scalar_zero_dim_and_empty_collections():
    assert call([[]], 4, 4, [[]], 2, "adam", 4) == {
        "parameters": 4, "gradients": 4, "activations": 2, "optimizer_state": 8, "total": 18,
    }
    assert call([[5, 0, 7]], act=[[0]], opt="adam")["total"] == 0
    assert call([], act=[], opt="adam") == dict.fromkeys(KEYS, 0)


def test_totals_past_two_to_the_64_stay_exact():
    dim = 10**12
    result = call([[dim, dim]], 4, 4, [[dim, dim, dim]], 2, "adam", 4)
    assert result["parameters"] == 4 * 10**24
    assert result["activations"] == 2 * 10**36
    assert result["total"] == 4 * 10**24 + 4 * 10**24 + 2 * 10**36 + 8 * 10**24
    assert result["total"] > 2**64 and type(result["total"]) is int


def test_optimizer_names_are_case_insensitive():
    assert call(opt="ADAM") == call(opt="adam") == call(opt=" Adam ")


@pytest.mark.parametrize(
    "name, states",
    [("sgd", 0), ("adagrad", 1), ("adam", 2), ("adamw", 2), ("momentum", 1), ("rmsprop", 1), ("lion", 1), ("adamax", 2), ("nadam", 2)],
)
def test_optimizer_table(name, states):
    assert OPTIMIZER_STATES[name] == states
    assert call([[10]], ow=4, opt=name)["optimizer_state"] == 40 * states


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"param_shapes": [[4, 3], [2, -3]]}, ValueError, "param_shapes[1][1] is -3: dims must be non-negative integers"),
        ({"param_shapes": [[2.5]]}, TypeError, "param_shapes[0][0] is 2.5: dims must be non-negative integers"),
        ({"param_shapes": [["4"]]}, TypeError, "param_shapes[0][0] is '4': dims must be non-negative integers"),
        ({"param_shapes": [[True]]}, TypeError, "param_shapes[0][0] is True: dims must be non-negative integers"),
        ({"param_shapes": [5]}, TypeError, "param_shapes[0] is 5: a shape must be a list of dims"),
        ({"param_shapes": ["ab"]}, TypeError, "param_shapes[0] is 'ab': a shape must be a list of dims"),
        ({"param_shapes": None}, TypeError, "param_shapes is None: expected a list of shapes"),
        ({"activation_shapes": None}, TypeError, "activation_shapes is None"),
        ({"activation_shapes": [[1], None]}, TypeError, "activation_shapes[1] is None"),
        ({"param_bytes_per_element": -2}, ValueError, "param_bytes_per_element is -2: a byte width must be positive"),
        ({"grad_bytes_per_element": 0}, ValueError, "grad_bytes_per_element is 0: a byte width must be positive"),
        ({"activation_bytes_per_element": "4"}, TypeError, "activation_bytes_per_element is '4'"),
        ({"optimizer_bytes_per_element": True}, TypeError, "optimizer_bytes_per_element is True"),
        ({"optimizer_bytes_per_element": 0.3}, ValueError, "multiple of 1/8"),
        ({"param_bytes_per_element": float("nan")}, ValueError, "must be finite"),
        ({"optimizer": "adamm"}, ValueError, "optimizer is 'adamm': unknown optimizer; known: adadelta, adagrad, adam,"),
        ({"optimizer": None}, TypeError, "optimizer is None"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_it(kwargs, error, message):
    args = {
        "param_shapes": [[2, 2]],
        "param_bytes_per_element": 4,
        "grad_bytes_per_element": 4,
        "activation_shapes": [[1]],
        "activation_bytes_per_element": 4,
        "optimizer": "adam",
        "optimizer_bytes_per_element": 4,
    }
    args.update(kwargs)
    with pytest.raises(error) as raised:
        compute_footprint(**args)
    assert message in str(raised.value)


def test_integral_float_width_is_accepted_as_int():
    assert call([[3, 3]], 2.0, 4.0, [[2]], 2.0, "adam", 4.0) == call([[3, 3]], 2, 4, [[2]], 2, "adam", 4)
    assert type(call([[3]], 2.0)["parameters"]) is int


def test_sub_byte_widths_round_each_tensor_up_to_whole_bytes():
    # int4: 0.5 byte; 3 elements -> 2 bytes, per tensor (two tensors -> 4, not 3)
    result = call([[3], [3]], 0.5, 4, [], 4, "sgd", 4)
    assert result["parameters"] == 4
    assert call([[3], [3]], Fraction(1, 2))["parameters"] == 4
    assert call([[8]], 0.125)["parameters"] == 1  # 1-bit
    assert call([[9]], Fraction(3, 8))["parameters"] == 4  # 27 bits -> 4 bytes


shapes = st.lists(st.lists(st.integers(0, 2**40), max_size=4), max_size=6)
widths = st.integers(1, 16)
optimizers = st.sampled_from(sorted(OPTIMIZER_STATES))


@given(shapes, widths, widths, shapes, widths, optimizers, widths)
def test_total_is_the_sum_of_the_four(p, pw, gw, a, aw, opt, ow):
    result = compute_footprint(p, pw, gw, a, aw, opt, ow)
    assert result["total"] == sum(result[k] for k in KEYS[:4])
    assert all(type(v) is int and v >= 0 for v in result.values())


@given(shapes, widths, shapes, optimizers, st.integers(1, 9))
def test_each_category_is_linear_in_its_width(p, w, a, opt, k):
    one = compute_footprint(p, w, w, a, w, opt, w)
    scaled = compute_footprint(p, k * w, k * w, a, k * w, opt, k * w)
    for key in KEYS:
        assert scaled[key] == k * one[key]


@given(shapes, shapes, optimizers, st.lists(st.integers(0, 9), max_size=3))
def test_a_zero_size_tensor_changes_nothing(p, a, opt, dims):
    zero = dims + [0]
    assert compute_footprint(p + [zero], 2, 4, a + [zero], 2, opt, 4) == compute_footprint(p, 2, 4, a, 2, opt, 4)


@given(shapes, optimizers, st.randoms())
def test_parameter_order_does_not_matter(p, opt, rnd):
    shuffled = list(p)
    rnd.shuffle(shuffled)
    assert compute_footprint(shuffled, 2, 4, [], 2, opt, 4) == compute_footprint(p, 2, 4, [], 2, opt, 4)
