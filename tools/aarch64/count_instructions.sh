#!/usr/bin/env bash
# Instructions per 32-value block of the sdot and the portable matvec kernels on aarch64,
# counted by single-stepping them under QEMU's gdb stub (the emulated root of
# tools/test_aarch64.sh, which must have run once). Speed on Arm cannot be measured on
# this machine; executed instructions are the proxy. Prints a table.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${EDGEKV_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgekv/aarch64}
ROOT=$CACHE/root
PORT=${GDB_PORT:-12345}
[ -e "$ROOT/opt/venv/bin/python" ] || { echo "run tools/test_aarch64.sh first (no emulated root)" >&2; exit 1; }
command -v gdb-multiarch >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q gdb-multiarch >/dev/null
cp "$REPO/tools/aarch64/count_target.py" "$ROOT/tmp/count_target.py"
rm -rf "$ROOT/work/edgekv/edgekv" && cp -r "$REPO/edgekv" "$ROOT/work/edgekv/edgekv"
mountpoint -q "$ROOT/proc" || { mount -t proc proc "$ROOT/proc"; trap 'umount -l "$ROOT/proc"' EXIT; }
rm -f "$ROOT/tmp/addresses.json"
chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin QEMU_CPU=max QEMU_GDB=$PORT \
    EDGEKV_NUMBA_CACHE=0 python /tmp/count_target.py /tmp/addresses.json > "$CACHE/count_calls.json" &
target=$!
sleep 2
GDB_PORT=$PORT ADDRESS_FILE="$ROOT/tmp/addresses.json" gdb-multiarch -q -batch -x "$REPO/tools/aarch64/gdb_count.py" \
    2>/dev/null | grep '^COUNTS ' | cut -c8- > "$CACHE/count_steps.json"
wait $target
python3 - "$CACHE/count_calls.json" "$CACHE/count_steps.json" <<'PY'
import json, sys
calls, steps = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert len(calls) == len(steps), (len(calls), len(steps))
per = {}
for c, n in zip(calls, steps):
    per.setdefault((c["type"], c["kernel"], c["rows"]), {})[c["blocks"]] = n
print("instructions executed per 32-value block and weight row (one token), aarch64 code under QEMU -cpu max")
print(f"{'type':6} {'kernel':9} {'rows/call':>9} {'1 block':>8} {'9 blocks':>9} {'per block':>10} {'per block-row':>14}")
rows = {}
for (t, k, r), n in per.items():
    block = (n[9] - n[1]) / 8
    rows[(t, k)] = block / r
    print(f"{t:6} {k:9} {r:>9} {n[1]:>8} {n[9]:>9} {block:>10.1f} {block / r:>14.2f}")
for t in sorted({t for t, _ in rows}):
    print(f"{t}: portable / sdot = {rows[(t, 'portable')] / rows[(t, 'sdot')]:.2f}x the instructions")
PY
