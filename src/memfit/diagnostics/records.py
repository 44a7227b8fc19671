"""`record`: `@dataclass` for a class made a few times a run, without compiling its methods at every start.

`@dataclass` writes each class's `__init__`, `__repr__`, `__eq__`, `__hash__` (and a frozen class's `__setattr__` and
`__delattr__`) as source text and compiles it when the module is imported: six parses a frozen class, a quarter to
three quarters of a millisecond each, about 11 ms of a 66 ms `memfit check` in all (Python 3.11), every start.
`record` keeps the dataclass (its fields, `dataclasses.fields`, `replace`, `asdict`, `__match_args__`, slots) and
gives it shared functions that read the class's fields instead, with the same behaviour: the same arguments,
defaults and default factories, `__post_init__`, the same repr text, equality on the compared fields of the same
class, the hash of the hashed fields where a frozen class with equality gets one (None where an unfrozen one does),
`FrozenInstanceError` on assigning or deleting a field of a frozen instance, and a frozen slotted instance that
pickles. A class built many times a run (a tensor, a row of the step) keeps the `__init__` @dataclass compiles
(`compiled_init=True`, unfrozen classes only): quicker per instance, one parse rather than three.
"""

from __future__ import annotations

import dataclasses
from itertools import repeat
from reprlib import recursive_repr

_MISSING = dataclasses.MISSING


def record(cls=None, /, *, frozen: bool = False, slots: bool = False, compiled_init: bool = False):
    """`@dataclass(frozen=frozen, slots=slots)`, its methods shared rather than compiled (see the module)."""
    if frozen and compiled_init:
        raise TypeError("record: a frozen class's compiled __init__ needs @dataclass(frozen=True)")

    def wrap(cls):
        return _record(cls, frozen, slots, compiled_init)
    return wrap if cls is None else wrap(cls)


def _record(cls, frozen: bool, slots: bool, compiled_init: bool):
    own = dict(cls.__dict__)
    class_hash = own.get("__hash__", _MISSING)
    explicit_hash = not (class_hash is _MISSING or (class_hash is None and "__eq__" in own))
    undocumented = cls.__doc__ is None
    if undocumented:
        cls.__doc__ = ""  # written below, without inspect.signature (which would read the shared __init__)
    cls = dataclasses.dataclass(cls, init=compiled_init, repr=False, eq=False, frozen=False, slots=slots)
    fields = dataclasses.fields(cls)
    for f in fields:
        if f.kw_only or not f.init:
            raise TypeError(f"record {cls.__qualname__}: field {f.name!r}: keyword-only and init=False fields are not supported")
    if "__init__" not in own and not compiled_init:
        cls.__init__ = _init(cls, fields)
    if "__repr__" not in own:
        cls.__repr__ = _repr(cls, tuple(f.name for f in fields if f.repr))
    if "__eq__" not in own:
        cls.__eq__ = _eq(cls, tuple(f.name for f in fields if f.compare))
    if not explicit_hash:
        if frozen:
            cls.__hash__ = _hash(cls, tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
        else:
            cls.__hash__ = None
    # what @dataclass records of the class, so that a subclass and dataclasses' own checks see the same
    # set on the class's own params object: its constructor's arguments differ between Python versions (3.12 added four)
    params = cls.__dataclass_params__
    params.init = params.repr = params.eq = True
    params.frozen = frozen
    if frozen:
        _freeze(cls, frozenset(f.name for f in fields), slots)
    if undocumented:  # @dataclass's: the class's signature, as inspect writes it
        cls.__doc__ = cls.__name__ + "(" + ", ".join(_parameter(f) for f in fields if f.init) + ")"
    return cls


def _parameter(f) -> str:
    text = f"{f.name}: {f.type!r}" if f.type is not _MISSING else f.name
    if f.default_factory is not _MISSING:
        return text + " = <factory>"
    return text if f.default is _MISSING else f"{text} = {f.default!r}"


def _init(cls, fields):
    """The dataclass's __init__: the fields' values set in their order (with C loops: a record's __init__ runs a
    few times a check, its class has up to 40 fields), each through object.__setattr__ as a frozen dataclass sets
    them (no record class defines its own __setattr__ but a frozen one's)."""
    names = tuple(f.name for f in fields)
    known = frozenset(names)
    required = frozenset(f.name for f in fields if f.default is _MISSING and f.default_factory is _MISSING)
    factories = tuple((f.name, f.default_factory) for f in fields if f.default_factory is not _MISSING)
    made = frozenset(name for name, _ in factories)
    defaults = tuple(None if f.default is _MISSING else f.default for f in fields)
    post_init = hasattr(cls, "__post_init__")
    put = object.__setattr__
    where = f"{cls.__qualname__}.__init__()"

    def __init__(self, *args, **kwargs):
        if args:
            if len(args) > len(names):
                raise TypeError(f"{where} takes {len(names) + 1} positional arguments but {len(args) + 1} were given")
            values = dict(zip(names, args))
            if kwargs:
                if not values.keys().isdisjoint(kwargs):
                    raise TypeError(f"{where} got multiple values for argument {min(values.keys() & kwargs.keys())!r}")
                values.update(kwargs)
        else:
            values = kwargs
        if not known.issuperset(values):
            raise TypeError(f"{where} got an unexpected keyword argument {min(values.keys() - known)!r}")
        # keys() >= a set looks each of its names up; set.issubset(a dict) would build a set of the dict first
        if not values.keys() >= required:
            raise TypeError(f"{where} missing 1 required positional argument: {next(n for n in names if n in required - values.keys())!r}")
        if made and not values.keys() >= made:
            for name, factory in factories:
                if name not in values:
                    values[name] = factory()
        any(map(put, repeat(self), names, map(values.get, names, defaults)))  # put returns None: every field is set
        if post_init:
            self.__post_init__()
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _repr(cls, names: tuple):
    @recursive_repr()
    def __repr__(self):
        return self.__class__.__qualname__ + "(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in names) + ")"
    __repr__.__qualname__ = f"{cls.__qualname__}.__repr__"
    return __repr__


def _eq(cls, names: tuple):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return tuple(getattr(self, name) for name in names) == tuple(getattr(other, name) for name in names)
        return NotImplemented
    __eq__.__qualname__ = f"{cls.__qualname__}.__eq__"
    return __eq__


def _hash(cls, names: tuple):
    def __hash__(self):
        return hash(tuple(getattr(self, name) for name in names))
    __hash__.__qualname__ = f"{cls.__qualname__}.__hash__"
    return __hash__


def _freeze(cls, names: frozenset, slots: bool) -> None:
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)
    cls.__setattr__ = __setattr__
    cls.__delattr__ = __delattr__
    if slots:  # a frozen slotted instance pickles through these (dataclasses._add_slots)
        ordered = tuple(f.name for f in dataclasses.fields(cls))

        def __getstate__(self):
            return [getattr(self, name) for name in ordered]

        def __setstate__(self, state):
            for name, value in zip(ordered, state):
                object.__setattr__(self, name, value)
        cls.__getstate__ = __getstate__
        cls.__setstate__ = __setstate__
