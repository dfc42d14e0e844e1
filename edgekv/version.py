"""The installed edgekv's version (`edgekv.__version__`), read from the package metadata when first asked.

Its own module so that what reports the version (`edgekv info`, bench records) need not
import the package root, which names the whole public surface.
"""

from __future__ import annotations

import functools


@functools.cache
def version() -> str:
    from importlib import metadata  # ~25 ms of imports: only when asked

    try:
        return metadata.version("edgekv")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
