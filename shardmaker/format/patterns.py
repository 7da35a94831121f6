"""Brace patterns of shard and file URLs (``shard-{000000..000127}.tar``), expanded exactly as
``braceexpand`` does, but counted first.

``braceexpand`` builds every name of a pattern before it yields the first (``itertools.product``
takes whole inputs), so ``shard-{0..999999999}.tar`` runs out of memory and a nested pattern can
run for minutes. :func:`count_braces` follows the same grammar (comma alternatives, numeric and
letter ranges with an optional step, zero padding, nesting, backslash escapes) and computes how many
names a pattern has, and a bound on their characters, in time linear in the pattern's length (times
its nesting, itself bounded); :func:`expand_braces` refuses a pattern above the limits in one line
before expanding anything.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from braceexpand import braceexpand

from shardmaker.errors import brief, brief_ends

__all__ = ["MAX_NAMES", "PatternError", "PatternSize", "count_braces", "expand_braces"]

MAX_NAMES = 1_000_000  # URLs one request may name (patterns and lists together)
MAX_CHARS = 1 << 28  # characters of those URLs together
MAX_PATTERN = 8192  # characters of one pattern
MAX_DEPTH = 16  # brace nesting of one pattern
_SAT = 1 << 64  # counts are kept at most this large: enough to say "too many"

# braceexpand 0.1.7's grammar of a range (its ``int_range_re``, ``char_range_re``), and its alphabet
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class PatternError(ValueError):
    """A brace pattern that is malformed, or names more URLs than one request may."""


@dataclasses.dataclass(frozen=True)
class PatternSize:
    """What a (part of a) pattern expands to: ``names`` strings of ``chars`` characters in all at most."""

    names: int
    chars: int

    def then(self, other: PatternSize) -> PatternSize:
        """Every name of ``self`` followed by every name of ``other`` (a product)."""
        return PatternSize(min(_SAT, self.names * other.names), min(_SAT, self.chars * other.names + self.names * other.chars))

    def plus(self, other: PatternSize) -> PatternSize:
        """The names of ``self`` and then those of ``other`` (alternatives)."""
        return PatternSize(min(_SAT, self.names + other.names), min(_SAT, self.chars + other.chars))


def count_braces(pattern: str) -> PatternSize:
    """How many names ``braceexpand(pattern)`` gives (and a bound on their characters), without
    making one; a pattern braceexpand refuses (unbalanced braces), or one too long or too deeply
    nested to count quickly, is a :class:`PatternError`."""
    if not isinstance(pattern, str):
        raise PatternError(f"a URL pattern is a string, got {brief(pattern)}")
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"URL pattern {brief_ends(pattern)} has {len(pattern)} characters; at most {MAX_PATTERN} are allowed")
    depth = top = 0
    pos = 0
    while pos < len(pattern):
        c = pattern[pos]
        pos += 2 if c == "\\" else 1
        depth += (c == "{") - (c == "}")
        top = max(top, depth)
    if top > MAX_DEPTH:
        raise PatternError(f"URL pattern {brief_ends(pattern)} nests braces {top} deep; at most {MAX_DEPTH} are allowed")
    return _pattern(pattern, pattern)


def expand_braces(patterns: str | Sequence[str], limit: int = MAX_NAMES) -> list[str]:
    """The URLs of ``patterns`` (one or a list), as ``braceexpand`` gives them, in order; refused
    with a :class:`PatternError` naming the pattern and its count when they are more than ``limit``
    (or their characters more than ``MAX_CHARS``), before any is made."""
    items = [patterns] if isinstance(patterns, str) else list(patterns)
    total = PatternSize(0, 0)
    for p in items:
        size = count_braces(p)
        total = total.plus(size)
        if total.names > limit or total.chars > MAX_CHARS:
            what = f"{size.names:,} URLs" if size.names < _SAT else f"over {_SAT:,} URLs"
            if size.names <= limit and size.chars <= MAX_CHARS:
                what += f", {len(items)} patterns together more"
            why = f"at most {limit:,} are allowed" if total.names > limit else f"over {MAX_CHARS:,} characters in all"
            raise PatternError(f"URL pattern {brief_ends(p)} names {what}: {why} (give fewer, or the dataset folder)")
    return [u for p in items for u in braceexpand(p)]


def _pattern(p: str, whole: str) -> PatternSize:
    """braceexpand's ``parse_pattern``: literals and ``{...}`` groups, one after another."""
    start = pos = depth = 0
    size = PatternSize(1, 0)
    while pos < len(p):
        c = p[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            if depth == 0 and pos > start:
                size = size.then(PatternSize(1, pos - start))
                start = pos
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                expr = p[start + 1 : pos]
                inner = _expression(expr, whole)
                if inner is None:  # not a range or a sequence: the braces stay, the inside is a pattern
                    inner = PatternSize(1, 2).then(_pattern(expr, whole))
                size = size.then(inner)
                start = pos + 1
        pos += 1
    if depth != 0:
        raise PatternError(f"URL pattern {brief(whole)} has unbalanced braces")
    return size.then(PatternSize(1, pos - start)) if start < pos else size


def _expression(expr: str, whole: str) -> PatternSize | None:
    """braceexpand's ``parse_expression``: a numeric range, a letter range, or alternatives (None: none)."""
    try:
        m = _INT_RANGE.match(expr)
        if m:
            a, b, step = m.groups()
            lo, hi = int(a), int(b)
            names = abs(hi - lo) // _step(step) + 1
            return PatternSize(min(_SAT, names), min(_SAT, names * max(len(a), len(b))))  # no name is wider than an end
        m = _CHAR_RANGE.match(expr)
        if m:
            a, b, step = m.groups()
            names = abs(_ALPHABET.index(a) - _ALPHABET.index(b)) // _step(step) + 1
            return PatternSize(names, names)
    except ValueError:  # a number of more digits than int() reads
        raise PatternError(f"URL pattern {brief(whole)} has a range with a number too long to read") from None
    return _sequence(expr, whole)


def _step(step: str | None) -> int:
    return (int(step) or 1) if step else 1


def _sequence(seq: str, whole: str) -> PatternSize | None:
    """braceexpand's ``parse_sequence``: alternatives at the top level, or None without a comma."""
    start = pos = depth = 0
    parts: list[PatternSize] = []
    while pos < len(seq):
        c = seq[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(_pattern(seq[start:pos], whole))
            start = pos + 1
        pos += 1
    if depth != 0 or not parts:
        return None
    total = _pattern(seq[start:], whole)
    for part in parts:
        total = total.plus(part)
    return total
