"""`python -m tide.sim openb --pods PODS.csv --policy NAME ...` (same arguments as `tide sim`)."""

from __future__ import annotations

import argparse
import sys

from tide.cli.sim import add_sim_arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tide.sim", description="Tide trace simulator")
    add_sim_arguments(parser)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
