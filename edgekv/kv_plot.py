"""The PNG of `edgekv kv-report --png`: quality against memory, one point per K/V pair.

x: bits per value (K and V averaged, block scales included), the memory a token costs;
y: mean KL divergence from the f16/f16 cache, on a log scale (the f16 base, at 0, sits on
the bottom edge, labelled "base, KLD 0"); the Pareto front is joined by a line and its points
filled, the others hollow. matplotlib is an optional extra (`pip install edgekv[plot]`).
What does not live here: the measurements (kv_report.py).
"""

from __future__ import annotations

from typing import Sequence

from .errors import EdgeKVError


def _label_sides(rows: Sequence[tuple[str, float, float, bool]]) -> list[int]:
    """+1 (label right of its point) or -1 (left): points of the same size alternate from the
    highest down, so two pairs at equal bits and close KLD do not write over each other."""
    sides = [1] * len(rows)
    for bits in {r[1] for r in rows}:
        same = sorted((i for i, r in enumerate(rows) if r[1] == bits), key=lambda i: -rows[i][2])
        for n, i in enumerate(same):
            sides[i] = 1 if n % 2 == 0 else -1
    return sides


def save_plot(path: str, title: str, rows: Sequence[tuple[str, float, float, bool]]) -> None:
    """rows: (label, bits per value, mean KLD, on the Pareto front)."""
    try:
        import matplotlib
    except ImportError:
        raise EdgeKVError("--png needs matplotlib: pip install 'edgekv[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    positive = [kld for _, _, kld, _ in rows if kld > 0]
    floor = min(positive) / 3 if positive else 1e-4
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    front = sorted((bits, max(kld, floor)) for _, bits, kld, on in rows if on)
    if len(front) > 1:
        ax.plot(*zip(*front), color="tab:blue", linewidth=1.5, zorder=1, label="Pareto front")
    for (label, bits, kld, on), side in zip(rows, _label_sides(rows)):
        y = max(kld, floor)
        ax.scatter([bits], [y], s=60, zorder=2, color="tab:blue" if on else "white", edgecolors="tab:blue",
                   linewidths=1.5)
        ax.annotate(label + (" (base, KLD 0)" if kld <= 0 else ""), (bits, y), textcoords="offset points",
                    xytext=(7 * side, 5), ha="left" if side > 0 else "right", fontsize=9)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)  # the base sits on the bottom edge
    ax.set_xlabel("bits per value (K and V averaged, scales included)")
    ax.set_ylabel("mean KL divergence from the f16 cache (nats/token)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    xs = [bits for _, bits, _, _ in rows]
    ax.set_xlim(min(xs) - 2, max(xs) + 2.5)
    if len(front) > 1:
        ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise EdgeKVError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
