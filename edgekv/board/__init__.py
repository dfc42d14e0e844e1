"""The board edgekv runs on: Jetson facts (module, JetPack, power mode, clocks, temperatures)
and power readings (a Jetson's INA3221 rails, an x86 package's RAPL counter).

What lives here: `sysfs.py` (every read of /proc, /sys, /etc and /var through one root,
EDGEKV_SYSFS_ROOT, default /), `jetson.py` (the facts, `edgekv info`'s lines) and `power.py`
(rails, RAPL and a meter that averages power over a run). Every read is optional: a missing
or unreadable file means "not a Jetson" or "not known", never an error. What does not live
here: the commands that print them (cli/info.py, cli/bench.py) and the benchmark (lab/bench.py).
"""
