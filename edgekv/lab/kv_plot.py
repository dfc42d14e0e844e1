"""The PNG of `edgekv kv-report --png`: quality against memory, one point per K/V pair.

x: bits per value (K and V averaged, block scales included), the memory a token costs;
y: mean KL divergence from the f16/f16 cache, on a log scale (the f16 base, at 0, sits on
the bottom edge); the Pareto front is joined by a line and its points filled, the others
hollow. Points carry numbers; a key beside the plot names them (CachePair.label: a per-layer
mix as its main type and where the others are) with their bits and KLD. matplotlib is an
optional extra (`pip install edgekv[plot]`).
What does not live here: the measurements (lab/kv_report.py).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import EdgeKVError


# where a point's number may go, in points from the point: right, left, above, below, the
# diagonals, then the same a step further out (a cluster of 4-bit types and their mixes)
_OFFSETS = ((6, 3), (-6, 3), (0, 9), (0, -15), (6, -13), (-6, -13), (9, 10), (-9, 10),
            (16, 3), (-16, 3), (0, 18), (0, -24), (16, -18), (-16, -18), (16, 14), (-16, 14),
            (28, 3), (28, 18), (28, -14), (-28, 3), (-28, 18), (-28, -14))
_CHAR_W, _TEXT_H, _DOT_R = 6.0, 9.0, 5.0  # a 9-point digit's width and height, a marker's radius


def _label_offsets(points: Sequence[tuple[float, float]], labels: Sequence[str]) -> list[tuple[int, int]]:
    """For each point (x, y in points, y up), the first offset in _OFFSETS whose label box
    overlaps no marker and no label placed before it (the first offset when none is free)."""
    def box(x, y, dx, dy, text):  # (x0, x1, y0, y1) of the label at offset (dx, dy)
        w = _CHAR_W * len(text)
        left = x + dx if dx > 0 else x + dx - w if dx < 0 else x - w / 2
        return left, left + w, y + dy, y + dy + _TEXT_H

    placed: list[tuple[float, float, float, float]] = []
    out = []
    for (x, y), text in zip(points, labels):
        for dx, dy in _OFFSETS:
            x0, x1, y0, y1 = box(x, y, dx, dy, text)
            hits_dot = any(x0 - _DOT_R < px < x1 + _DOT_R and y0 - _DOT_R < py < y1 + _DOT_R for px, py in points)
            if abs(dx) > 10 or abs(dy) > 15:  # its leader line must pass no other point
                hits_dot = hits_dot or any(_near_segment((px, py), (x, y), (x + dx, y + dy)) for px, py in points
                                           if (px, py) != (x, y))
            hits_label = any(x0 < b1 and b0 < x1 and y0 < c1 and c0 < y1 for b0, b1, c0, c1 in placed)
            if not hits_dot and not hits_label:
                break
        else:
            dx, dy = _OFFSETS[0]
            x0, x1, y0, y1 = box(x, y, dx, dy, text)
        placed.append((x0, x1, y0, y1))
        out.append((dx, dy))
    return out


def _near_segment(p, a, b) -> bool:
    """Whether point p lies within a marker's radius of the segment a-b."""
    (px, py), (ax, ay), (bx, by) = p, a, b
    dx, dy = bx - ax, by - ay
    t = max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)))
    return (px - ax - t * dx) ** 2 + (py - ay - t * dy) ** 2 < (_DOT_R + 1) ** 2


def save_plot(path: str, title: str, rows: Sequence[tuple[str, float, float, bool]]) -> None:
    """rows: (label, bits per value, mean KLD, on the Pareto front). Each point carries its
    number; the key beside the axes gives each number's pair, bits and KLD (pairs a few
    hundredths of a bit apart, as per-layer mixes are, would write their names over each other)."""
    try:
        import matplotlib
    except ImportError:
        raise EdgeKVError("--png needs matplotlib: pip install 'edgekv[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 (matplotlib.ticker below)

    positive = [kld for _, _, kld, _ in rows if kld > 0]
    floor = min(positive) / 3 if positive else 1e-4
    fig = plt.figure(figsize=(11, 6.5), dpi=120)
    ax = fig.add_axes((0.09, 0.1, 0.48, 0.8))
    front = sorted((bits, max(kld, floor)) for _, bits, kld, on in rows if on)
    if len(front) > 1:
        ax.plot(*zip(*front), color="tab:blue", linewidth=1.5, zorder=1, label="Pareto front (filled)")
    for label, bits, kld, on in rows:
        ax.scatter([bits], [max(kld, floor)], s=50, zorder=2, color="tab:blue" if on else "white",
                   edgecolors="tab:blue", linewidths=1.5)
    # log bits: the 4-5 bit types (the 4-bit ones and mixes of them) get room apart
    xs = [bits for _, bits, _, _ in rows]
    lo, hi = min(xs) / 1.1, max(xs) * 1.15
    ax.set_xscale("log", base=2)
    ax.set_xticks([t for t in (2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32) if lo <= t <= hi])
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlim(lo, hi)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)  # the base sits on the bottom edge
    ax.set_xlabel("bits per value (K and V averaged, scales included; log scale)")
    ax.set_ylabel("mean KL divergence from the f16 cache (nats/token)")
    ax.grid(True, which="both", alpha=0.3)
    if len(front) > 1:
        ax.legend(loc="upper right", fontsize=9)
    _number_points(fig, ax, [(bits, max(kld, floor)) for _, bits, kld, _ in rows])
    fig.suptitle(title, fontsize=10)
    key = [f"{'':>2}  {'K/V cache types':<40} bits   KLD"]
    key += [f"{n:>2}{'*' if on else ' '} {label:<40} {bits:>5.2f}  {kld:.4f}"
            for n, (label, bits, kld, on) in enumerate(rows, 1)]
    key.append("\n* on the Pareto front: no other pair is smaller and closer")
    fig.text(0.6, 0.9, "\n".join(key), va="top", ha="left", family="monospace", fontsize=8)
    try:
        fig.savefig(path)
    except OSError as exc:
        raise EdgeKVError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)


def _number_points(fig, ax, xy: Sequence[tuple[float, float]]) -> None:
    """Write 1, 2, ... beside the points, each where it covers no other point or number;
    points closer than a marker's width share one label ("11,12", from the top down)."""
    to_points = 72.0 / fig.dpi  # display pixels -> typographic points
    px = [tuple(v * to_points for v in ax.transData.transform(p)) for p in xy]
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(px):
        near = next((g for g in groups if (px[g[0]][0] - x) ** 2 + (px[g[0]][1] - y) ** 2 < (2 * _DOT_R) ** 2), None)
        if near is None:
            groups.append([i])
        else:
            near.append(i)
    labels = [",".join(str(i + 1) for i in sorted(g, key=lambda i: -px[i][1])) for g in groups]
    anchors = [px[g[0]] for g in groups]
    for g, text, (dx, dy) in zip(groups, labels, _label_offsets(anchors, labels)):
        far = abs(dx) > 10 or abs(dy) > 15  # a step out: a thin line shows which point it names
        ax.annotate(text, xy[g[0]], textcoords="offset points", xytext=(dx, dy), fontsize=9,
                    ha="left" if dx > 0 else "right" if dx < 0 else "center",
                    arrowprops=dict(arrowstyle="-", color="gray", linewidth=0.7, shrinkA=1, shrinkB=4) if far else None)
