"""edgekv on an aarch64 CPU with the dot-product instructions (Jetson Orin's Cortex-A78AE;
here QEMU's "max" CPU, tools/test_aarch64.sh): the sdot kernels are found and taken, and
SmolLM2 decodes llama.cpp's greedy ids, and answers in JSON and with a tool call under
llguidance's grammar masks.

The bit-for-bit checks of the sdot kernels against the portable ones are
tests/test_fast_kernels.py and tests/test_matvec.py, which the script runs here too.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from gguf import GGMLQuantizationType as T

from edgekv.backends import get_backend, kernel_map
from edgekv.kernels.cpu_features import arm_features
from edgekv.kernels.int8dot import HAS_INT8DOT, ISA
from edgekv.system_info import cpu_features, system_info

import structured
from greedy_ids import N_TOKENS, greedy_ids, reference_case

_ids: list = []


def _greedy() -> list[int]:
    if not _ids:
        _ids.extend(greedy_ids())
    return _ids


def test_the_cpu_has_sdot_and_the_cpu_backend_takes_it():
    assert platform.machine() == "aarch64"
    assert "dotprod" in arm_features() and "dotprod" in cpu_features()
    assert HAS_INT8DOT and ISA.name == "sdot"
    backend = get_backend("auto")
    assert backend.name == "cpu" and system_info(backend)["weight kernels"].startswith("sdot")
    for kind in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        assert kernel_map.weight_kernels(kind, True) == ("sdot matvec (exact)", "sdot GEMM, q8 activations")
    for kind, portable in ((T.Q4_K, "dot_k"), (T.Q5_K, "dot_k"), (T.Q6_K, "dot_k"), (T.Q3_K, "dot_k_low"),
                           (T.IQ4_XS, "dot_iq")):
        assert kernel_map.weight_kernels(kind, True) == ("sdot K-quant tiles (exact)",
                                                         "sdot K-quant tiles, q8_K activations (exact)")
        assert kernel_map.weight_kernels(kind, False)[0] == f"{portable} lanes (exact)"


def test_smollm2_greedy_ids_are_llama_cpps():
    assert _greedy() == reference_case()["greedy_ids"][:N_TOKENS]


def test_smollm2_greedy_ids_are_the_x86_machines():
    x86 = os.environ.get("EDGEKV_X86_GREEDY_IDS")
    assert x86, "set EDGEKV_X86_GREEDY_IDS to `python -m tests.aarch64.greedy_ids` run on x86 (test_aarch64.sh does)"
    assert _greedy() == [int(t) for t in x86.split()]


def test_smollm2_json_and_tool_answers_are_valid_and_the_x86_machines():
    """llguidance's aarch64 wheel masks the tokens: the greedy JSON-schema answer and the
    streamed tool call are valid, and the same as on x86."""
    found = structured.answers()
    structured.check(found)
    x86 = os.environ.get("EDGEKV_X86_STRUCTURED")
    assert x86, ("set EDGEKV_X86_STRUCTURED to a file holding `python -m tests.aarch64.structured`'s output on "
                 "x86 (test_aarch64.sh does)")
    assert found == json.loads(Path(x86).read_text())


def test_iq4_nl_cache_rows_are_read_through_tbl():
    from edgekv.kernels import attention_q
    from test_cache_types import test_iq4_nl_rows_are_read_in_place_as_they_dequantize

    assert attention_q._LOOKUP == "llvm.aarch64.neon.tbl1.v16i8"
    test_iq4_nl_rows_are_read_in_place_as_they_dequantize()
