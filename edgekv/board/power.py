"""Power while something runs: a Jetson's on-board INA3221 monitors, or an x86 package's RAPL
energy counter, averaged over a run into watts and joules.

Where the files come from (read through sysfs.py's root):
  - INA3221 (Jetson Orin and Xavier modules; the Jetson Linux developer guide's "Software
    Based Power Consumption Modeling"): a hwmon device whose `name` is "ina3221", channel N
    with `inN_label` (the rail: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC, ...), `inN_input` (the bus
    voltage, mV) and `currN_input` (mA), as the kernel's hwmon sysfs ABI names them. The
    module's input rail (VDD_IN; VIN_SYS_5V0 or VIN on some carriers) is the board's power;
    without one the rails are summed (and the source says so);
  - RAPL (the kernel's powercap ABI): /sys/class/powercap/intel-rapl:N/energy_uj, a counter in
    microjoules that wraps at max_energy_range_uj, one per CPU package ("package-N"); it counts
    everything the package does, other processes included. Often readable by root only.

What lives here: finding a source (`PowerMeter.find`), sampling rails in a thread, reading
the counters, and `average_power` (the trapezoid rule over timed samples). What does not:
where a run starts and ends (lab/bench.py).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import sysfs

TOTAL_RAILS = ("VDD_IN", "VIN_SYS_5V0", "VIN")


@dataclass(frozen=True)
class Rail:
    label: str
    volts: Path  # mV
    amps: Path  # mA

    def watts(self) -> float | None:
        mv, ma = sysfs.read_int(self.volts), sysfs.read_int(self.amps)
        return None if mv is None or ma is None else mv * ma / 1e6


@dataclass(frozen=True)
class Reading:
    """What a meter saw over a run."""
    source: str
    seconds: float
    joules: float

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0


def rails() -> list[Rail]:
    """The INA3221 channels that have a rail's label, in the order the devices list them."""
    found, seen = [], set()
    for hwmon in sysfs.glob("/sys/class/hwmon/hwmon*") + sysfs.glob("/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"):
        key = hwmon.resolve()
        if key in seen or sysfs.read_text(hwmon / "name") != "ina3221":
            continue
        seen.add(key)
        for n in range(1, 4):
            label = sysfs.read_text(hwmon / f"in{n}_label")
            if label and label.upper() != "NC" and (hwmon / f"curr{n}_input").exists():
                found.append(Rail(label, hwmon / f"in{n}_input", hwmon / f"curr{n}_input"))
    return found


def rapl_counters() -> list[tuple[str, Path, int]]:
    """(name, energy_uj file, wrap-around range) of each CPU package's RAPL counter that reads."""
    out = []
    for zone in sysfs.glob("/sys/class/powercap/intel-rapl:*"):
        if not re.fullmatch(r"intel-rapl:\d+", zone.name) or sysfs.read_int(zone / "energy_uj") is None:
            continue
        out.append((sysfs.read_text(zone / "name") or zone.name, zone / "energy_uj",
                    sysfs.read_int(zone / "max_energy_range_uj") or 2 ** 32))
    return out


def average_power(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """(average watts, joules) of (seconds, watts) samples, by the trapezoid rule; a single
    sample is its own average over no time."""
    if not samples:
        return 0.0, 0.0
    joules = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(samples, samples[1:]))
    span = samples[-1][0] - samples[0][0]
    return (joules / span if span > 0 else samples[0][1]), joules


class PowerMeter:
    """start() ... stop() -> Reading. Rails are sampled every `interval` seconds by a thread
    (and at start and stop); RAPL counters are read at start and stop."""

    def __init__(self, source: str, watts: Callable[[], float | None] | None = None,
                 counters: list[tuple[str, Path, int]] | None = None, interval: float = 0.05,
                 clock: Callable[[], float] = time.monotonic):
        self.source, self._watts, self._counters = source, watts, counters or []
        self.interval, self.clock = interval, clock
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start: tuple[float, list[int]] | None = None

    @classmethod
    def find(cls, **kwargs) -> PowerMeter | None:
        """A meter on this machine's best source: the board's input rail, the sum of its rails,
        or the RAPL package counters; None when none reads."""
        found = [r for r in rails() if r.watts() is not None]
        total = next((r for name in TOTAL_RAILS for r in found if r.label.upper() == name), None)
        if total is not None:
            return cls(f"ina3221 {total.label}", total.watts, **kwargs)
        if found:
            return cls("ina3221 sum of " + "+".join(r.label for r in found),
                       lambda: sum(w for w in (r.watts() for r in found) if w is not None), **kwargs)
        counters = rapl_counters()
        if counters:
            return cls("rapl " + "+".join(name for name, _, _ in counters), counters=counters, **kwargs)
        return None

    def sample(self) -> None:
        """One rail reading, now."""
        w = self._watts() if self._watts is not None else None
        if w is not None:
            self._samples.append((self.clock(), w))

    def start(self) -> None:
        self._samples, self._stop = [], threading.Event()
        self._start = (self.clock(), self._energies())
        if self._watts is not None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="edgekv-power", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _energies(self) -> list[int]:
        """The RAPL counters now, microjoules."""
        return [sysfs.read_int(path) or 0 for _, path, _ in self._counters]

    def stop(self) -> Reading:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()
        t0, energies = self._start
        seconds = self.clock() - t0
        if self._counters:  # microjoules counted, each counter wrapping at its range
            joules = _counted(self._counters, energies, self._energies())
            return Reading(self.source, seconds, joules)
        watts, joules = average_power(self._samples)
        span = self._samples[-1][0] - self._samples[0][0] if len(self._samples) > 1 else 0.0
        return Reading(self.source, span or seconds, joules if span else watts * seconds)


class PowerMonitor:
    """A meter that runs for a server's lifetime: the power at the last reading and the energy
    since it started (rails integrated by the trapezoid rule, RAPL counters followed across
    their wrap-around), read every `interval` seconds by a thread (`edgekv serve`'s /metrics)."""

    def __init__(self, meter: PowerMeter, interval: float = 1.0):
        self.meter, self.interval = meter, interval
        self.source = meter.source
        self.watts, self.joules = 0.0, 0.0
        self._last: tuple[float, float | list[int]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekv-power-monitor", daemon=True)

    def start(self) -> PowerMonitor:
        self.read()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.read()

    def read(self) -> None:
        """One reading now, added to the energy."""
        m, now = self.meter, self.meter.clock()
        if m._counters:
            value: float | list[int] = m._energies()
        else:
            value = m._watts() if m._watts is not None else None
            if value is None:
                return
        with self._lock:
            if self._last is not None:
                t0, before = self._last
                if m._counters:
                    added = _counted(m._counters, before, value)
                    self.watts = added / (now - t0) if now > t0 else self.watts
                else:
                    added = (now - t0) * (before + value) / 2
                self.joules += added
            if not m._counters:
                self.watts = value
            self._last = (now, value)


def _counted(counters: list[tuple[str, Path, int]], before: list[int], after: list[int]) -> float:
    """Joules the RAPL counters counted from `before` to `after` (each wrapping at its range)."""
    return sum((e1 - e0) % span for (_, _, span), e0, e1 in zip(counters, before, after)) / 1e6
