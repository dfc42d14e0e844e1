"""The CUDA sources in native/, compiled at first use for the device's own architecture.

What lives here: `native_dir` (EDGEKV_NATIVE_DIR, else the repository's native/), `sources`
and `headers` (name -> text), `kernel_names` (the extern "C" kernels a source defines),
and `cubin`: a source compiled by NVRTC for sm_XY, kept on disk next to the Numba kernels
(kernel_cache_dir()/cuda) under a key of the source and header texts, the options, the
NVRTC version and the architecture, so a changed source, another NVRTC or another GPU
never reuses a stale binary. The file is written atomically; a damaged one is recompiled.
What does not: NVRTC itself (nvrtc.py), loading the binary onto a device (driver.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from ..atomic_file import AtomicFile
from ..kernels.jit_cache import kernel_cache_dir
from .nvrtc import Nvrtc, NvrtcError

OPTIONS: tuple[str, ...] = ()  # beyond nvrtc.compile's --gpu-architecture and --std
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(')
_DEFINE = re.compile(r"^#define(?:[^\n]*\\\n)*[^\n]*", re.MULTILINE)
_MACRO = re.compile(r"^#define\s+(\w+)\((\w+),\s*\w+\)((?:[^\n]*\\\n)*[^\n]*)", re.MULTILINE)
_MACRO_KERNEL = re.compile(r"void\s+(\w+)##(\w+)\s*\(([^)]*)\)")  # void ek_matvec_##type(...) in a macro
CUBIN_MAGIC = b"\x7fELF"
log = logging.getLogger("edgekv")


def native_dir() -> Path:
    given = os.environ.get("EDGEKV_NATIVE_DIR")
    return Path(given) if given else Path(__file__).resolve().parents[2] / "native"


def _texts(pattern: str) -> dict[str, str]:
    folder = native_dir()
    found = {p.name: p.read_text() for p in sorted(folder.glob(pattern))}
    if not found:
        raise NvrtcError(f"no CUDA sources ({pattern}) in {folder}: edgekv's native/ folder is missing "
                         "(install from a clone of the repository, or set EDGEKV_NATIVE_DIR)")
    return found


def sources() -> dict[str, str]:
    """native/*.cu: one concept per file (matvec, norms, rope, ...)."""
    return _texts("*.cu")


def headers() -> dict[str, str]:
    """native/*.cuh, served to NVRTC by name for #include "..."."""
    return _texts("*.cuh")


def kernel_names(source: str) -> list[str]:
    """The kernels a source exports by their C names (cuModuleGetFunction looks them up):
    written out, or made by a macro such as matvec.cu's EK_MATVEC(type, DOT), which
    defines ek_matvec_##type and ek_matmul_##type."""
    body = _DEFINE.sub("", source)  # a macro's own text is a pattern, not a kernel
    return _KERNEL.findall(body) + list(_macro_kernels(source))


def _macro_kernels(source: str) -> dict[str, str]:
    """name -> parameter list of each kernel a macro use makes (MACRO(type, ...) with the
    macro declaring `void prefix##type(params)`)."""
    body, out = _DEFINE.sub("", source), {}
    for macro, arg, text in _MACRO.findall(source):
        made = [(prefix, params) for prefix, pasted, params in _MACRO_KERNEL.findall(text) if pasted == arg]
        for use in re.findall(r"^" + macro + r"\((\w+),", body, re.MULTILINE):
            out.update({prefix + use: params for prefix, params in made})
    return out


def _kind(param: str) -> str:
    # one kernel parameter's C declaration -> pack_args' kind letter
    text = param.strip()
    if "*" in text:
        return "p"
    base = text.split()[-2] if len(text.split()) >= 2 else ""
    kinds = {"int": "i", "float": "f", "ek_u64": "q"}
    if base not in kinds:
        raise ValueError(f"kernel parameter {text!r} has a type the launcher cannot pack")
    return kinds[base]


def kernel_signatures(source: str) -> dict[str, str]:
    """Each kernel of a source -> its parameters' kinds for driver.pack_args ('p' pointer,
    'i' int, 'f' float, 'q' 64-bit), read from its declaration (or its macro's)."""
    out, made = {}, _macro_kernels(source)
    for name in kernel_names(source):
        found = re.search(r"void\s+" + name + r"\s*\(([^)]*)\)", _DEFINE.sub("", source))
        params = found.group(1) if found is not None else made[name]
        out[name] = "".join(_kind(p) for p in params.replace("\\", " ").split(","))
    return out


def cache_key(name: str, arch: int, nvrtc: Nvrtc) -> str:
    h = hashlib.sha256()
    for text in (sources()[name], *(f"{k}\0{v}" for k, v in headers().items()), " ".join(OPTIONS)):
        h.update(text.encode())
        h.update(b"\0")
    return f"{Path(name).stem}-sm{arch}-nvrtc{nvrtc.version[0]}.{nvrtc.version[1]}-{h.hexdigest()[:16]}"


def cubin(name: str, arch: int, nvrtc: Nvrtc, cache: Path | None = None, strict: bool = False) -> bytes:
    """native/<name> compiled for sm_<arch>: from the disk cache, else compiled and stored.
    NvrtcError if it does not compile. Warnings: an NvrtcError with `strict` (the tests: the
    kernels are kept warning-free), else logged (a user's NVRTC may warn where ours does not)."""
    folder = cache or kernel_cache_dir() / "cuda"
    path = folder / f"{cache_key(name, arch, nvrtc)}.cubin"
    try:
        data = path.read_bytes()
        if data.startswith(CUBIN_MAGIC):
            return data
    except OSError:
        pass
    compiled = nvrtc.compile(sources()[name], name, arch, headers(), OPTIONS)
    if compiled.log and strict:
        raise NvrtcError(f"{name} compiled for sm_{arch} with warnings (edgekv keeps its kernels warning-free):\n"
                         f"{compiled.log}")
    if compiled.log:
        log.warning("NVRTC %d.%d warned compiling %s for sm_%d (please report it):\n%s", *nvrtc.version, name, arch,
                    compiled.log)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with AtomicFile(path) as out:
            out.write(compiled.cubin)
    except OSError:  # a read-only cache is no reason to fail: the next start compiles again
        pass
    return compiled.cubin
