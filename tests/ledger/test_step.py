"""`rounded` (ledger/step.py): the step the allocator's granule walks, every field of Row, Loss and Step either rounded
up to the granule (bytes) or carried as it is, none dropped: a field added to them fails here until it is placed in
step.ROUNDED or step.CARRIED and given a value below."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from memfit.ledger.step import CARRIED, ROUNDED, Loss, Row, Step, phases, rounded

GRANULE = 512

# every field set, none to its default; bytes that are not multiples of the granule
ROW = dict(name="head", grads=[1000, 1], params=[1001], frozen=[1002], input=3, output=4, view=True, kept=[5], inner=1003,
           inner_kept=True, output_grad=False, grad_input=False, backward_extra=1004, recompute=1005, forward_flight=1006,
           forward_early=1007, backward_flight=1008, flight_freed=1009, recompute_moment=(1010, 1011), flight_first=True,
           kept_ops=["op"], after_flight=(1012, -3, 1013), early_flight=1014, grad_started=1015, grad_completed=1016, cast_cached=1017,
           grads_born=[1018, 1], grads_taken=[1019])
LOSS = dict(forward=(1000, 1), backward=(2000,), upcast=1001, held=(1002,))
STEP = dict(tensors={3: 1000, 4: 1, 5: 513}, batch=[3], optimizer_state=[1000], optimizer="adamw", impl="fused",
            overhead=1017, stepped=[1018], accumulating=True, loss_kept=[5], step_in_backward=True, offloaded={5},
            kept_gradients=True, forward_held=1019, outputs_held=1020, saved_rewritten=1021, grad_buffered=True,
            kwargs_held=((1024, 0),))


def _up(value):
    if isinstance(value, int):
        return -(-value // GRANULE) * GRANULE
    if isinstance(value, dict):
        return {k: _up(v) for k, v in value.items()}
    return type(value)(_up(v) for v in value)


@pytest.mark.parametrize("cls, values", [(Row, ROW), (Loss, LOSS), (Step, {**STEP, "rows": None, "loss": None})])
def test_every_field_is_placed_and_set(cls, values):
    names = [f.name for f in fields(cls)]
    placed = ROUNDED[cls.__name__] + CARRIED[cls.__name__]
    assert sorted(placed) == sorted(names), "place each field in step.ROUNDED or step.CARRIED, once"
    assert sorted(values) == sorted(names), "give each field a value here"
    for f in fields(cls):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        assert values[f.name] is None or values[f.name] != default, f.name


def test_rounded_rounds_the_bytes_and_carries_the_rest():
    step = Step(rows=[Row(**ROW)], loss=Loss(**LOSS), **STEP)
    out = rounded(step, GRANULE)
    for record, made, values in ((step.rows[0], out.rows[0], ROW), (step.loss, out.loss, LOSS), (step, out, STEP)):
        name = type(record).__name__
        for field in values:
            want = _up(values[field]) if field in ROUNDED[name] else values[field]
            if field == "after_flight":  # its first term: the bytes of the gradients made by then
                want = (_up(want[0]), *want[1:])
            assert getattr(made, field) == want, (name, field)
    assert len(out.rows) == 1


def test_gradients_a_later_row_makes_for_an_earlier_ones_tensors_are_held_until_it_takes_them():
    """Row.grads_born / grads_taken (T5's decoder under full checkpointing, models/hf_act_t5.t5_held_gradients): each
    gradient is alive in the backward from the end of the row that makes it through the row that takes it, nowhere
    else; each row's own moments otherwise as without them."""

    def walk(born: list, taken: list) -> list:
        rows = [Row(f"r{i}", grads=[100], params=[100], input=i + 1, output=i + 2, kept=[i + 1], grad_input=i > 0)
                for i in range(3)]
        rows[2].grads_born, rows[0].grads_taken = born, taken
        step = Step(rows=rows, tensors={t: 1000 for t in range(1, 5)}, batch=[1], loss=Loss(forward=(0,), backward=(0,)),
                    optimizer_state=[], optimizer="sgd", impl="foreach")
        trace: list = []
        walked = phases(step, trace)
        return [(at, live["transient"]) for phase, at, live, _ in trace if phase == "backward"], walked

    (plain, plain_phases), (held, held_phases) = walk([], []), walk([300, 200], [300, 200])
    assert [at for at, _ in held] == [at for at, _ in plain]
    for (at, with_them), (_, without) in zip(held, plain):
        assert with_them == without + (500 if at in ("r1", "r0") else 0), at
    assert held_phases["optimizer_step"] == plain_phases["optimizer_step"]
