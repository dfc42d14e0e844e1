"""What edgekv runs with on this machine: `edgekv info` and the `--verbose` system_info line.

What lives here: `system_info` (version, CPU, features found, backend, Numba threading,
kernel cache folder) and `model_info` (which kernel serves each weight type of a model,
the bytes per token of each cache type). What does not: choosing anything (backends/,
backends/kernel_map.py decide; this only reports).
"""

from __future__ import annotations

import platform
from collections import Counter

from .backends import Backend, available_backends, kernel_map
from .kernels.config import get_num_threads
from .kernels.cpu_features import IS_AARCH64, host_cpu_name, host_has
from .kernels.jit_cache import kernel_cache_dir
from .version import version

FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512vnni", "avx512bw")  # LLVM's names (x86)
ARM_FEATURES = ("dotprod",)  # LLVM's names of the optional AArch64 features the kernels use


def edgekv_version() -> str:
    v = version()
    return "unknown (not installed)" if v == "0+unknown" else v


# Arm's part numbers (/proc/cpuinfo "CPU part" where "CPU implementer" is 0x41) of the
# cores edgekv meets on edge boards and Arm servers
ARM_PARTS = {0xd03: "Cortex-A53", 0xd05: "Cortex-A55", 0xd08: "Cortex-A72", 0xd0b: "Cortex-A76",
             0xd0c: "Neoverse-N1", 0xd40: "Neoverse-V1", 0xd41: "Cortex-A78", 0xd42: "Cortex-A78AE",
             0xd44: "Cortex-X1", 0xd49: "Neoverse-N2", 0xd4b: "Cortex-A78C", 0xd4f: "Neoverse-V2"}


def cpu_info(path: str = "/proc/cpuinfo", aarch64: bool = IS_AARCH64) -> str:
    """The CPU's model from /proc/cpuinfo (Linux: "model name", or Arm's implementer and
    part numbers), else the platform's processor string."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if aarch64:
        if "CPU part" not in fields:  # QEMU's user-mode emulation shows the host's /proc/cpuinfo
            return "an Arm CPU that /proc/cpuinfo does not describe (emulated?)"
        try:
            implementer, part = int(fields.get("CPU implementer", "0"), 16), int(fields["CPU part"], 16)
        except ValueError:
            return fields.get("model name") or platform.machine()
        name = ARM_PARTS.get(part) if implementer == 0x41 else None
        return name or f"Arm CPU implementer {implementer:#x} part {part:#x}"
    return fields.get("model name") or platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """The features this CPU has that the kernels care about."""
    if IS_AARCH64:  # NEON, FMA and half conversions are base ARMv8
        return ["neon", "fma", "fp16"] + [f for f in ARM_FEATURES if host_has(f)]
    return [f for f in FEATURES if host_has(f)]


def machine_summary(threads: int | None = None) -> str:
    """The CPU as a saved benchmark result must name it, so that figures from different
    machines are never compared as one: model, LLVM's name for it, the features that select
    kernels, the int8 dot-product kernels in use, and the thread count (default: Numba's)."""
    from .backends.kernel_map import int8dot_name

    threads = get_num_threads() if threads is None else threads
    return (f"{cpu_info()} ({platform.machine()}, LLVM {host_cpu_name()}; features: "
            f"{' '.join(cpu_features()) or 'none'}; int8 dot kernels: {int8dot_name()}; {threads} threads)")


def threading_layer() -> str:
    """Numba's threading layer (after its first parallel kernel ran), else the one configured."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        return f"{numba.config.THREADING_LAYER} (not started)"


def system_info(backend: Backend) -> dict[str, str]:
    return {
        "edgekv": edgekv_version(),
        "python": platform.python_version(),
        "cpu": f"{cpu_info()} ({platform.machine()}, LLVM: {host_cpu_name()})",
        "cpu features": " ".join(cpu_features()) or "none of " + " ".join(FEATURES),
        **backend.describe(),
        "backends here": ", ".join(available_backends()),
        "threads": f"{get_num_threads()} (numba {threading_layer()})",
        "kernel cache": str(kernel_cache_dir()),
    }


def system_info_line(backend: Backend) -> str:
    """One line, like llama.cpp's system_info."""
    return " | ".join(f"{k} = {v}" for k, v in system_info(backend).items())


def model_info(model) -> dict[str, str]:
    """For an edgekv.loader.Model: its weight types with the kernels that serve them, and
    what one token costs in the KV cache per cache type."""
    from gguf import GGMLQuantizationType as T

    from .kv.cache import CACHE_TYPES
    from .lab.mem_report import bytes_per_token_by_type

    hp, int8dot = model.hp, getattr(model.backend, "use_int8dot", False)
    counts = Counter(t.ggml_type for t in model.gguf.tensors.values() if len(t.shape) == 2)
    out = {"model": f"{model.name} ({hp.arch}, {hp.n_layers} layers, {model.path})"}
    for ggml_type, n in sorted(counts.items()):
        exact, batch = kernel_map.weight_kernels(ggml_type, int8dot)
        out[f"weights {T(ggml_type).name}"] = f"{n} matrices: n < {kernel_map.BATCH_MIN_TOKENS} tokens {exact}; " \
                                             f"longer chunks {batch}"
    per_token = bytes_per_token_by_type(hp)  # what `edgekv mem` reports
    for name in CACHE_TYPES:
        if name not in per_token:
            out[f"cache {name}"] = f"not for this model (its blocks do not divide the head size {hp.head_dim})"
            continue
        exact, batch = kernel_map.attention_kernels(name, name)
        out[f"cache {name}"] = f"{per_token[name]} bytes/token (K and V, all layers); attention {exact}, {batch}"
    return out
