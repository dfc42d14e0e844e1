"""`python -m edgekv ...`: the same command line as the `edgekv` console script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
