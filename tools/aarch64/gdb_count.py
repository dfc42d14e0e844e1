"""gdb-multiarch script of tools/aarch64/count_instructions.sh: attaches to QEMU's gdb stub,
waits for count_target.py's SIGTRAP, breaks at each kernel's entry and single-steps every
call to its return, printing one JSON list of instruction counts (in call order)."""

import json
import os

import gdb

gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute(f"target remote :{os.environ['GDB_PORT']}")
gdb.execute("continue")  # to count_target.py's SIGTRAP, after it wrote the addresses
with open(os.environ["ADDRESS_FILE"]) as f:
    for address in json.load(f):
        gdb.execute(f"break *{address}", to_string=True)
counts = []
resume = "signal 0"  # swallow the SIGTRAP
while True:
    try:
        gdb.execute(resume, to_string=True)
    except gdb.error:
        break
    resume = "continue"
    if not gdb.selected_inferior().pid or gdb.selected_thread() is None:
        break
    ret, sp = int(gdb.parse_and_eval("$x30")), int(gdb.parse_and_eval("$sp"))
    pc = int(gdb.parse_and_eval("$pc"))
    n = 0
    while not (pc == ret and int(gdb.parse_and_eval("$sp")) == sp):
        gdb.execute("stepi", to_string=True)
        n += 1
        pc = int(gdb.parse_and_eval("$pc"))
    counts.append(n)
print("COUNTS " + json.dumps(counts))
