#!/usr/bin/env bash
# Run edgekv's aarch64 code on this x86 machine: QEMU user-mode emulation of a Debian
# arm64 root, with the CPU model "max" (ARMv8.x with the int8 dot-product instructions
# sdot/udot that Jetson Orin's Cortex-A78AE has). Run by `make test-aarch64` and by
# .ci/run after `make test`.
#
# What it checks, inside the emulated root (tests/aarch64/, and tests/test_ops.py-style
# checks against tests/numpy_reference.py):
#   - `edgekv info` sees the dot-product instructions and names the sdot kernels;
#   - the sdot kernels give the portable kernels' bits, every 32-value block type, odd shapes;
#   - a tiny model end to end against the float64 NumPy reference;
#   - a tiny model of each family (qwen2, qwen3, phi3, YaRN, LongRoPE, ...) against
#     llama.cpp's log-probs (tests/test_families_llama_cpp.py);
#   - SmolLM2's greedy tokens for one reference prompt against llama.cpp's ids (the
#     x86 build's, tests/reference/) and against this x86 machine's own run;
#   - SmolLM2's greedy answers under a JSON schema and as a streamed tool call (llguidance's
#     aarch64 wheel): valid, and the x86 machine's.
#
# Everything comes from Debian's and PyPI's registries and is cached between runs under
# $EDGEKV_AARCH64_CACHE (default ~/.cache/edgekv/aarch64): the root (debootstrap, ~5 min
# once), the aarch64 wheels (pip download on the host, installed offline in the root)
# and the root's compiled kernels. Needs root (apt-get, binfmt_misc, chroot, mount).
# Any failing step stops the script with a non-zero status; nothing is skipped.
#
# `tools/test_aarch64.sh --prepare` does only the first part (the tools, the root, the wheels,
# the root's venv: mostly downloads and unpacking) and stops before the tests: .ci/run runs it
# in the background while the models are pulled and the kernels compiled, then this script finds it all ready.
set -euo pipefail
PREPARE=0
case "${1:-}" in
    --prepare) PREPARE=1 ;;
    "") ;;
    *) echo "usage: tools/test_aarch64.sh [--prepare]" >&2; exit 2 ;;
esac

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${EDGEKV_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgekv/aarch64}
ROOT=$CACHE/root
WHEELS=$CACHE/wheels
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_PY=${HOST_PY:-$REPO/.venv/bin/python}
REQS=$REPO/tools/aarch64/requirements.txt
MODEL=smollm2-135m-instruct
START=$SECONDS

step() { echo "== aarch64 [$((SECONDS - START)) s]: $*"; }
die() { echo "test_aarch64: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get, binfmt_misc, chroot, mount); run it as root or with sudo"
[ -x "$HOST_PY" ] || die "no $HOST_PY: run 'make install' first (or set HOST_PY)"

step "tools: qemu-user-static, debootstrap"
if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    packages=(qemu-user-static debootstrap binfmt-support)
    apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q "${packages[@]}" >/dev/null; } \
        || die "apt-get install ${packages[*]} failed (even after apt-get update)"
fi

step "binfmt_misc: run aarch64 ELF files through qemu-aarch64-static"
BINFMT=/proc/sys/fs/binfmt_misc
[ -e $BINFMT/register ] || mount -t binfmt_misc binfmt_misc $BINFMT \
    || die "cannot mount binfmt_misc (a container without the privilege to?)"
if [ ! -e $BINFMT/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 2>/dev/null || true
fi
if [ ! -e $BINFMT/qemu-aarch64 ]; then  # register by hand: ELF64, little-endian, e_machine 183 (AArch64)
    echo ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F' \
        > $BINFMT/register || die "cannot register qemu-aarch64 with binfmt_misc"
fi
grep -q enabled $BINFMT/qemu-aarch64 || die "binfmt entry qemu-aarch64 is disabled"

if [ ! -e "$ROOT/.edgekv-root" ]; then
    step "Debian arm64 root (debootstrap, once: ~5 min)"
    rm -rf "$ROOT.tmp"
    mkdir -p "$CACHE"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,libgomp1 bookworm "$ROOT.tmp" "$MIRROR" \
        > "$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log"; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
    touch "$ROOT.tmp/.edgekv-root"
    rm -rf "$ROOT"
    mv "$ROOT.tmp" "$ROOT"
fi

KEY=$(sha256sum "$REQS" | cut -c1-16)
if [ ! -e "$WHEELS/.key-$KEY" ]; then
    step "aarch64 wheels (pip download on the host)"
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    "$HOST_PY" -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp \
        --abi cp311 --abi abi3 --abi none --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_27_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_31_aarch64 -d "$WHEELS" -r "$REQS" \
        2>"$CACHE/pip.log" || { cat "$CACHE/pip.log"; die "pip download of the aarch64 wheels failed"; }
    touch "$WHEELS/.key-$KEY"
fi

mounted=()
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
bind() {  # bind [-r] SRC DEST_IN_ROOT
    local ro=""; [ "$1" = -r ] && { ro=1; shift; }
    mountpoint -q "$ROOT$2" && umount -l "$ROOT$2"  # left by a run that was killed before its cleanup
    mkdir -p "$ROOT$2"
    mount --bind "$1" "$ROOT$2" || die "cannot bind-mount $1"
    mounted=("$ROOT$2" "${mounted[@]}")
    [ -z "$ro" ] || mount -o remount,bind,ro "$ROOT$2"
}
mountpoint -q "$ROOT/proc" || { mount -t proc proc "$ROOT/proc" && mounted=("$ROOT/proc" "${mounted[@]}"); }
bind -r "$WHEELS" /opt/wheels

in_root() {  # a command in the emulated root, with a clean environment and the "max" CPU
    chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin LANG=C.UTF-8 QEMU_CPU=max \
        PYTHONDONTWRITEBYTECODE=1 "$@"
}

if [ ! -e "$ROOT/opt/venv/.key-$KEY" ]; then
    step "virtual environment in the root (offline, from the wheels)"
    rm -rf "$ROOT/opt/venv"
    in_root python3 -m venv /opt/venv || die "python3 -m venv failed in the root"
    cp "$REQS" "$ROOT/opt/requirements.txt"
    in_root /opt/venv/bin/python -m pip install -q --no-index --find-links /opt/wheels -r /opt/requirements.txt \
        || die "installing the aarch64 wheels in the root failed"
    touch "$ROOT/opt/venv/.key-$KEY"
fi
if [ $PREPARE = 1 ]; then
    step "prepared (the root, its wheels and venv); the tests run without --prepare"
    exit 0
fi

step "edgekv's working tree -> /work/edgekv in the root; pip install -e . there (offline)"
rm -rf "$ROOT/work/edgekv"
mkdir -p "$ROOT/work/edgekv"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp --parents -t "$ROOT/work/edgekv")  # the working tree as git sees it, deletions included
in_root /opt/venv/bin/python -m pip install -q --no-index --find-links /opt/wheels --no-build-isolation --no-deps \
    -e /work/edgekv || die "pip install -e . failed in the root"

step "model $MODEL (pulled on the host, shared read-only)"
"$HOST_PY" -m edgekv pull "$MODEL" >/dev/null || die "edgekv pull $MODEL failed on the host"
MODELS_DIR=$("$HOST_PY" -c "from edgekv.catalog import models_dir; print(models_dir())")
bind -r "$MODELS_DIR" /root/.cache/edgekv/models

step "x86 run of the same greedy check (this machine's own ids, for the comparison)"
X86_IDS=$(cd "$REPO" && "$HOST_PY" -m tests.aarch64.greedy_ids) || die "the x86 greedy run failed"
echo "x86 greedy ids: $X86_IDS"
(cd "$REPO" && "$HOST_PY" -m tests.aarch64.structured > "$CACHE/x86_structured.json") \
    || die "the x86 structured-output run failed"
echo "x86 structured answers: $(cat "$CACHE/x86_structured.json")"

cp "$CACHE/x86_structured.json" "$ROOT/opt/x86_structured.json"

step "edgekv info inside the root"
in_root /opt/venv/bin/python -m edgekv info | tee "$CACHE/info.txt" || die "edgekv info failed in the root"
grep -q "sdot" "$CACHE/info.txt" || die "edgekv info does not name the sdot kernels under -cpu max"

# two pytest processes side by side (the emulated compiler is single-threaded; 2 cores):
# the model end to end, and the kernels against the portable ones and the references.
# Compiling under emulation is ~20x slower than native: a test's first call may compile
# for many minutes, so the per-test timeout is an hour here (pyproject.toml: 10 min)
# the deep f16 attention kernel's unit tests (its IR on NEON); not its real-model test, which needs gemma3
DEEP_ATTENTION="tests/test_attention_decode.py::test_deep_kernel_matches_attention_f16_bit_for_bit tests/test_attention_decode.py::test_deep_kernel_honours_masks_in_a_wrapped_ring tests/test_attention_decode.py::test_deep_kernel_skips_underflowed_slots_as_attention_f16_does tests/test_attention_decode.py::test_blocked_softmax_numerators_are_softmax_numerators"
# (test_matvec.py beside the models: the kernel group compiles every int8 dot kernel and was
# twice as long, 12 against 6 minutes with a warm kernel cache)
TEST_GROUPS=("tests/aarch64 tests/test_models.py tests/test_families_llama_cpp.py tests/test_matvec.py" "tests/test_fast_kernels.py $DEEP_ATTENTION")
step "tests inside the root, two processes: ${TEST_GROUPS[*]}"
pids=()
for i in 0 1; do
    in_root /bin/sh -c "cd /work/edgekv && EDGEKV_X86_GREEDY_IDS='$X86_IDS' EDGEKV_X86_STRUCTURED=/opt/x86_structured.json python -m pytest -q -rs --durations=15 -p no:cacheprovider -o timeout=3600 ${TEST_GROUPS[$i]}" \
        > "$CACHE/pytest-$i.txt" 2>&1 &
    pids+=($!)
done
failed=0
for i in 0 1; do
    wait "${pids[$i]}" || failed=1
    echo "-- ${TEST_GROUPS[$i]}"
    cat "$CACHE/pytest-$i.txt"
done
[ $failed = 0 ] || die "tests failed under emulation"
! grep -qE "[0-9]+ skipped" "$CACHE"/pytest-[01].txt || die "tests were skipped under emulation (every one must run here)"

step "passed"
