"""`record` behaves as `@dataclass` with the same flags: the same classes built both ways, the same answers."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field

import pytest

from memfit.diagnostics.records import record


def _kinds(deco, plain):
    @deco(frozen=True, slots=True)
    class Frozen:
        """frozen and slotted"""
        x: int
        y: list = field(default_factory=list)
        z: str = "q"
        w: int = field(default=3, compare=False, repr=False)

    @plain
    class Open:
        """unfrozen, with a __post_init__"""
        x: int
        y: int = 2

        def __post_init__(self):
            self.x += 1

    @deco(frozen=True)
    class Hashed:
        """frozen, hashable"""
        p: int
        q: tuple = ()
        r: int = field(default=0, hash=False)

    @deco(frozen=True)
    class Bare:
        p: int
        q: dict = field(default_factory=dict)
        r: frozenset = frozenset()

    return Frozen, Open, Hashed, Bare


DATACLASS = _kinds(dataclass, dataclass)
RECORD = _kinds(record, record)
COMPILED = _kinds(record, lambda cls: record(cls, compiled_init=True))
# pickle finds a class by its module's name
Frozen, Open, Hashed, _ = RECORD
Frozen.__qualname__, Open.__qualname__, Hashed.__qualname__ = "Frozen", "Open", "Hashed"


def _answers(kinds):
    frozen, open_, hashed, bare = kinds
    a, b = frozen(1), frozen(1, [2], z="r", w=5)
    out = [repr(a).split(".")[-1], repr(b).split(".")[-1], a == frozen(1), a == frozen(1, w=9), a == frozen(2), a != b,
           frozen.__match_args__, [f.name for f in dataclasses.fields(a)], repr(dataclasses.replace(b, x=3)).split(".")[-1],
           dataclasses.asdict(b), a.__dataclass_params__.frozen, copy.deepcopy(b) == b, frozen.__slots__]
    for bad in (lambda: setattr(a, "x", 2), lambda: delattr(a, "x"), lambda: frozen(), lambda: frozen(1, x=2), lambda: frozen(1, k=2),
                lambda: hash(b)):
        with pytest.raises(Exception) as caught:
            bad()
        out.append((type(caught.value).__name__, str(caught.value).split(".")[-1]))
    o = open_(1)
    o.y = 5
    out += [repr(o).split(".")[-1], o == open_(1, 5), o == open_(0), open_.__hash__, o.__dataclass_params__.frozen]
    h = hashed(1)
    out += [hash(h) == hash((1, ())), h == hashed(1, r=4), hash(h) == hash(hashed(1, r=4)), h != hashed(2), {h: 1}[hashed(1)],
            h == (1, ()), h.__eq__((1, ())) is NotImplemented, bare.__doc__, frozen.__doc__]
    return out


@pytest.mark.parametrize("kinds", [RECORD, COMPILED], ids=["shared", "compiled_init"])
def test_a_record_answers_as_its_dataclass(kinds):
    assert _answers(kinds) == _answers(DATACLASS)


def test_a_frozen_slotted_record_pickles():
    b = Frozen(1, [2], z="r", w=5)
    back = pickle.loads(pickle.dumps(b))
    assert back == b and back.w == 5
    assert pickle.loads(pickle.dumps(Hashed(3))) == Hashed(3)


METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")


def _compiled(kinds, source: str) -> list:
    """(class, method) of each method the classes define whose code was compiled from `source`: the file name of
    the text @dataclass writes and exec()s (a plain @dataclass build's)."""
    out = []
    for cls in kinds:
        for name in METHODS:
            method = inspect.unwrap(cls.__dict__[name]) if cls.__dict__.get(name) is not None else None
            if method is not None and method.__code__.co_filename == source:
                out.append((cls.__name__, name))
    return out


def test_a_record_compiles_no_method():
    """The point of it: @dataclass compiles its methods from source (exec); a record's are shared functions, but the
    __init__ that compiled_init keeps (the one unfrozen class's here)."""
    source = DATACLASS[1].__init__.__code__.co_filename
    assert source not in (dataclasses.__file__, __file__)
    plain = _compiled(_kinds(dataclass, dataclass), source)
    assert {"__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"} <= {m for _, m in plain}, plain
    assert _compiled(_kinds(record, record), source) == []
    assert _compiled(_kinds(record, lambda cls: record(cls, compiled_init=True)), source) == [("Open", "__init__")]


def test_a_frozen_record_keeps_the_dataclass_init():
    with pytest.raises(TypeError):
        record(frozen=True, compiled_init=True)


def test_a_record_sets_the_params_dataclass_keeps_on_any_python(monkeypatch):
    """`record` writes @dataclass's own params object and builds none: the constructor's arguments differ between
    versions (Python 3.12 added match_args, kw_only, slots and weakref_slot), so a record that built one with 3.11's
    six failed at import on 3.12 and later. Only @dataclass itself may construct it here."""
    built = []
    real = dataclasses._DataclassParams

    class Counted(real):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            built.append(len(args) + len(kwargs))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(dataclasses, "_DataclassParams", Counted)

    @record(frozen=True)
    class Point:
        """a record"""
        x: int

    assert len(built) == 1, built   # @dataclass's own
    params = Point.__dataclass_params__
    assert (params.init, params.repr, params.eq, params.frozen) == (True, True, True, True)
    assert Point(1) == Point(1) and hash(Point(1)) == hash(Point(1))
