"""What both command lines (``shardmaker``, ``wdsr``) share: one-line usage errors, sizes, scales.

A public door of ``shardmaker``: ``wdsr``'s CLI and config files use these names."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import NoReturn

from shardmaker.errors import missing_extra_of
from shardmaker.exitcodes import exit_code_of

__all__ = [
    "OneLineParser",
    "configure_logging",
    "error_exit",
    "parse_args",
    "parse_part",
    "parse_scales",
    "parse_size",
    "storage_error",
]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def parse_size(text: str | float, unit: str = "") -> int:
    """``256MB``, ``1GiB``, ``500k``, ``1e9`` -> bytes (at most 1 TiB); a bare number is in ``unit``
    (bytes by default; the ``wdsr`` cache limits say GB)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = f"{text!r}{unit}"
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    suffix = (m.group(2) or unit).lower() if m else ""
    if not m or suffix not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 256MB, 1GiB, 500000)")
    value = float(m.group(1)) * _UNITS[suffix]
    if not value <= 1 << 40:  # also catches inf (1e999)
        raise argparse.ArgumentTypeError(f"size {text!r} is over the 1 TiB maximum")
    return int(value)


def parse_scales(text: str) -> tuple[int, ...]:
    try:
        scales = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a scale list: {text!r} (examples: 4, 2,3,4)") from None
    if not scales or any(s < 2 for s in scales):
        raise argparse.ArgumentTypeError(f"scales must be integers >= 2, got {text!r}")
    return scales


def parse_part(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise argparse.ArgumentTypeError(f"--part wants I/N with 0 <= I < N (e.g. 0/8), got {text!r}")
    return int(m.group(1)), int(m.group(2))


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), pointing at --help instead of printing the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of --help (0) / a usage error (2) for main() to return."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


_CLIENTS = ("botocore", "aiobotocore", "s3fs", "aiohttp", "gcsfs", "adlfs", "google", "azure")
_HINTS = {
    "NoCredentialsError": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass storage_options",
    "PartialCredentialsError": "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "EndpointConnectionError": "is the endpoint (AWS_ENDPOINT_URL) up and reachable?",
    "ConnectTimeoutError": "is the endpoint (AWS_ENDPOINT_URL) up and reachable?",
}


def storage_error(exc: BaseException) -> str | None:
    """One line for an error raised by an object-store client (a dead endpoint, missing or partial
    credentials, a refused connection, ...), with what to check; None for any other error."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # s3fs may re-raise the client's error under its own
        seen.add(id(e))
        if (type(e).__module__ or "").split(".")[0] in _CLIENTS:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            hint = _HINTS.get(type(e).__name__)
            return f"object storage: {type(e).__name__}: {first}" + (f" ({hint})" if hint else "")
        e = e.__cause__ or e.__context__
    return None


def error_exit(prog: str, exc: BaseException, bad_input: tuple[type[BaseException], ...] = ()) -> int | None:
    """For an error that ends a command: print its one line (``prog: error: ...``) and return the exit
    code of the contract (:mod:`shardmaker.exitcodes`: 69 unavailable storage, 2 bad input); None for
    any other error, a crash that the caller lets raise (traceback, exit 1). An optional package
    that is missing (``s3fs`` for an ``s3://`` URL, ...) is bad input naming the extra to install."""
    exc = missing_extra_of(exc) or exc
    code = exit_code_of(exc, bad_input)
    if code is None:
        return None
    why = str(exc) if isinstance(exc, (ValueError, OSError, *bad_input)) else storage_error(exc) or str(exc)
    print(f"{prog}: error: {why}", file=sys.stderr)
    return int(code)


def configure_logging(prog: str, quiet: bool = False) -> None:
    """Messages as ``prog: ...``: ours at INFO (WARNING with ``quiet``), everyone else's (botocore's
    "Found credentials in environment variables.", fsspec's, ...) only from WARNING up."""
    logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(message)s")
    for name in ("shardmaker", "wdsr"):
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.INFO)
