"""The ranges of numeric settings, written once on the dataclass fields that own them, and the one rule
of an HR side and its scale.

A field declares its range where it is defined (``attempts: int = bounded(8, 1, 1000)``); its class
checks every bounded field in ``__post_init__`` (:func:`check_bounds`), and ``wdsr train`` reads the same
range (:func:`bound_of`) for its flags and config files, in the flags' words."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

from shardmaker.errors import brief

BOUND = "wdsr.bound"  # the key of a field's Bound in its metadata


def check_number(label: str, value: Any, lo: float, hi: float, integer: bool, lo_open: bool = False) -> Any:
    """``value`` as an int (``integer``) or a finite float in ``[lo, hi]`` (``(lo, hi]`` if ``lo_open``);
    a ValueError naming ``label`` otherwise (bools are not numbers here)."""
    kind = "an integer" if integer else "a finite number"
    where = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]" if not integer else f"[{lo}, {hi}]"
    bad = ValueError(f"{label} must be {kind} in {where}, got {brief(value)}")
    if isinstance(value, bool):
        raise bad
    try:
        number = operator.index(value) if integer else float(value)
    except (TypeError, ValueError, OverflowError):
        raise bad from None
    if not integer and not math.isfinite(number):
        raise bad
    if not (lo < number if lo_open else lo <= number) or not number <= hi:
        raise bad
    return number


@dataclasses.dataclass(frozen=True)
class Bound:
    """``[lo, hi]`` (``(lo, hi]`` with ``lo_open``), an integer or a finite float; ``items``: the field is a
    tuple of 1 to ``items`` such numbers (a scalar is taken as a tuple of one)."""

    lo: float
    hi: float
    integer: bool
    lo_open: bool = False
    items: int | None = None

    def check(self, label: str, value: Any) -> Any:
        """``value`` checked (ints as ints, floats as floats); a ValueError naming ``label`` otherwise."""
        if self.items is None:
            return check_number(label, value, self.lo, self.hi, self.integer, self.lo_open)
        values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        if not 1 <= len(values) <= self.items:
            kind = "integers" if self.integer else "numbers"
            raise ValueError(f"{label} must be a list of 1..{self.items} {kind} in [{self.lo}, {self.hi}], got {brief(value)}")
        return tuple(check_number(label, v, self.lo, self.hi, self.integer, self.lo_open) for v in values)


def bounded(default: Any = dataclasses.MISSING, lo: float = -math.inf, hi: float = math.inf, **kw: Any) -> Any:
    """A dataclass field with its range: ``bounded(8, 1, 1000)``; ``lo_open=True`` excludes ``lo``;
    ``integer`` defaults to the default's type (give it with ``default_factory=``); ``items=N``: a tuple."""
    factory = kw.pop("default_factory", dataclasses.MISSING)
    example = default if factory is dataclasses.MISSING else None
    if isinstance(example, tuple):
        example = example[0]
    integer = kw.pop("integer", isinstance(example, int) and not isinstance(example, bool))
    bound = Bound(lo, hi, integer, **kw)
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={BOUND: bound})
    return dataclasses.field(default=default, metadata={BOUND: bound})


def bounds(cls: Any) -> dict[str, Bound]:
    """The bounded fields of a dataclass (or an instance) and their ranges, in field order."""
    return {f.name: f.metadata[BOUND] for f in dataclasses.fields(cls) if BOUND in f.metadata}


def bound_of(cls: Any, name: str) -> Bound:
    """The range of one field (a KeyError if it has none)."""
    return bounds(cls)[name]


def default_of(cls: Any, name: str) -> Any:
    """A dataclass field's default (what ``--help`` shows), its factory's value for a ``default_factory``."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def check_bounds(obj: Any, prefix: str = "") -> None:
    """In a frozen dataclass's ``__post_init__``: each bounded field checked and normalised (an int for
    an integer field, a float for a number), a ValueError naming ``prefix + field`` otherwise."""
    for name, bound in bounds(obj).items():
        object.__setattr__(obj, name, bound.check(prefix + name, getattr(obj, name)))


def check_multiple(side: Any, scale: Any, side_name: str = "patch_size", scale_name: str = "scale") -> None:
    """The one rule of an HR side and its scale: a positive multiple (the LR side is ``side // scale``), so
    an LR pixel covers whole HR pixels. A ValueError in one wording, naming both and the nearest side."""
    if scale < 1 or side < scale or side % scale:
        near = f" (e.g. {max(1, round(side / scale)) * scale})" if scale >= 1 else ""
        raise ValueError(f"{side_name} {side} must be a positive multiple of {scale_name} {scale}{near}")
