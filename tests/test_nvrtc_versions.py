"""Which NVRTC compiles, and that both wheels users bring compile every kernel (issue 42, findings 1-2).

The venv holds CUDA 12's NVRTC (nvidia-cuda-nvrtc-cu12, the cuda extra) and CUDA 13.0's
(nvidia-cuda-nvrtc 13.0.88, what PyTorch cu130 images carry): the dev extra installs both.
CUDA 13.0's libnvrtc.so.13 has no RPATH, so without `preload_builtins` every compile fails
with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE; and both target Jetson Orin's sm_87 (CUDA 13
dropped sm_50-72 only). find_nvrtc picks the NVRTC of the driver's CUDA version.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import pytest

from edgekv.cuda import nvrtc as nvrtc_module
from edgekv.cuda import programs
from edgekv.cuda.nvrtc import Nvrtc, NvrtcError, find_nvrtc

NATIVE = Path(__file__).resolve().parents[1] / "native"


def _wheel(folder: str) -> str:
    found = [p for entry in sys.path for p in glob.glob(str(Path(entry or ".") / "nvidia" / folder / "lib" /
                                                              "libnvrtc.so.1*")) if ".alt." not in p]
    assert found, f"the dev extra installs NVRTC into nvidia/{folder}/lib (pip install -e '.[dev]')"
    return found[0]


CU12, CU13 = _wheel("cuda_nvrtc"), _wheel("cu13")


@pytest.fixture(scope="module", params=[CU12, CU13], ids=["cuda12", "cuda13"])
def each_nvrtc(request):
    return Nvrtc(request.param)


def test_the_two_wheels_are_the_versions_users_bring():
    assert Nvrtc(CU12).version[0] == 12 and Nvrtc(CU13).version == (13, 0)


@pytest.mark.parametrize("arch", (87, 90))
@pytest.mark.parametrize("name", sorted(p.name for p in NATIVE.glob("*.cu")))
def test_every_source_compiles_with_both_wheels(each_nvrtc, name, arch, tmp_path):
    cubin = programs.cubin(name, arch, each_nvrtc, cache=tmp_path, strict=True)
    assert cubin.startswith(programs.CUBIN_MAGIC)


def test_cuda13s_nvrtc_opens_its_builtins_beside_it():
    """The fix itself (without it, the next test shows, CUDA 13.0's NVRTC compiles nothing)."""
    nvrtc = Nvrtc(CU13)
    assert nvrtc.builtins and "libnvrtc-builtins.so.13.0" in nvrtc.builtins[0]
    assert nvrtc.compile('extern "C" __global__ void k(float *x) { x[0] = 1.0f; }', "k.cu", 87).cubin


def test_without_the_preload_the_failure_names_nvrtcs_error():
    """In a fresh process (the builtins are not loaded yet), NVRTC 13.0 opened without them."""
    import subprocess

    code = (f"import edgekv.cuda.nvrtc as m; m.preload_builtins = lambda path: []\n"
            f"n = m.Nvrtc({CU13!r})\n"
            "try:\n    n.compile('extern \"C\" __global__ void k(float *x) {{ x[0] = 1.0f; }}', 'k.cu', 87)\n"
            "except m.NvrtcError as e:\n    print('ERROR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "ERROR compiling k.cu for sm_87 failed: NVRTC_ERROR_BUILTIN_OPERATION_FAILURE" in out


@pytest.mark.parametrize("driver, major", [(12060, 12), (12090, 12), (13000, 13), (13020, 13)])
def test_the_nvrtc_of_the_drivers_cuda_version_is_chosen(monkeypatch, driver, major):
    for order in ([CU13, CU12], [CU12, CU13]):
        monkeypatch.setattr(nvrtc_module, "candidates", lambda order=order: list(order))
        assert find_nvrtc(driver).version[0] == major


def test_a_driver_older_than_every_nvrtc_is_named(monkeypatch):
    """JetPack 5's driver (CUDA 11.4) with only CUDA 12/13 NVRTCs: a CUBIN they make may be
    refused, so none is chosen, and the error says what to install."""
    monkeypatch.setattr(nvrtc_module, "candidates", lambda: [CU13, CU12])
    with pytest.raises(NvrtcError, match=r"driver runs CUDA 11\.4, but the NVRTC found makes code for a newer "
                                         r"CUDA: 13\.0.*12\.\d+.*nvidia-cuda-nvrtc-cu11"):
        find_nvrtc(11040)
    assert find_nvrtc(None).version[0] == 13  # no driver to match: the first that opens


def test_on_a_jetson_jetpacks_nvrtc_comes_before_the_wheels(monkeypatch, tmp_path):
    jetpack = tmp_path / "cuda" / "lib"
    jetpack.mkdir(parents=True)
    (jetpack / "libnvrtc.so.12").write_bytes(b"")
    monkeypatch.delenv("EDGEKV_NVRTC", raising=False)
    monkeypatch.setattr(nvrtc_module, "SYSTEM_DIRS", (str(jetpack),))
    monkeypatch.setattr(nvrtc_module, "on_jetson", lambda: True)
    assert nvrtc_module.candidates()[0] == str(jetpack / "libnvrtc.so.12")
    monkeypatch.setattr(nvrtc_module, "on_jetson", lambda: False)
    assert nvrtc_module.candidates()[0] != str(jetpack / "libnvrtc.so.12")


def test_a_target_nvrtc_lacks_is_named_with_what_it_targets():
    with pytest.raises(NvrtcError, match=r"NVRTC 13\.0 .* cannot compile for sm_61 \(it targets sm_75\.\.sm_1\d\d"):
        Nvrtc(CU13).compile("", "empty.cu", 61)
    assert 87 in Nvrtc(CU13).supported_archs() and 87 in Nvrtc(CU12).supported_archs()
