"""`python -m edgekv ...`: the same command line as the `edgekv` console script."""

from .cli import console_main

if __name__ == "__main__":
    raise SystemExit(console_main())
