"""``wdsr`` command line."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wdsr", description="Stream SR training patches from wdsr-shards/1 shards.")
    p.parse_args(argv)
    p.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
