"""The board's facts and power (edgekv/board/): Jetson file trees mounted as
EDGEKV_SYSFS_ROOT (tests/helpers/board_trees.py says where their layouts come from), a PC's
RAPL counter, synthetic power traces with a known energy, and `edgekv info` / `edgekv bench`
on them. This machine's own files are read too: whatever they hold, nothing fails."""

from __future__ import annotations

import json

import pytest

from edgekv.board import jetson, power
from edgekv.board.sysfs import ROOT_VARIABLE
from edgekv.cli import main
from edgekv.cli.info import board_lines
from helpers import board_trees


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    return tmp_path


def test_an_orin_nano_as_edgekv_info_shows_it(root):
    board_trees.orin_nano(root)
    lines = board_lines()
    assert lines["board"] == ("NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super (module p3767-0005: "
                              "Orin Nano 8GB (developer kit), carrier p3768-0000)")
    assert lines["jetpack"] == "6.2 (L4T 36.4.3)"  # from nvidia-l4t-core's package version
    assert lines["power mode"] == "25W (id 1)"
    assert lines["clocks"] == ("cpu 1344 MHz [min 730, max 1728], gpu 306 MHz [min 306, max 1020]; not locked: run "
                               "`sudo jetson_clocks` for repeatable figures")
    assert lines["thermal"] == "cpu-thermal 48.5 C, gpu-thermal 47.0 C, soc0-thermal 47.8 C, tj-thermal 49.0 C"
    assert lines["power rails"] == "VDD_IN 6.10 W, VDD_CPU_GPU_CV 1.57 W, VDD_SOC 2.13 W"
    board = jetson.read_board()
    assert board.clocks_locked is False and not board.throttling and board.jetpack == "6.2"


def test_an_agx_orin_locked_and_throttling(root):
    board_trees.agx_orin(root)
    lines = board_lines()
    assert lines["board"] == "Jetson AGX Orin Developer Kit (module p3701-0005: AGX Orin 64GB, carrier p3737-0000)"
    assert lines["jetpack"] == "5.1.2 (L4T 35.4.1)"  # from /etc/nv_tegra_release (no dpkg status)
    assert lines["power mode"] == "MAXN (id 0)"
    assert lines["clocks"] == ("cpu 2202 MHz [min 2202, max 2202], gpu 1300 MHz [min 1300, max 1300], "
                               "emc 3199 MHz [min 3199, max 3199]; locked (jetson_clocks)")
    assert lines["thermal"].endswith("; throttling: tj-thermal at 99.5 C >= 99.0 C")
    # two INA3221 devices; the "NC" channels are not rails
    assert lines["power rails"] == "VDD_GPU_SOC 15.77 W, VDD_CPU_CV 9.67 W, VIN_SYS_5V0 4.55 W, VDDQ_VDD2_1V8AO 1.52 W"
    meter = power.PowerMeter.find()
    assert meter.source == "ina3221 VIN_SYS_5V0"


def test_missing_files_are_not_known_not_errors(root):
    """Only /etc/nv_tegra_release: a Jetson with a release and nothing else; no nvpmodel
    status: the mode is unknown and the default is said; no files at all: not a Jetson."""
    assert jetson.read_board() is None and board_lines() == {}
    board_trees.write(root, {"/etc/nv_tegra_release": "# R36 (release), REVISION: 3.0, GCID: 1\n"})
    assert board_lines() == {"board": "a Jetson", "jetpack": "6.0 (L4T 36.3.0)"}
    board_trees.orin_nano(root, status=False)
    assert board_lines()["power mode"] == "unknown (nvpmodel's status is not readable; its default is MAXN_SUPER (id 2))"
    (root / "etc/nv_tegra_release").write_text("garbage")
    (root / "var/lib/dpkg/status").write_text("")
    assert "jetpack" not in board_lines()


def test_this_machines_own_files_read_without_failing(monkeypatch):
    monkeypatch.delenv(ROOT_VARIABLE, raising=False)
    lines = board_lines()
    assert all(isinstance(v, str) and v for v in lines.values())


def test_power_averaged_from_a_synthetic_trace():
    """10 W for 1 s, then a ramp to 20 W over 1 s, then 20 W for 1 s: 10 + 15 + 20 = 45 J in 3 s."""
    watts, joules = power.average_power([(0.0, 10.0), (1.0, 10.0), (2.0, 20.0), (3.0, 20.0)])
    assert (watts, joules) == (15.0, 45.0)
    assert power.average_power([(5.0, 7.0)]) == (7.0, 0.0) and power.average_power([]) == (0.0, 0.0)


def test_a_meter_on_rails_whose_values_change(root):
    board_trees.orin_nano(root)
    now = [100.0]
    meter = power.PowerMeter.find(clock=lambda: now[0], interval=3600)  # the test takes the samples
    assert meter.source == "ina3221 VDD_IN"
    rail = root / "sys/class/hwmon/hwmon1"
    meter.start()  # 5080 mV x 1200 mA = 6.096 W at t = 100
    for t, ma in ((101.0, 1200), (102.0, 2400), (104.0, 2400)):
        now[0] = t
        (rail / "curr1_input").write_text(f"{ma}\n")
        meter.sample()
    now[0] = 104.0
    reading = meter.stop()
    expected = 6.096 * 1 + (6.096 + 12.192) / 2 * 1 + 12.192 * 2 + 0  # the last sample again at stop: 0 s more
    assert reading.seconds == 4.0 and reading.joules == pytest.approx(expected)
    assert reading.watts == pytest.approx(expected / 4)


def test_a_meter_on_rapl_across_the_counters_wrap(root):
    """RAPL counts microjoules and wraps at max_energy_range_uj: 9.5 J -> (wrap at 10 J) -> 1.5 J is 2 J."""
    board_trees.x86_with_rapl(root)
    assert power.rapl_counters() == [("package-0", root / "sys/class/powercap/intel-rapl:0/energy_uj", 10_000_000)]
    assert board_lines() == {"power": "RAPL energy counters of package-0"}
    now = [0.0]
    meter = power.PowerMeter.find(clock=lambda: now[0])
    assert meter.source == "rapl package-0"
    meter.start()
    (root / "sys/class/powercap/intel-rapl:0/energy_uj").write_text("1500000\n")
    now[0] = 4.0
    reading = meter.stop()
    assert (reading.joules, reading.seconds, reading.watts) == (2.0, 4.0, 0.5)


def test_bench_on_a_jetson_records_power_mode_clocks_and_energy(root, tiny_model, capsys):
    board_trees.orin_nano(root)
    rc = main(["bench", "-m", str(tiny_model(head_dim=32)), "-p", "8", "-n", "4", "-r", "2", "-t", "1", "-o", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "power mode 25W, clocks not locked" in err and "sudo jetson_clocks" in err
    assert "power from ina3221 VDD_IN" in err
    for r in json.loads(out):
        assert (r["power_mode"], r["clocks_locked"], r["power_source"]) == ("25W", False, "ina3221 VDD_IN")
        assert r["avg_power_w"] == pytest.approx(6.096)  # the rail does not change here
        # the meter spans the timed repetitions (and the cache resets between them): at least their time
        bound = (r["n_prompt"] + r["n_gen"]) * 2 / (6.096 * sum(r["samples_ns"]) / 1e9)
        assert 0.1 * bound < r["tokens_per_joule"] <= bound * 1.001
    rc = main(["bench", "-m", str(tiny_model(head_dim=32)), "-p", "8", "-n", "0", "-r", "1", "-t", "1"])
    out, _ = capsys.readouterr()
    header = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert rc == 0 and header[-3:] == ["t/s", "W", "t/J"]


def test_bench_warns_when_the_board_throttled(root, tiny_model, capsys):
    board_trees.agx_orin(root)
    rc = main(["bench", "-m", str(tiny_model(head_dim=32)), "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o", "jsonl"])
    out, err = capsys.readouterr()
    assert rc == 0 and "clocks locked" in err and "throttling when the run ended (tj-thermal 99.5 C)" in err
    record = json.loads(out)
    assert record["power_mode"] == "MAXN" and record["clocks_locked"] is True


def test_a_monitor_counts_energy_for_metrics(root, monkeypatch):
    """The server's monitor: the power at each reading and the energy since it started, by the
    trapezoid rule on rails and across a RAPL counter's wrap."""
    board_trees.orin_nano(root)
    now = [0.0]
    monitor = power.PowerMonitor(power.PowerMeter.find(clock=lambda: now[0]), interval=3600)
    monitor.read()  # 6.096 W at t = 0
    (root / "sys/class/hwmon/hwmon1/curr1_input").write_text("2400\n")
    now[0] = 2.0
    monitor.read()  # 12.192 W at t = 2
    assert (monitor.watts, monitor.joules) == (pytest.approx(12.192), pytest.approx(2 * (6.096 + 12.192) / 2))
    pc = board_trees.x86_with_rapl(root / "pc")
    monkeypatch.setenv(ROOT_VARIABLE, str(pc))
    rapl = power.PowerMonitor(power.PowerMeter.find(clock=lambda: now[0]), interval=3600)
    rapl.read()  # 9.5 J on the counter at t = 2
    (pc / "sys/class/powercap/intel-rapl:0/energy_uj").write_text("500000\n")
    now[0] = 4.0
    rapl.read()  # wrapped at 10 J: 1 J in 2 s
    assert (rapl.source, rapl.joules, rapl.watts) == ("rapl package-0", 1.0, 0.5)


def test_metrics_export_power_and_energy(root, tiny_model):
    from starlette.testclient import TestClient

    from edgekv import Llama
    from edgekv.server import create_app

    board_trees.orin_nano(root)
    with TestClient(create_app(Llama(str(tiny_model()), n_ctx=64))) as client:
        text = client.get("/metrics").text
    assert "# TYPE edgekv_power_watts gauge" in text and "# TYPE edgekv_energy_joules_total counter" in text
    assert 'edgekv_power_watts{source="ina3221 VDD_IN"} 6.096' in text
    assert 'edgekv_energy_joules_total{source="ina3221 VDD_IN"} ' in text


def test_edgekv_mem_on_a_jetson_shows_the_shared_ram(root, tiny_model, capsys):
    """The board's total, what is available and what other processes hold, and NvMap's GPU
    clients (debugfs, as `cat /sys/kernel/debug/nvmap/iovmm/clients` prints them)."""
    board_trees.orin_nano(root)
    board_trees.write(root, {
        "/proc/meminfo": "MemTotal:        7802128 kB\nMemFree:          912340 kB\nMemAvailable:    5312004 kB\n",
        "/proc/self/status": "Name:\tpython\nVmRSS:\t  524288 kB\n",
        "/sys/kernel/debug/nvmap/iovmm/clients": "CLIENT                        PROCESS      PID        SIZE\n"
                                                 "user                          gnome-shell  1523     184320K\n"
                                                 "user                          python3      4242    1048576K\n"
                                                 "total                                               1232896K\n"})
    rc = main(["mem", "-m", str(tiny_model()), "-c", "64"])
    out = capsys.readouterr().out
    assert rc == 0
    assert ("board memory:    7.4 GiB shared by the CPU and the GPU, 5.1 GiB available; other processes hold "
            "1.9 GiB") in out
    assert "gpu memory:      python3 (pid 4242) 1024 MiB, gnome-shell (pid 1523) 180 MiB" in out
    board_trees.write(root, {"/proc/meminfo": "garbage\n"})
    main(["mem", "-m", str(tiny_model()), "-c", "64"])
    assert "board memory" not in capsys.readouterr().out  # unreadable: not shown, no error
