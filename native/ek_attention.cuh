// Attention of one query head over one layer's ring, any cache type for K and for V,
// read in place (ek_kv_element), with an online softmax (one pass over the slots: the
// running maximum m, the running sum l of exp(score - m), and the weighted sum of V,
// rescaled whenever m grows). A slot is visible to a query at position qp when it holds a
// position p with 0 <= p <= qp and, on a sliding-window layer, qp - p < window: the ring's
// slot positions decide, so wrapped rings, shifted (re-rotated) keys and streamed-out slots
// need nothing else. GQA: query head h reads KV head h / (n_heads / n_kv).
//
// At depth one warp per head walking every slot leaves most of the GPU idle: split
// attention gives each warp a range of slots (ek_attend_slots with `partial`) and merges the
// ranges' records (ek_attend_merge), as flash-decoding does.
//
// Written once for a group of lanes W that share the work: on the device a warp (32 lanes,
// each owning the dims lane, lane + 32, ...; scores summed across the warp), on the host
// one lane owning every dim (tests/test_cuda.py runs it against a float64 reference).
#pragma once
#include "ek_kv.cuh"

#define EK_MAX_HEAD_DIM 256

#ifdef __CUDACC__
// the lanes of a warp (each owning the dims lane, lane + 32, ...)
struct ek_warp {
    static constexpr int lanes = EK_WARP;
    __device__ int lane() const { return threadIdx.x % EK_WARP; }
    __device__ float sum(float v) const { return ek_warp_sum(v); }
    __device__ float exp(float x) const { return expf(x); }
};
#endif

EK_HD bool ek_visible(int p, int qp, int window) { return p >= 0 && p <= qp && (window == 0 || qp - p < window); }

struct ek_attend_args {
    const float* q;         // [hd_k], the query head (scale not applied)
    const ek_u8* k;         // [cap, row_bytes_k]: the KV head's K rows
    const ek_u8* v;         // [cap, row_bytes_v]
    const int* slot_pos;    // [cap], -1: empty
    int n_slots, qp, window, type_k, type_v, hd_k, hd_v, row_bytes_k, row_bytes_v;
    float scale;
    float* out;             // [hd_v]
    // a calibrated K type's f32 rows of the first positions, read instead of the ring's for a
    // slot holding position p < n_sinks: sink[p * hd_k ...] (null and 0: none)
    const float* sink;
    int n_sinks;
};

// dim d of a cached key: its f32 sink row where it has one (a calibrated K type's first
// positions: sink_row not null), else its ring row in the cache type
EK_HD float ek_key(int type_k, const ek_u8* k_row, const float* sink_row, int d) {
    return sink_row ? sink_row[d] : ek_kv_element(type_k, k_row, d);
}

// the sink row of a slot holding position p, or null
EK_HD const float* ek_sink_row(const float* sink, int n_sinks, int hd_k, int p) {
    return p >= 0 && p < n_sinks ? sink + (ek_u64)p * hd_k : nullptr;
}

// the score of slot s (visible or not): q . K[s] * scale, q this lane's dims of the query
template <class W>
EK_HD float ek_score(const W& w, const ek_attend_args& a, const float* q, int s) {
    constexpr int per_lane = (EK_MAX_HEAD_DIM + W::lanes - 1) / W::lanes;
    const ek_u8* k_row = a.k + (ek_u64)s * a.row_bytes_k;
    const float* sink_row = ek_sink_row(a.sink, a.n_sinks, a.hd_k, a.slot_pos[s]);
    float part = 0.0f;
    for (int i = 0; i < per_lane; ++i) {
        const int d = w.lane() + i * W::lanes;
        if (d < a.hd_k) part += q[i] * ek_key(a.type_k, k_row, sink_row, d);
    }
    return w.sum(part) * a.scale;
}

// the online softmax over slots [s0, s1): the running maximum m, sum l and this lane's
// dims of the weighted sum of V (acc), updated in place
template <class W>
EK_HD void ek_attend_range(const W& w, const ek_attend_args& a, int s0, int s1, const float* q, float* acc,
                           float& m, float& l) {
    constexpr int per_lane = (EK_MAX_HEAD_DIM + W::lanes - 1) / W::lanes;
    for (int s = s0; s < s1; ++s) {
        if (!ek_visible(a.slot_pos[s], a.qp, a.window)) continue;
        const float score = ek_score(w, a, q, s);
        const float m_new = score > m ? score : m;
        const float corr = w.exp(m - m_new), p = w.exp(score - m_new);
        l = l * corr + p;
        m = m_new;
        const ek_u8* v_row = a.v + (ek_u64)s * a.row_bytes_v;
        for (int i = 0; i < per_lane; ++i) {
            const int d = w.lane() + i * W::lanes;
            if (d < a.hd_v) acc[i] = acc[i] * corr + p * ek_kv_element(a.type_v, v_row, d);
        }
    }
}

#define EK_NO_SCORE (-3.402823466e38f)

// slots [s0, s1) of a head: out[d] = acc[d] / l (all of them: a.n_slots; no visible slot:
// zeros, which a whole pass never meets), or with `partial` the unnormalised record
// {m, l, acc[hd_v]} that ek_attend_merge combines with the other slot ranges' (split
// attention at depth: many warps per head instead of one walking every slot)
template <class W>
EK_HD void ek_attend_slots(const W& w, const ek_attend_args& a, int s0, int s1, bool partial) {
    constexpr int per_lane = (EK_MAX_HEAD_DIM + W::lanes - 1) / W::lanes;
    float q[per_lane], acc[per_lane];
    for (int i = 0; i < per_lane; ++i) {
        const int d = w.lane() + i * W::lanes;
        q[i] = d < a.hd_k ? a.q[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = EK_NO_SCORE, l = 0.0f;
    ek_attend_range(w, a, s0, s1, q, acc, m, l);
    const float inv = partial ? 1.0f : l > 0.0f ? 1.0f / l : 0.0f;
    float* out = partial ? a.out + 2 : a.out;
    for (int i = 0; i < per_lane; ++i) {
        const int d = w.lane() + i * W::lanes;
        if (d < a.hd_v) out[d] = acc[i] * inv;
    }
    if (partial && w.lane() == 0) {
        a.out[0] = m;
        a.out[1] = l;
    }
}

template <class W>
EK_HD void ek_attend_head(const W& w, const ek_attend_args& a) {
    ek_attend_slots(w, a, 0, a.n_slots, false);
}

// out[hd_v] from n_parts records {m, l, acc[hd_v]} (stride 2 + hd_v) of one head's slot
// ranges: sum(acc_i e^(m_i - M)) / sum(l_i e^(m_i - M)), M the largest m of a range that
// saw a slot
template <class W>
EK_HD void ek_attend_merge(const W& w, const float* parts, int n_parts, int hd_v, float* out) {
    const int stride = 2 + hd_v;
    float top = EK_NO_SCORE;
    for (int j = 0; j < n_parts; ++j) {
        const float* r = parts + (ek_u64)j * stride;
        if (r[1] > 0.0f && r[0] > top) top = r[0];
    }
    float l = 0.0f;
    for (int j = 0; j < n_parts; ++j) {
        const float* r = parts + (ek_u64)j * stride;
        if (r[1] > 0.0f) l += r[1] * w.exp(r[0] - top);
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = w.lane(); d < hd_v; d += W::lanes) {
        float sum = 0.0f;
        for (int j = 0; j < n_parts; ++j) {
            const float* r = parts + (ek_u64)j * stride;
            if (r[1] > 0.0f) sum += r[2 + d] * w.exp(r[0] - top);
        }
        out[d] = sum * inv;
    }
}

// The `keep` policy's tallies (edgekv/heavy_hitters.py): each slot's softmax weight, summed
// over the queries and the query heads of its KV head. Two passes, since a weight needs its
// row's whole sum: each (query, head)'s {m, l} over the visible slots (ek_attend_slots'
// partial record with no V dims: hd_v = 0), then ek_tally_slot sums exp(score - m) / l for
// one slot, its K row read once.

struct ek_tally_args {
    const float* q;         // [n_tok, n_heads, hd_k]
    const int* q_pos;       // [n_tok]
    const ek_u8* k;         // [cap, row_bytes_k]: the KV head's K rows
    const int* slot_pos;    // [cap]
    const float* stats;     // [n_tok, n_heads, 2]: each head's {m, l} over the visible slots
    int n_tok, n_heads, group, kv, window, type_k, hd_k, row_bytes_k;
    float scale;
    const float* sink;      // as ek_attend_args'
    int n_sinks;
};

// slot s's softmax weight summed over the queries that see it and KV head kv's query heads
template <class W>
EK_HD float ek_tally_slot(const W& w, const ek_tally_args& t, int s) {
    constexpr int per_lane = (EK_MAX_HEAD_DIM + W::lanes - 1) / W::lanes;
    const int p = t.slot_pos[s];
    if (p < 0) return 0.0f;
    float key[per_lane];
    const ek_u8* k_row = t.k + (ek_u64)s * t.row_bytes_k;
    const float* sink_row = ek_sink_row(t.sink, t.n_sinks, t.hd_k, p);
    for (int i = 0; i < per_lane; ++i) {
        const int d = w.lane() + i * W::lanes;
        key[i] = d < t.hd_k ? ek_key(t.type_k, k_row, sink_row, d) : 0.0f;
    }
    float sum = 0.0f;
    for (int tok = 0; tok < t.n_tok; ++tok) {
        if (!ek_visible(p, t.q_pos[tok], t.window)) continue;
        for (int g = 0; g < t.group; ++g) {
            const ek_u64 head = (ek_u64)tok * t.n_heads + t.kv * t.group + g;
            const float* q = t.q + head * t.hd_k;
            float part = 0.0f;
            for (int i = 0; i < per_lane; ++i) {
                const int d = w.lane() + i * W::lanes;
                if (d < t.hd_k) part += q[d] * key[i];
            }
            const float score = w.sum(part) * t.scale, m = t.stats[2 * head], l = t.stats[2 * head + 1];
            if (l > 0.0f) sum += w.exp(score - m) / l;
        }
    }
    return sum;
}
