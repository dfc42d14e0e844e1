"""The CUDA path without a GPU: every native/ source compiles with NVRTC for Jetson Orin
(sm_87) and a datacenter GPU (sm_90) without a warning and exports kernels the launcher can
pack arguments for; the compile cache keys and survives damage; each way CUDA can be
missing (no driver, no device, a stub or old driver, no NVRTC, an architecture NVRTC lacks)
is the documented error, checked against a stand-in libcuda built from
tests/data/fake_libcuda.c; n_gpu_layers falls back to the CPU saying why. The kernels'
arithmetic, built for this CPU, is tests/test_cuda_host.py's.

NVRTC comes from the `nvidia-cuda-nvrtc-cu12` wheel, a dev dependency (pyproject.toml), so
these tests run in every `make test`; a machine with a GPU runs tools/gpu_check.sh.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

import cffi
import pytest

from edgekv.backends import get_backend, resolve_backend_name
from edgekv.cli import main
from edgekv.cuda import driver as cuda_driver
from edgekv.cuda import probe, programs
from edgekv.cuda.driver import CudaUnavailable, open_driver, pack_args
from edgekv.cuda.nvrtc import NvrtcError, find_nvrtc
from edgekv.errors import EdgeKVError

from helpers.native_reference import QUANTIZED

NATIVE = Path(__file__).resolve().parents[1] / "native"
ARCHS = (87, 90)  # Jetson Orin, H100/H200


@pytest.fixture(scope="module")
def nvrtc():
    return find_nvrtc()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(p.name for p in NATIVE.glob("*.cu")))
def test_every_source_compiles_for_orin_and_hopper_without_warnings(nvrtc, name, arch, tmp_path):
    cubin = programs.cubin(name, arch, nvrtc, cache=tmp_path, strict=True)  # raises on any warning
    assert cubin.startswith(programs.CUBIN_MAGIC)
    names = programs.kernel_names(programs.sources()[name])
    assert names, f"{name} exports no kernel"
    for kernel in names:  # extern "C": the symbol cuModuleGetFunction looks up is in the binary
        assert kernel.encode() + b"\0" in cubin, f"{kernel} missing from {name}'s CUBIN"


def test_matvec_exports_a_matvec_and_a_matmul_kernel_per_weight_type():
    names = set(programs.kernel_names(programs.sources()["matvec.cu"]))
    types = [t.lower().replace("_k", "_K") for t in QUANTIZED] + ["f32", "f16", "bf16"]
    assert {f"ek_{form}_{t}" for t in types for form in ("matvec", "matmul")} | {"ek_get_rows"} == names


def test_every_kernel_has_a_signature_the_launcher_packs():
    # runtime.Device.launch packs arguments by these kinds, read from the declarations
    for name, text in programs.sources().items():
        signatures = programs.kernel_signatures(text)
        assert set(signatures) == set(programs.kernel_names(text)), name
        assert all(set(sig) <= set("pifq") and sig for sig in signatures.values()), signatures
    matvec = programs.kernel_signatures(programs.sources()["matvec.cu"])
    assert matvec["ek_matvec_q6_K"] == "pppiii" and matvec["ek_matmul_q6_K"] == "pppiiii"  # + n_tok
    attention = programs.kernel_signatures(programs.sources()["attention.cu"])["ek_attention"]
    assert attention == "pppppp" + "if" + "i" * 9 + "pi" + "p"  # ..., sink, n_sinks, out
    assert programs.kernel_signatures(programs.sources()["activations.cu"])["ek_scale"] == "pfq"


def test_the_cache_is_keyed_by_source_and_arch_and_survives_damage(nvrtc, tmp_path, monkeypatch):
    first = programs.cubin("rope.cu", 87, nvrtc, cache=tmp_path)
    files = list(tmp_path.glob("*.cubin"))
    assert len(files) == 1 and "sm87" in files[0].name and f"nvrtc{nvrtc.version[0]}." in files[0].name

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(nvrtc, "compile", no_compile)
    assert programs.cubin("rope.cu", 87, nvrtc, cache=tmp_path) == first  # from disk
    monkeypatch.undo()
    files[0].write_bytes(b"garbage")  # damaged: compiled again and replaced
    assert programs.cubin("rope.cu", 87, nvrtc, cache=tmp_path) == first
    assert files[0].read_bytes() == first
    copy = tmp_path / "native"
    shutil.copytree(NATIVE, copy)
    (copy / "rope.cu").write_text((copy / "rope.cu").read_text() + "\n// changed\n")
    monkeypatch.setenv("EDGEKV_NATIVE_DIR", str(copy))
    programs.cubin("rope.cu", 87, nvrtc, cache=tmp_path)
    assert len(list(tmp_path.glob("*.cubin"))) == 2  # a changed source never reuses the old binary


def test_compile_errors_and_warnings_carry_the_log(nvrtc, tmp_path, monkeypatch, caplog):
    with pytest.raises(NvrtcError, match=r"broken\.cu does not compile for sm_87[\s\S]*undefined_thing"):
        nvrtc.compile('extern "C" __global__ void k(float* x) { x[0] = undefined_thing; }', "broken.cu", 87)
    folder = tmp_path / "native"
    shutil.copytree(NATIVE, folder)
    (folder / "warn.cu").write_text('extern "C" __global__ void k(float* x) { int unused; x[0] = 1.0f; }\n')
    monkeypatch.setenv("EDGEKV_NATIVE_DIR", str(folder))
    with pytest.raises(NvrtcError, match=r"with warnings[\s\S]*unused"):
        programs.cubin("warn.cu", 87, nvrtc, cache=tmp_path, strict=True)
    with caplog.at_level(logging.WARNING, logger="edgekv"):  # a user's NVRTC warning: said, not fatal
        assert programs.cubin("warn.cu", 87, nvrtc, cache=tmp_path).startswith(programs.CUBIN_MAGIC)
    assert "warned compiling warn.cu for sm_87" in caplog.text and "unused" in caplog.text
    with pytest.raises(NvrtcError, match="cannot compile for sm_30.*Jetson Orin"):
        nvrtc.compile("", "empty.cu", 30)


def test_missing_nvrtc_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("EDGEKV_NVRTC", "/nonexistent/libnvrtc.so.12")
    with pytest.raises(NvrtcError, match=r"NVRTC \(libnvrtc.so\) not found.*edgekv\[cuda\]"):
        find_nvrtc()


# -- the driver, through a stand-in libcuda -------------------------------------------------


def _build_fake_libcuda(folder: Path, *flags: str) -> str:
    out = folder / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", *flags, "-o", str(out),
                    str(Path(__file__).parent / "data" / "fake_libcuda.c")], check=True)
    return str(out)


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    return _build_fake_libcuda(tmp_path_factory.mktemp("fake_cuda"))


@pytest.fixture(autouse=True)
def fake_driver_of_the_nvrtcs_cuda(monkeypatch):
    """The stand-in driver reports the CUDA version of the NVRTC in use (find_nvrtc picks the
    NVRTC of the driver's version): CUDA 12's here, CUDA 13's on a machine with only that one."""
    try:
        major, minor = find_nvrtc().version
    except NvrtcError:
        return
    monkeypatch.setenv("FAKE_CUDA_DRIVER", str(major * 1000 + minor * 10))


def test_a_driver_older_than_edgekv_needs_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_LIBCUDA", _build_fake_libcuda(tmp_path, "-DFAKE_OLD_DRIVER"))
    with pytest.raises(CudaUnavailable, match=r"lacks cuDevicePrimaryCtxRetain, .* and more: it is older than "
                                              r"edgekv needs \(CUDA 11.4 or newer\); update it"):
        open_driver()
    assert "older than edgekv needs" in probe().problem


def test_no_driver_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("EDGEKV_LIBCUDA", "/nonexistent/libcuda.so.1")
    with pytest.raises(CudaUnavailable, match="no NVIDIA driver.*JetPack.*--backend cpu"):
        open_driver()
    status = probe()
    assert status.driver is None and status.devices == [] and "no NVIDIA driver" in status.problem


@pytest.mark.parametrize("code, message", [(100, "found no CUDA device"), (34, "stub library"),
                                           (35, "too old"), (999, "CUDA_ERROR_UNKNOWN")])
def test_each_driver_refusal_names_its_cause(fake_libcuda, monkeypatch, code, message):
    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)
    monkeypatch.setenv("FAKE_CUDA_INIT", str(code))
    with pytest.raises(CudaUnavailable, match=message):
        open_driver()
    with pytest.raises(EdgeKVError, match=f"backend 'cuda' cannot run here: .*{message}"):
        resolve_backend_name("cuda")


def test_a_device_is_described_and_auto_takes_it(fake_libcuda, monkeypatch, capfd):
    from edgekv import backends

    monkeypatch.setattr(backends, "_auto_said", False)
    monkeypatch.setattr(backends, "_cuda_failed", None)
    monkeypatch.delenv("EDGEKV_BACKEND", raising=False)
    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)
    monkeypatch.delenv("FAKE_CUDA_INIT", raising=False)
    monkeypatch.setenv("FAKE_CUDA_DRIVER", "12060")
    nvrtc = find_nvrtc(12060) if find_nvrtc().version[0] == 12 else None
    if nvrtc is None:  # only CUDA 13's NVRTC here: the stand-in driver is CUDA 13.0
        monkeypatch.setenv("FAKE_CUDA_DRIVER", "13000")
    drv = open_driver()
    version = cuda_driver.version_text(drv.version)
    assert version == ("12.6" if nvrtc is not None else "13.0")
    (dev,) = drv.devices()
    assert (dev.name, dev.capability, dev.arch, dev.total_memory, dev.integrated, dev.multiprocessors) == \
        ("Fake Orin", (8, 7), 87, 8 << 30, True, 8)
    status = probe()
    assert status.problem is None and status.driver == version
    assert resolve_backend_name("cuda") == "cuda"  # a device and NVRTC for it: the backend can be made
    assert resolve_backend_name("auto") == "cuda"  # and auto takes it
    # the fake cannot make a context: auto says so in one line and runs on the CPU; asked by name, an error
    assert main(["info"]) == 0
    out, err = capfd.readouterr()
    assert "Fake Orin, sm_87, 8.0 GiB, 8 SMs, integrated (unified memory), host memory mapped" in out
    assert "cuda driver" in out
    assert re.search(r"^backend +cpu$", out, re.MULTILINE) and re.search(r"^backends here +cpu, cpu-portable$",
                                                                         out, re.MULTILINE)
    err = err.strip().splitlines()
    assert len(err) == 1 and "CUDA cannot be used: cuDevicePrimaryCtxRetain failed: CUDA_ERROR_NOT_SUPPORTED" \
        in err[0] and err[0].endswith("running on the CPU")
    assert resolve_backend_name("auto") == "cpu"  # for the rest of the process, silently
    assert main(["info"]) == 0 and capfd.readouterr().err == ""
    with pytest.raises(EdgeKVError, match="cuDevicePrimaryCtxRetain failed"):
        get_backend("cuda")


def test_auto_runs_on_the_cpu_saying_why_a_gpu_it_found_cannot_be_used(fake_libcuda, monkeypatch, capfd):
    from edgekv import backends

    monkeypatch.setattr(backends, "_auto_said", False)
    monkeypatch.setattr(backends, "_cuda_failed", None)
    monkeypatch.setenv("EDGEKV_LIBCUDA", "/nonexistent/libcuda.so.1")  # no driver: a CPU machine, silently
    assert resolve_backend_name("auto") == "cpu" and capfd.readouterr().err == ""
    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)
    monkeypatch.delenv("FAKE_CUDA_INIT", raising=False)
    monkeypatch.setenv("EDGEKV_NVRTC", "/nonexistent/libnvrtc.so.12")  # a GPU, and no NVRTC to build for it
    assert resolve_backend_name("auto") == "cpu"
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "found Fake Orin but CUDA cannot be used: NVRTC" in err[0] \
        and err[0].endswith("running on the CPU")
    assert resolve_backend_name("auto") == "cpu" and capfd.readouterr().err == ""  # said once per process
    with pytest.raises(EdgeKVError, match="backend 'cuda' cannot run here: NVRTC"):  # asked by name: an error
        resolve_backend_name("cuda")


@pytest.mark.parametrize("register, host, read_only, said", [
    ("11", True, True, "host memory mapped"),
    ("10", True, False, "host memory mapped, weights copied (no read-only registration)"),
    ("00", False, False, "host memory not mappable (inputs copied, no CUDA graphs)"),
    ("old", False, False, "host memory not mappable")])  # a driver without the attributes: asked, not assumed
def test_host_registration_is_asked_of_the_driver_and_info_says_what_follows(fake_libcuda, monkeypatch, capfd,
                                                                          register, host, read_only, said):
    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)
    monkeypatch.delenv("FAKE_CUDA_INIT", raising=False)
    monkeypatch.setenv("FAKE_CUDA_REGISTER", register)
    (dev,) = open_driver().devices()
    assert (dev.host_register, dev.read_only_register, dev.maps_host_memory) == (host, read_only, host)
    assert main(["info"]) == 0
    assert said in capfd.readouterr().out


def test_a_gpu_older_than_the_kernels_need_is_named_and_auto_says_so(fake_libcuda, monkeypatch, capfd):
    from edgekv import backends

    monkeypatch.setattr(backends, "_auto_said", False)
    monkeypatch.setattr(backends, "_cuda_failed", None)
    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)
    monkeypatch.delenv("FAKE_CUDA_INIT", raising=False)
    monkeypatch.setenv("FAKE_CUDA_CC", "53")  # a Jetson Nano (Maxwell): no __dp4a
    assert "Fake Orin is sm_53: edgekv's CUDA kernels need compute capability 6.1 or newer" in probe().problem
    assert resolve_backend_name("auto") == "cpu"
    assert "found Fake Orin but CUDA cannot be used: Fake Orin is sm_53" in capfd.readouterr().err
    with pytest.raises(EdgeKVError, match="sm_53: edgekv's CUDA kernels need"):
        resolve_backend_name("cuda")
    # the oldest GPU both the kernels (6.1: __dp4a) and the NVRTC in use target is enough: sm_61
    # (Pascal) with CUDA 12's NVRTC, sm_75 with CUDA 13's (which dropped sm_50-72), on a driver of
    # that NVRTC's CUDA version
    nvrtc = find_nvrtc()  # the one of the stand-in driver's CUDA version (fake_driver_of_the_nvrtcs_cuda)
    monkeypatch.setenv("FAKE_CUDA_CC", str(min(a for a in nvrtc.supported_archs() if a >= 61)))
    assert probe().problem is None
    if 61 not in nvrtc.supported_archs():
        monkeypatch.setenv("FAKE_CUDA_CC", "61")
        assert f"cannot compile for Fake Orin (sm_61): it targets sm_{min(nvrtc.supported_archs())}" in probe().problem


def test_the_context_is_made_current_in_each_thread_that_calls_the_driver(fake_libcuda, monkeypatch):
    # a CUDA context is current per thread: a server's model thread or an app's worker uses
    # the device made in the main thread
    import threading

    from edgekv.cuda.runtime import Device

    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)
    monkeypatch.delenv("FAKE_CUDA_INIT", raising=False)
    monkeypatch.setenv("FAKE_CUDA_CONTEXTS", "1")
    device = Device(nvrtc=object())
    results = {}

    def in_a_thread(name, work):
        thread = threading.Thread(target=lambda: results.__setitem__(name, work()))
        thread.start()
        thread.join()

    raw = device.driver._lib  # the fake holds the rule: no current context, no allocation
    in_a_thread("raw", lambda: raw.cuMemAlloc_v2(device.driver.ffi.new("CUdeviceptr *"), 64))
    assert results["raw"] == 201
    in_a_thread("device", lambda: device.free(device.alloc(64)) or device.allocated())
    assert results["device"] == 0


def test_kernel_arguments_are_packed_as_the_kernel_reads_them():
    ffi = cffi.FFI()
    params, holders = pack_args(ffi, "pifq", [0xDEADBEEF00, -7, 0.5, 2**40])
    assert ffi.unpack(ffi.cast("unsigned long long *", params[0]), 1) == [0xDEADBEEF00]
    assert ffi.unpack(ffi.cast("int *", params[1]), 1) == [-7]
    assert ffi.unpack(ffi.cast("float *", params[2]), 1) == [0.5]
    assert ffi.unpack(ffi.cast("unsigned long long *", params[3]), 1) == [2**40]
    with pytest.raises(ValueError, match="takes 2 arguments"):
        pack_args(ffi, "pi", [1])


def test_n_gpu_layers_falls_back_to_the_cpu_saying_why_in_one_line(tiny_model, fake_libcuda, monkeypatch, capfd):
    from edgekv import Llama
    from edgekv import backends

    monkeypatch.delenv("EDGEKV_BACKEND", raising=False)
    monkeypatch.setenv("EDGEKV_LIBCUDA", "/nonexistent/libcuda.so.1")
    monkeypatch.setattr(backends, "_offload_said", False)
    path = str(tiny_model())
    quiet = Llama(path, n_ctx=64, n_gpu_layers=0, verbose=False)
    assert capfd.readouterr().err == ""
    llm = Llama(path, n_ctx=64, n_gpu_layers=-1, verbose=False)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_gpu_layers=-1 asks for the GPU" in err[0] and "no NVIDIA driver" in err[0] \
        and err[0].endswith("running on the CPU")
    assert llm._model.backend.name == "cpu"
    assert llm("hi", max_tokens=4, temperature=0)["choices"][0]["text"] == quiet("hi", max_tokens=4,
                                                                                  temperature=0)["choices"][0]["text"]
    Llama(path, n_ctx=64, n_gpu_layers=-1, verbose=False)  # said once per process
    assert capfd.readouterr().err == ""
    with pytest.raises(EdgeKVError, match="backend 'cuda' cannot run here: no NVIDIA driver"):  # asked by name
        Llama(path, n_ctx=64, backend="cuda")
    monkeypatch.setattr(backends, "_offload_said", False)
    monkeypatch.setenv("EDGEKV_LIBCUDA", fake_libcuda)  # a device: n_gpu_layers takes it, silently
    monkeypatch.delenv("FAKE_CUDA_INIT", raising=False)
    assert backends.offload_choice(None, 99) == "auto" and resolve_backend_name("auto") == "cuda"
    assert backends.offload_choice("cpu", 99) == "cpu"  # a backend named wins
    assert backends.offload_choice(None, 0) == "cpu"  # no layer on the GPU, though auto would take it
    assert backends.offload_choice(None, None) is None  # not given: auto decides
    assert capfd.readouterr().err == ""
    monkeypatch.setattr(backends, "_auto_said", False)
    monkeypatch.setattr(backends, "_cuda_failed", None)
    llm = Llama(path, n_ctx=64, n_gpu_layers=-1, verbose=False)  # the fake device cannot make a context
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA cannot be used: cuDevicePrimaryCtxRetain failed" in err[0]
    assert llm._model.backend.name == "cpu" and llm("hi", max_tokens=4, temperature=0)["choices"][0]["text"] == \
        quiet("hi", max_tokens=4, temperature=0)["choices"][0]["text"]


def test_the_backend_builds_every_kernel_when_it_is_made(nvrtc, tmp_path, monkeypatch):
    # on the emulated driver with the real compile-and-load step: every source is built before
    # the first step, so a kernel that cannot be built is an error where auto can still fall back
    from cuda_emulator import EmulatedDevice
    from edgekv.backends.cuda import CUDABackend
    from edgekv.cuda.runtime import Device

    class Building(EmulatedDevice):
        load_kernels = Device.load_kernels

    monkeypatch.setattr(programs, "kernel_cache_dir", lambda: tmp_path / "cache")
    device = Building()
    device.nvrtc = nvrtc
    CUDABackend(device)
    assert set(device._modules) == set(programs.sources())
    assert all(cubin.startswith(programs.CUBIN_MAGIC) for cubin in device._modules.values())
    folder = tmp_path / "native"
    shutil.copytree(NATIVE, folder)
    (folder / "broken.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_thing; }\n')
    monkeypatch.setenv("EDGEKV_NATIVE_DIR", str(folder))
    broken = Building()
    broken.nvrtc = nvrtc
    with pytest.raises(NvrtcError, match="broken.cu does not compile"):
        CUDABackend(broken)
