"""`edgekv pull` and `edgekv list`: the model catalog from the command line.

What lives here: the two commands' options and output. What does not: the catalog, the
download and its verification (catalog.py, which also draws the progress bar).
"""

from __future__ import annotations

import argparse

from .. import catalog


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("pull", parents=[common], help="download a catalog model",
                       description="Fetch a model from the catalog into the local cache and verify it.")
    p.add_argument("name", nargs="?", default=None, help="catalog name (default: the catalog's default model)")
    p.set_defaults(handler=pull)
    p = sub.add_parser("list", parents=[common], help="list the catalog's models",
                       description="The catalog's models: name, file, size and whether the file is cached.")
    p.set_defaults(handler=list_models)


def pull(args: argparse.Namespace) -> int:
    name = args.name or catalog.default_model_name()
    path = catalog.ensure_model(name)
    print(path)
    return 0


def list_models(args: argparse.Namespace) -> int:
    default = catalog.default_model_name()
    rows = [("NAME", "FILE", "SIZE", "CACHED")]
    for name, entry, cached in catalog.list_models():
        rows.append((name + (" (default)" if name == default else ""), entry.file,
                     f"{entry.size / 1e6:.1f} MB", "yes" if cached else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    print(f"cache: {catalog.models_dir()}")
    return 0
