"""The scale searches of ggml's quantizers: for a group of values (and optional importance
weights), the scale, min and integer levels that fit them best, bit-exact with ggml-quants.c.

What lives here: `make_qkx2_quants` (scale and min of an asymmetric group: Q2_K, Q4_K, Q5_K,
Q4_1/Q5_1 with an imatrix), `make_qx_quants` (a symmetric group: Q6_K, Q3_K and Q4_0/Q5_0 with
an imatrix), `make_q3_quants` (Q3_K's groups without one) and `make_qp_quants` (the positive
sub-block scales and mins of the K-quants with an imatrix). Importance weights are passed as an
array, empty for none. The arithmetic is ggml's in float32 step by step, compiled without
fast-math (no FMA): `w*x*l` is `(w*x)*l`. What does not live here: the block layouts and the
row quantizers (quantize_k.py, quantize_low.py, quantize_weights.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .config import EXACT_FLAGS
from .fp16 import nearest_int

F32 = np.float32
GROUP_MAX_EPS = np.float32(1e-15)


@nb.njit(**EXACT_FLAGS)
def sum_squares(x):
    # sum of x*x in order
    s = F32(0.0)
    for i in range(x.size):
        s += x[i] * x[i]
    return s


@nb.njit(**EXACT_FLAGS)
def importance_weights(x, qw, sigma2, out):
    # out[i] = qw[i] * sqrt(sigma2 + x[i]^2), ggml's weight of a value by its column's
    # importance and the block's spread; -> their sum, in order
    total = F32(0.0)
    for i in range(x.size):
        out[i] = qw[i] * np.sqrt(sigma2 + x[i] * x[i])
        total += out[i]
    return total


@nb.njit(**EXACT_FLAGS)
def fit_error(diff, use_mad):
    return abs(diff) if use_mad else diff * diff


@nb.njit(**EXACT_FLAGS)
def make_qkx2_quants(x, weights, nmax, L, Laux, rmin, rdelta, nstep, use_mad=False):
    # ggml's make_qkx2_quants: levels L in [0, nmax] of x ~ scale*L - min, searching nstep+1
    # inverse scales for the least weighted squared (use_mad: absolute) error; -> (scale, min).
    # With weights given and use_mad false it is also ggml's make_qkx3_quants, step for step.
    n = x.size
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = F32(0.0)
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return F32(0.0), -mn
    iscale = F32(nmax) / (mx - mn)
    scale = F32(1.0) / iscale
    best_error = F32(0.0)
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        best_error += weights[i] * fit_error(scale * F32(L[i]) + mn - x[i], use_mad)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + F32(nmax)) / (mx - mn)
        sum_l = F32(0.0)
        sum_l2 = F32(0.0)
        sum_xl = F32(0.0)
        for i in range(n):
            lv = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
            Laux[i] = lv
            w = weights[i]
            lf = F32(lv)
            sum_l += w * lf
            sum_l2 += w * lf * lf
            sum_xl += w * lf * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F32(0.0)
                this_scale = sum_xl / sum_l2
            cur_error = F32(0.0)
            for i in range(n):
                cur_error += weights[i] * fit_error(this_scale * F32(Laux[i]) + this_min - x[i], use_mad)
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@nb.njit(**EXACT_FLAGS)
def qx_sums(x, nmax, iscale, qw):
    # sum w*x*l and sum w*l*l over the levels l of x at iscale, w = qw, or x*x when qw is
    # empty (rmse_type 1)
    sumlx = F32(0.0)
    suml2 = F32(0.0)
    for i in range(x.size):
        lf = F32(max(-nmax, min(nmax - 1, nearest_int(iscale * x[i]))))
        w = qw[i] if qw.size else x[i] * x[i]
        sumlx += w * x[i] * lf
        suml2 += w * lf * lf
    return sumlx, suml2


@nb.njit(**EXACT_FLAGS)
def qx_levels(x, nmax, iscale, L):
    for i in range(x.size):
        L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))


@nb.njit(**EXACT_FLAGS)
def make_qx_quants(x, nmax, L, qw):
    # ggml's make_qx_quants with rmse_type 1: levels L in [0, 2*nmax) of x ~ scale*(L - nmax),
    # trying 18 inverse scales around -nmax/max, fits weighted by qw (x*x when qw is empty)
    mx = F32(0.0)
    amax = F32(0.0)
    for i in range(x.size):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(x.size):
            L[i] = 0
        return F32(0.0)
    iscale = F32(-nmax) / mx
    qx_levels(x, nmax, iscale, L)
    sumlx, suml2 = qx_sums(x, nmax, iscale, qw)
    scale = sumlx / suml2 if suml2 != 0 else F32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        sumlx, suml2 = qx_sums(x, nmax, iscale, qw)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            qx_levels(x, nmax, iscale, L)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@nb.njit(**EXACT_FLAGS)
def make_q3_quants(x, nmax, L):
    # ggml's make_q3_quants (do_rmse): levels L in [0, 2*nmax) of x ~ scale*(L - nmax) from
    # -nmax/max, then up to 5 passes moving single levels while the x^2-weighted fit improves
    n = x.size
    mx = F32(0.0)
    amax = F32(0.0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F32(0.0)
    iscale = F32(-nmax) / mx
    sumlx = F32(0.0)
    suml2 = F32(0.0)
    for i in range(n):
        lv = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = lv
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(lv)
        suml2 += w * F32(lv) * F32(lv)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            if slx > 0:
                sl2 = suml2 - w * li * li
                new_l = max(-nmax, min(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else F32(0.0)


@nb.njit(**EXACT_FLAGS)
def qp_error(x, qw, nmax, iscale, L, clamp):
    # sum w*(x - scale*l)^2 of the levels l = nearest(iscale*x) (clamped to nmax when clamp;
    # L, when not empty, gets the unclamped ones, wrapped to uint8 as ggml stores them)
    scale = F32(1.0) / iscale
    err = F32(0.0)
    for i in range(x.size):
        lv = nearest_int(iscale * x[i])
        if clamp:
            lv = min(nmax, lv)
        else:
            L[i] = lv & 0xFF
            lv = L[i]
        diff = x[i] - scale * F32(lv)
        err += qw[i] * diff * diff
    return err


@nb.njit(**EXACT_FLAGS)
def make_qp_quants(x, nmax, L, qw):
    # ggml's make_qp_quants: levels L in [0, nmax] of non-negative x ~ scale*L (sub-block
    # scales or mins), weighted by qw: the best of 9 inverse scales, then up to 5 passes
    # moving single levels while the weighted fit improves; -> scale
    n = x.size
    mx = F32(0.0)
    for i in range(n):
        mx = max(mx, x[i])
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F32(0.0)
    iscale = F32(nmax) / mx
    best_mse = qp_error(x, qw, nmax, iscale, L, False)
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (F32(0.1) * F32(step) + F32(nmax)) / mx
        mse = qp_error(x, qw, nmax, iscale_is, L, True)
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F32(0.0)
    suml2 = F32(0.0)
    for i in range(n):
        lv = min(nmax, nearest_int(iscale * x[i]))
        L[i] = lv & 0xFF
        sumlx += qw[i] * x[i] * F32(lv)
        suml2 += qw[i] * F32(lv) * F32(lv)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else F32(0.0)
