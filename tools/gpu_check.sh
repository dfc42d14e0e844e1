#!/usr/bin/env bash
# Issue 12's GPU check, for a machine with an NVIDIA GPU, from a bare checkout (a few minutes):
#   1. the machine: nvidia-smi, `edgekv info` (driver, device, NVRTC);
#   2. tests/test_cuda.py and test_cuda_host.py (NVRTC compile checks, refusals, the kernels'
#      arithmetic built for the host) and
#      tests/test_cuda_device.py (every native/ kernel on the GPU against gguf.quants and
#      float64; mapped host weights; a CUDA graph replay);
#   3. benchmarks/cuda_kernels.py: the kernels' time at SmolLM2's and gemma3's shapes.
# Still owed until the CUDA backend's forward pass exists: parity of whole models with the
# CPU backend, the graph-captured decode, and tg128/pp512/depth lines in llama-bench's JSON.
#
# A machine without some Python packages: put their wheels in .whl/ first (on a machine with
# PyPI: `tools/gpu_check.sh --fetch-wheels`, for Python $WHEEL_PYTHON, default 3.12); they are
# installed offline into a private folder, nothing else on the machine is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEEL_PYTHON=${WHEEL_PYTHON:-3.12}
NEEDED=(cffi pycparser gguf)  # beyond numpy, numba, pytest, PyYAML and tqdm, which such machines have

if [ "${1:-}" = --fetch-wheels ]; then
    mkdir -p .whl
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$WHEEL_PYTHON" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${NEEDED[@]}"
    ls .whl
    exit 0
fi

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/edgekv-gpu-site \
        .whl/*.whl
    export PYTHONPATH="/tmp/edgekv-gpu-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
"$PY" -c "import cffi, gguf, numpy, numba" || {
    echo "gpu_check: missing Python packages; bring wheels in .whl/ (tools/gpu_check.sh --fetch-wheels)" >&2
    exit 1
}

echo "== machine"
nvidia-smi -L || echo "(no nvidia-smi)"
"$PY" -m edgekv info | grep -E "^(edgekv|cpu |cuda|nvrtc)" || true

echo "== tests (NVRTC, host arithmetic, refusals; every kernel on the GPU)"
select=()
if ! "$PY" -c "import sys; from edgekv.cuda.nvrtc import find_nvrtc; sys.exit(87 not in find_nvrtc().supported_archs())"; then
    # CUDA 13's NVRTC dropped Orin: make test checks sm_87 with NVRTC 12 (the cuda extra)
    echo "(this machine's NVRTC does not target sm_87: its compile checks are left to make test)"
    select=(-k "not 87")
fi
"$PY" -m pytest -q -rs -p no:cacheprovider -o addopts="" "${select[@]}" tests/test_cuda.py tests/test_cuda_host.py tests/test_cuda_device.py

echo "== kernels at the models' shapes"
"$PY" benchmarks/cuda_kernels.py
