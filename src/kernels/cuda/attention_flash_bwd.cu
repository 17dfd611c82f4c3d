/* Flash attention backward on tensor cores (bf16 storage, fp32 accumulation), deterministic: no
 * atomics, every element of dqkv has one owner thread and a fixed summation order (but in the
 * atomic-dQ variant below). It recomputes
 * the probabilities twice instead of accumulating dQ with atomics (FlashAttention-2): 7 matrix
 * products per (query, key) tile instead of 5, in exchange for bitwise-reproducible gradients.
 * delta = rowsum(dout * out) is computed beforehand (attn_delta) into the caller's scratch.
 *
 * flash_bwd_dkdv: one CTA per (batch, kv head, block of BC = 64 keys); warp w owns keys
 *   16w .. 16w + 15 and accumulates their dK and dV in registers over the query heads of the group
 *   and the query blocks of BR queries at or after the key block (Q, dO, lse and delta
 *   double-buffered with cp.async). It computes the transposed tiles directly, keys as rows:
 *     S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T * scale * log2 e - lse * log2 e),
 *     dS^T = P^T (dP^T - delta), dV += P^T dO, dK += dS^T Q (times scale at the end),
 *   so that P^T and dS^T, packed to bf16, are already the A operands of the last two products.
 * flash_bwd_dkdvq (--attn flash-atomic; a->dq_accum set): flash_bwd_dkdv that also writes each
 *   step's dS^T, in bf16, to a shared tile, multiplies it by the CTA's K tile (dQ of the step's queries
 *   over the CTA's 64 keys, a 32 x 32 block per warp) and adds the result into the fp32 dq_accum with
 *   atomics; flash_bwd_dq_convert then scales it into dqkv. 5 products per tile; dK and dV are the
 *   same sums as flash_bwd_dkdv's, dQ's order of addition is not fixed.
 * flash_bwd_dq: one CTA per (batch, query head, block of 16 * MT * 4 queries); warp w owns 16 * MT
 *   queries, keeps their Q and dO fragments in registers and walks the key blocks up to the
 *   diagonal (K and V double-buffered): S = Q K^T, dP = dO V^T, dS = P (dP - delta),
 *   dQ += dS K (times scale at the end).
 * Each prefetch is issued right after the loop's one barrier, into the stage every warp has just
 * finished with. Causal masks are applied only on blocks that cross a warp's diagonal (and on the ragged last
 * query block: padding rows are zero-filled and their probabilities forced to 0). Outputs are
 * staged through the warp's own rows of a shared tile for 16-byte stores.
 *
 * Dropout (DROP = 1 variants) regenerates the forward's mask per tile (src/kernels/dropout.h):
 * with keep' = keep / (1 - p), dV uses keep' P and dS = P (keep' dP - delta), where delta =
 * rowsum(dout . out) is still sum_j (keep' P)_j dP_j because out was computed with the same mask.
 * dkdv draws a lane's keep bits for a 16-query step once (into one register) and uses them for
 * both products; dq masks dP in place.
 *
 * Sliding window (a.window > 0): dkdv walks only the query blocks that some key of its block is in
 * the window of, dq starts at the window's first key block, and P is 0 for a key at or before its
 * query minus the window, as for a key after it. */
#include "attention_common.cuh"

/* Bounds of the register arrays (largest variant). */
#define BWD_D_MAX 128
#define BWD_BR_MAX 64 /* dkdv: queries per step */
#define BWD_BC_MAX 64 /* dq: keys per step */
#define BWD_MT_MAX 2  /* dq: m-tiles per warp */
#define DQ_WARPS 4
#define DKDV_WARPS 4 /* BC = 64 keys per CTA */

/* ---- dK, dV ---------------------------------------------------------------------------------- */

/* Issues the cp.async copies of step `it` (query head hh = it / nq of the group, query block
 * qb0 + it % nq) into stage st: Q and dO tiles, lse and delta rows. */
static __device__ __forceinline__ void dkdv_load_step(const attn_args a, int it, int st, int b, int kvh, int qb0,
                                                      int nq, uint32_t sq_a, uint32_t sdo_a, uint32_t slse_a,
                                                      uint32_t sdl_a, const int D, const int BR, const int NT,
                                                      int tid) {
    const int LD = D + 8, T = a.T;
    const int h = kvh * a.group + it / nq, q0 = (qb0 + it % nq) * BR;
    const bf16 *qg = (const bf16 *)a.qkv + ((long long)b * T + q0) * a.W + (long long)h * D;
    const bf16 *og = (const bf16 *)a.dout + (((long long)b * T + q0) * a.Hq + h) * D;
    attn_load_tile(sq_a + (uint32_t)st * BR * LD * 2, qg, a.W, BR, T - q0, D, LD, tid, NT);
    attn_load_tile(sdo_a + (uint32_t)st * BR * LD * 2, og, (long long)a.Hq * D, BR, T - q0, D, LD, tid, NT);
    const long long row = ((long long)b * a.Hq + h) * T;
    for (int i = tid; i < 2 * BR; i += NT) {
        const int j = i < BR ? i : i - BR, ok = q0 + j < T;
        const float *src = (i < BR ? a.lse : a.delta) + row + (ok ? q0 + j : 0);
        attn_cp_async4((i < BR ? slse_a : sdl_a) + (uint32_t)(st * BR + j) * 4, src, ok);
    }
}

static __device__ __forceinline__ void flash_bwd_dkdv_body(const attn_args a, const attn_dropout &dr, const int DROP,
                                                           const int D, const int BR, const int KVREG, const int DQ) {
    const int NT = DKDV_WARPS * 32, BC = 16 * DKDV_WARPS, LD = D + 8, LDS = BR + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sk = (bf16 *)smem;                 /* [BC][LD]; later dK staging */
    bf16 *sv = sk + BC * LD;                 /* [BC][LD]; later dV staging */
    bf16 *sq = sv + BC * LD;                 /* [2][BR][LD] */
    bf16 *sdo = sq + 2 * BR * LD;            /* [2][BR][LD] */
    float *slse = (float *)(sdo + 2 * BR * LD); /* [2][BR] */
    float *sdl = slse + 2 * BR;              /* [2][BR] */
    bf16 *sds = (bf16 *)(sdl + 2 * BR);      /* DQ: dS^T [BC][LDS], keys as rows */
    const uint32_t sk_a = attn_smem_addr(sk), sv_a = attn_smem_addr(sv), sq_a = attn_smem_addr(sq),
                   sdo_a = attn_smem_addr(sdo), slse_a = attn_smem_addr(slse), sdl_a = attn_smem_addr(sdl);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int T = a.T, b = blockIdx.x / a.Hkv, kvh = blockIdx.x % a.Hkv;
    /* Key blocks in launch order: the first ones see the most queries, so they start first. */
    const int k0 = blockIdx.y * BC;
    const bf16 *kg = (const bf16 *)a.qkv + ((long long)b * T + k0) * a.W + (long long)(a.Hq + kvh) * D;
    const bf16 *vg = kg + (long long)a.Hkv * D;
    /* Query blocks that hold some query >= k0: qb0 .. nqb - 1, for each of the group's heads; with a
     * sliding window only those with a query before k0 + BC - 1 + window. */
    const int qend = a.window ? min(T, k0 + BC - 1 + a.window) : T;
    const int qb0 = k0 / BR, nq = (qend + BR - 1) / BR - qb0, nit = a.group * nq;

    attn_load_tile(sk_a, kg, a.W, BC, T - k0, D, LD, tid, NT);
    attn_load_tile(sv_a, vg, a.W, BC, T - k0, D, LD, tid, NT);
    dkdv_load_step(a, 0, 0, b, kvh, qb0, nq, sq_a, sdo_a, slse_a, sdl_a, D, BR, NT, tid);
    attn_cp_async_commit();
    attn_cp_async_wait0();
    __syncthreads();

    const int wk = warp * 16, kw = k0 + wk; /* the warp's first key, in the tile and as an index */
    const uint32_t off_a = attn_lane_off_a(lane, LD), off_b = attn_lane_off_b(lane, LD);
    const uint32_t off_b_ds = attn_lane_off_b(lane, LDS); /* DQ: dS^T's A fragments (.trans) */
    uint32_t kf[BWD_D_MAX / 16][4], vf[BWD_D_MAX / 16][4];
    if (KVREG) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            attn_ldsm_x4(kf[kk], sk_a + attn_at(wk, kk * 16, LD) + off_a);
            attn_ldsm_x4(vf[kk], sv_a + attn_at(wk, kk * 16, LD) + off_a);
        }
    }
    float dk[BWD_D_MAX / 8][4], dv[BWD_D_MAX / 8][4];
    attn_zero_c(dk, D / 8);
    attn_zero_c(dv, D / 8);

    for (int it = 0; it < nit; it++) {
        const int st = it & 1, q0 = (qb0 + it % nq) * BR;
        /* Step it has landed; after the barrier stage st^1 is free (as in the forward). */
        attn_cp_async_wait0();
        __syncthreads();
        if (it + 1 < nit) {
            dkdv_load_step(a, it + 1, st ^ 1, b, kvh, qb0, nq, sq_a, sdo_a, slse_a, sdl_a, D, BR, NT, tid);
            attn_cp_async_commit();
        }

        /* Skip when every query of the block is before every key of the warp, or past every key's
         * window (warp-uniform). */
        const int active = q0 + BR - 1 >= kw && (!a.window || q0 <= kw + 14 + a.window);
        if (DQ && !active) { /* the warp's rows of dS^T are zeros for the CTA's dQ product */
            const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++) attn_stage_half(sds + wk * LDS, g + 8 * r, nt * 8 + 2 * c, LDS, zero, r, 1.0f);
        }
        if (active) {
            const uint32_t sqb = sq_a + (uint32_t)st * BR * LD * 2, sdob = sdo_a + (uint32_t)st * BR * LD * 2;
            float s[BWD_BR_MAX / 8][4], dp[BWD_BR_MAX / 8][4];
            attn_zero_c(s, BR / 8);
            attn_zero_c(dp, BR / 8);

            /* S^T = K Q^T and dP^T = V dO^T: Q and dO are stored [query][dim] = [n][k]. */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t ka[4], va[4];
                if (KVREG) {
#pragma unroll
                    for (int i = 0; i < 4; i++) ka[i] = kf[kk][i], va[i] = vf[kk][i];
                } else {
                    attn_ldsm_x4(ka, sk_a + attn_at(wk, kk * 16, LD) + off_a);
                    attn_ldsm_x4(va, sv_a + attn_at(wk, kk * 16, LD) + off_a);
                }
#pragma unroll
                for (int np = 0; np < BR / 16; np++) {
                    attn_mma_ntile_pair<0>(&s, np, &ka, 1, sqb + attn_at(np * 16, kk * 16, LD) + off_b);
                    attn_mma_ntile_pair<0>(&dp, np, &va, 1, sdob + attn_at(np * 16, kk * 16, LD) + off_b);
                }
            }

            /* Keep bits: bit 4 nt + e for element [nt][e] (nt = 2 np + query half, e = 2 key half +
             * e1), from the group (i7 = 2c + e1, j7 = g) of query tile np. */
            unsigned keep = 0;
            if (DROP) {
                const int h = kvh * a.group + it / nq, jb = kw >> 4;
                const int64_t sample = dr.drop.sample_base + b;
#pragma unroll
                for (int np = 0; np < BR / 16; np++) {
                    const int ib = (q0 >> 4) + np;
                    if (jb > ib) continue; /* every query before every key: P is 0 */
#pragma unroll
                    for (int e1 = 0; e1 < 2; e1++) {
                        const unsigned w = attn_drop_bits(dr, sample, h, ib, jb, 2 * c + e1, g);
                        keep |= ((w & 1u) << e1 | ((w >> 1) & 1u) << (2 + e1)) << (8 * np);
                        keep |= (((w >> 2) & 1u) << e1 | ((w >> 3) & 1u) << (2 + e1)) << (8 * np + 4);
                    }
                }
            }

            /* P^T and dS^T. Rows are keys kw + g (+8), columns queries q0 + 8 nt + 2c (+1). A key
             * after its query, or a padding query >= T, gets P = 0 (hence dS = 0). */
            const int need_mask = q0 < kw + 15 || q0 + BR > T || (a.window && q0 + BR - 1 >= kw + a.window);
            const float *lse_st = slse + st * BR, *dl_st = sdl + st * BR;
#pragma unroll
            for (int nt = 0; nt < BR / 8; nt++) {
                const float2 L = *(const float2 *)(lse_st + nt * 8 + 2 * c);
                const float2 Dl = *(const float2 *)(dl_st + nt * 8 + 2 * c);
                const float l2[2] = {L.x * ATTN_LOG2E, L.y * ATTN_LOG2E}, dl[2] = {Dl.x, Dl.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = attn_exp2(fmaf(s[nt][e], a.sl2, -l2[e & 1]));
                    if (need_mask) {
                        const int key = kw + g + (e >> 1) * 8, q = q0 + nt * 8 + 2 * c + (e & 1);
                        if (q < key || q >= T || (a.window && q - key >= a.window)) p = 0.0f;
                    }
                    if (DROP) {
                        const float k = (keep >> (4 * nt + e)) & 1u ? dr.drop.scale : 0.0f;
                        s[nt][e] = p * k;
                        dp[nt][e] = p * (dp[nt][e] * k - dl[e & 1]);
                    } else {
                        s[nt][e] = p;
                        dp[nt][e] = p * (dp[nt][e] - dl[e & 1]);
                    }
                }
            }

            /* DQ: dS^T in bf16 into the warp's rows of the shared tile, for the CTA's dQ product. */
            if (DQ) {
#pragma unroll
                for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
                    for (int r = 0; r < 2; r++) attn_stage_half(sds + wk * LDS, g + 8 * r, nt * 8 + 2 * c, LDS, dp[nt], r, 1.0f);
            }

            /* dV += P^T dO and dK += dS^T Q: dO and Q are [query][dim] = [k][n], read with .trans. */
#pragma unroll
            for (int kq = 0; kq < BR / 16; kq++) {
                uint32_t pa[4], da[4];
                attn_pack_a(pa, s[2 * kq], s[2 * kq + 1]);
                attn_pack_a(da, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
                for (int dd = 0; dd < D / 16; dd++) {
                    attn_mma_ntile_pair<1>(&dv, dd, &pa, 1, sdob + attn_at(kq * 16, dd * 16, LD) + off_a);
                    attn_mma_ntile_pair<1>(&dk, dd, &da, 1, sqb + attn_at(kq * 16, dd * 16, LD) + off_a);
                }
            }
        }
        if (DQ) {
            /* dQ[BR queries][D] += dS [BR][BC keys] K [BC][D] over the CTA's keys, each warp a 32 x 32
             * block of it (queries qw .., dims dw ..): dS is stored transposed ([key][query]), so its A
             * fragments come through ldmatrix .trans at lane_off_b's address; K is [k][n], read with
             * .trans as in dV += P^T dO. The fp32 sums go to a.dq_accum with atomics (in no fixed
             * order: this backward is not bitwise reproducible), two adjacent dims at a time. */
            __syncthreads();
            const int qw = (warp / (D / 32)) * 32, dw = (warp % (D / 32)) * 32, h = kvh * a.group + it / nq;
            float dq[2][4][4];
            attn_zero_c(dq[0], 4);
            attn_zero_c(dq[1], 4);
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t da[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    attn_ldsm_x4_t(da[mt], attn_smem_addr(sds) + attn_at(kk * 16, qw + mt * 16, LDS) + off_b_ds);
#pragma unroll
                for (int np = 0; np < 2; np++)
                    attn_mma_ntile_pair<1>(dq, np, da, 2, sk_a + attn_at(kk * 16, dw + np * 16, LD) + off_a);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int q = q0 + qw + mt * 16 + g + 8 * r;
                    if (q >= T) continue;
                    float *row = a.dq_accum + (((long long)b * T + q) * a.Hq + h) * D + dw + 2 * c;
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) attn_red_add2(row + nt * 8, dq[mt][nt][2 * r], dq[mt][nt][2 * r + 1]);
                }
        }
    }
    /* Epilogue: the warp's own 16 rows of sk / sv stage dK and dV; no other warp reads them after
     * the loop but the dQ product's (DQ: hence the barrier; with KVREG == 0 this warp does, up to
     * its last step, hence the __syncwarp). */
    if (DQ) __syncthreads();
    __syncwarp();
    bf16 *stk = sk + wk * LD, *stv = sv + wk * LD;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            attn_stage_half(stk, g + 8 * r, dt * 8 + 2 * c, LD, dk[dt], r, a.scale);
            attn_stage_half(stv, g + 8 * r, dt * 8 + 2 * c, LD, dv[dt], r, 1.0f);
        }
    __syncwarp();
    bf16 *dkg = (bf16 *)a.dqkv + ((long long)b * T + kw) * a.W + (long long)(a.Hq + kvh) * D;
    attn_store_rows(dkg, a.W, stk, 16, T - kw, D, LD, lane);
    attn_store_rows(dkg + (long long)a.Hkv * D, a.W, stv, 16, T - kw, D, LD, lane);
}

/* ---- dQ ---------------------------------------------------------------------------------------- */

static __device__ __forceinline__ void flash_bwd_dq_body(const attn_args a, const attn_dropout &dr, const int DROP,
                                                         const int D, const int MT, const int BC) {
    const int NT = DQ_WARPS * 32, BR = 16 * MT * DQ_WARPS, LD = D + 8, WR = 16 * MT;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sq = (bf16 *)smem;       /* [BR][LD]; later dQ staging */
    bf16 *sdo = sq + BR * LD;      /* [BR][LD] */
    bf16 *sk = sdo + BR * LD;      /* [2][BC][LD] */
    bf16 *sv = sk + 2 * BC * LD;   /* [2][BC][LD] */
    const uint32_t sq_a = attn_smem_addr(sq), sdo_a = attn_smem_addr(sdo), sk_a = attn_smem_addr(sk),
                   sv_a = attn_smem_addr(sv);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int T = a.T, bh = blockIdx.x, b = bh / a.Hq, h = bh % a.Hq, kvh = h / a.group;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BR; /* longest blocks first */
    const bf16 *qkv = (const bf16 *)a.qkv + (long long)b * T * a.W;
    const bf16 *qg = qkv + (long long)q0 * a.W + (long long)h * D;
    const bf16 *og = (const bf16 *)a.dout + (((long long)b * T + q0) * a.Hq + h) * D;
    const bf16 *kg = qkv + (long long)(a.Hq + kvh) * D;
    const bf16 *vg = qkv + (long long)(a.Hq + a.Hkv + kvh) * D;
    const int kend = min(q0 + BR, T), nkb = (kend + BC - 1) / BC;
    const int kb0 = a.window ? max(0, q0 - a.window + 1) / BC : 0; /* the window's first key block */

    attn_load_tile(sq_a, qg, a.W, BR, T - q0, D, LD, tid, NT);
    attn_load_tile(sdo_a, og, (long long)a.Hq * D, BR, T - q0, D, LD, tid, NT);
    attn_load_tile(sk_a, kg + (long long)kb0 * BC * a.W, a.W, BC, T - kb0 * BC, D, LD, tid, NT);
    attn_load_tile(sv_a, vg + (long long)kb0 * BC * a.W, a.W, BC, T - kb0 * BC, D, LD, tid, NT);
    attn_cp_async_commit();
    attn_cp_async_wait0();
    __syncthreads();

    const int wrow = warp * WR, wr0 = q0 + wrow;
    const uint32_t off_a = attn_lane_off_a(lane, LD), off_b = attn_lane_off_b(lane, LD);
    uint32_t qf[BWD_MT_MAX][BWD_D_MAX / 16][4], of[BWD_MT_MAX][BWD_D_MAX / 16][4];
    float l2[BWD_MT_MAX][2], dl[BWD_MT_MAX][2], dq[BWD_MT_MAX][BWD_D_MAX / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            attn_ldsm_x4(qf[mt][kk], sq_a + attn_at(wrow + mt * 16, kk * 16, LD) + off_a);
            attn_ldsm_x4(of[mt][kk], sdo_a + attn_at(wrow + mt * 16, kk * 16, LD) + off_a);
        }
        /* Padding rows (>= T) get lse = delta = 0: with zero Q and dO their dS is exactly 0. */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = wr0 + mt * 16 + g + 8 * r, ok = row < T;
            l2[mt][r] = ok ? a.lse[(long long)bh * T + row] * ATTN_LOG2E : 0.0f;
            dl[mt][r] = ok ? a.delta[(long long)bh * T + row] : 0.0f;
        }
        attn_zero_c(dq[mt], D / 8);
    }

    for (int kb = kb0; kb < nkb; kb++) {
        const int st = (kb - kb0) & 1, k0 = kb * BC;
        attn_kv_step(kb, nkb, st, k0, sk_a, sv_a, kg, vg, a.W, T, BC, D, LD, tid, NT);

        if (k0 <= wr0 + WR - 1 && (!a.window || k0 + BC - 1 > wr0 - a.window)) {
            const uint32_t skb = sk_a + (uint32_t)st * BC * LD * 2, svb = sv_a + (uint32_t)st * BC * LD * 2;
            float s[BWD_MT_MAX][BWD_BC_MAX / 8][4], dp[BWD_MT_MAX][BWD_BC_MAX / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                attn_zero_c(s[mt], BC / 8);
                attn_zero_c(dp[mt], BC / 8);
            }

            /* S = Q K^T, dP = dO V^T: K and V are stored [key][dim] = [n][k]. Not two
             * attn_mma_ntile_pair: the two products share one m-tile loop here, and splitting it
             * reorders the ldmatrix and mma instructions (different machine code for 3 of 4 dq
             * kernels). */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
                for (int np = 0; np < BC / 16; np++) {
                    uint32_t kb4[4], vb4[4];
                    attn_ldsm_x4(kb4, skb + attn_at(np * 16, kk * 16, LD) + off_b);
                    attn_ldsm_x4(vb4, svb + attn_at(np * 16, kk * 16, LD) + off_b);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        attn_mma_x2(s[mt], np, qf[mt][kk], kb4);
                        attn_mma_x2(dp[mt], np, of[mt][kk], vb4);
                    }
                }

            /* Dropout: dP = keep' dP, with the forward's lane layout (queries as rows). */
            if (DROP) {
                const float sc = dr.drop.scale;
                attn_drop_rows(dp, dr, dr.drop.sample_base + b, h, wr0, k0, MT, BC, g, c,
                               [sc](float &x, unsigned keep) { x *= keep ? sc : 0.0f; });
            }

            /* dS = P (dP - delta), P = exp2(S * scale * log2 e - lse * log2 e); keys after the row
             * get P = 0. */
            const int need_mask = k0 + BC - 1 > wr0;
            const int need_window = a.window && k0 <= wr0 + WR - 1 - a.window;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float p = attn_exp2(fmaf(s[mt][nt][e], a.sl2, -l2[mt][e >> 1]));
                        if (need_mask && attn_key_after_query(wr0 + mt * 16, k0 + nt * 8, e, g, c)) p = 0.0f;
                        if (need_window && attn_key_before_window(wr0 + mt * 16, k0 + nt * 8, e, g, c, a.window))
                            p = 0.0f;
                        s[mt][nt][e] = p * (dp[mt][nt][e] - dl[mt][e >> 1]);
                    }

            /* dQ += dS K: K is [key][dim] = [k][n]. */
            uint32_t da[BWD_MT_MAX][4];
            attn_mma_packed_kn(dq, s, da, MT, BC, D, skb, off_a, LD);
        }
    }

    /* Epilogue: the warp's own rows of sq (read only by it, at the start) stage dQ. */
    __syncwarp();
    bf16 *stage = sq + wrow * LD;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                attn_stage_half(stage, mt * 16 + g + 8 * r, dt * 8 + 2 * c, LD, dq[mt][dt], r, a.scale);
    __syncwarp();
    bf16 *dqg = (bf16 *)a.dqkv + ((long long)b * T + wr0) * a.W + (long long)h * D;
    attn_store_rows(dqg, a.W, stage, WR, T - wr0, D, LD, lane);
}

/* ---- variants and launch ------------------------------------------------------------------------ */

/* dkdv (D, BR, KVREG): D = 64 keeps the warp's K and V fragments in registers (re-reading them
 * measured 7% slower on H100); at D = 128 they do not fit beside the dK/dV accumulators, and 32
 * queries per step keep S^T and dP^T small enough not to spill. */
#define DKDV_D64 64, 64, 1
#define DKDV_D128 128, 32, 0
/* The same tiles with dQ accumulated by atomics in the dK/dV kernel (attn_tc_backward with
 * dq_accum): 5 products per tile instead of 7; its dQ product is a 32 x 32 block per warp, which
 * takes BR x D = 4 x 32 x 32 (64 x 64, 32 x 128). */
#define DKDV_DQ_D64 64, 64, 1, 1
#define DKDV_DQ_D128 128, 32, 0, 1
/* dq (D, MT, BC): 32 queries per warp feed each K/V fragment to two m-tiles (at D = 64, 26% less
 * time on H100 than 16 queries per warp with 64-key blocks). */
#define DQ_D64 64, 2, 32
#define DQ_D128 128, 1, 32

ATTN_FLASH_KERNELS(flash_bwd_dkdv_body, DKDV_WARPS, flash_bwd_dkdv_d64, flash_bwd_dkdv_drop_d64, DKDV_D64, 0)
ATTN_FLASH_KERNELS(flash_bwd_dkdv_body, DKDV_WARPS, flash_bwd_dkdv_d128, flash_bwd_dkdv_drop_d128, DKDV_D128, 0)
ATTN_FLASH_KERNELS(flash_bwd_dkdv_body, DKDV_WARPS, flash_bwd_dkdvq_d64, flash_bwd_dkdvq_drop_d64, DKDV_DQ_D64)
ATTN_FLASH_KERNELS(flash_bwd_dkdv_body, DKDV_WARPS, flash_bwd_dkdvq_d128, flash_bwd_dkdvq_drop_d128, DKDV_DQ_D128)
ATTN_FLASH_KERNELS(flash_bwd_dq_body, DQ_WARPS, flash_bwd_dq_d64, flash_bwd_dq_drop_d64, DQ_D64)
ATTN_FLASH_KERNELS(flash_bwd_dq_body, DQ_WARPS, flash_bwd_dq_d128, flash_bwd_dq_drop_d128, DQ_D128)

/* Shared memory: K and V tiles, two stages of Q and dO tiles and of lse and delta rows; with DQ the
 * dS^T tile. */
static int dkdv_smem(int D, int BR, int KVREG, int DQ = 0) {
    return (2 * 16 * DKDV_WARPS + 4 * BR) * (D + 8) * 2 + 4 * BR * 4 + (DQ ? 16 * DKDV_WARPS * (BR + 8) * 2 : 0);
}
static int dq_br(int D, int MT, int BC) { return 16 * MT * DQ_WARPS; }
/* Shared memory: Q and dO tiles, two stages of K and V. */
static int dq_smem(int D, int MT, int BC) { return (2 * 16 * MT * DQ_WARPS + 4 * BC) * (D + 8) * 2; }

/* dqkv's q part = bf16(dq_accum * scale): the atomic-dQ backward's last step, 4 elements a thread. */
static __global__ void flash_bwd_dq_convert(const attn_args a) {
    const long long n4 = (long long)a.B * a.T * a.Hq * a.D / 4, row4 = (long long)a.Hq * a.D / 4;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        const float4 v = ((const float4 *)a.dq_accum)[i];
        const long long bt = i / row4, j = (i % row4) * 4;
        uint2 w = make_uint2(attn_pack(v.x * a.scale, v.y * a.scale), attn_pack(v.z * a.scale, v.w * a.scale));
        *(uint2 *)((bf16 *)a.dqkv + bt * a.W + j) = w;
    }
}

/* The atomic-dQ backward: zero dq_accum, one kernel for dK, dV and dQ's sums, then the conversion. */
static int attn_tc_backward_dq_atomic(const attn_args *a, const attn_dropout *dr, cudaStream_t s) {
    const int d64 = a->D == 64, kv_threads = DKDV_WARPS * 32, kv_bc = 16 * DKDV_WARPS;
    const int smem = d64 ? dkdv_smem(DKDV_DQ_D64) : dkdv_smem(DKDV_DQ_D128);
    const int nkb = (a->T + kv_bc - 1) / kv_bc;
    if (nkb > 65535) return -1;
    const size_t accum = (size_t)a->B * a->T * a->Hq * a->D * sizeof(float);
    cudaError_t e = cudaMemsetAsync(a->dq_accum, 0, accum, s);
    if (e != cudaSuccess) fsdp_fatal("flash attention backward: cudaMemsetAsync of dQ's sums (%zu bytes) failed: %s",
                                     accum, cudaGetErrorString(e));
    const dim3 grid((unsigned)(a->B * a->Hkv), (unsigned)nkb);
    attn_launch(d64 ? flash_bwd_dkdvq_d64 : flash_bwd_dkdvq_d128, d64 ? "flash_bwd_dkdvq_d64" : "flash_bwd_dkdvq_d128",
                d64 ? flash_bwd_dkdvq_drop_d64 : flash_bwd_dkdvq_drop_d128,
                d64 ? "flash_bwd_dkdvq_drop_d64" : "flash_bwd_dkdvq_drop_d128", grid, kv_threads, smem, a, dr, s);
    const long long n4 = (long long)a->B * a->T * a->Hq * a->D / 4;
    const unsigned blocks = (unsigned)(n4 / 256 + 1 < 8192 ? n4 / 256 + 1 : 8192);
    flash_bwd_dq_convert<<<blocks, 256, 0, s>>>(*a);
    attn_check_launch("flash_bwd_dq_convert");
    return 0;
}

int attn_tc_backward(const attn_args *a, const attn_dropout *dr, cudaStream_t s) {
    if (a->D != 64 && a->D != 128) return -1;
    if (a->dq_accum) return attn_tc_backward_dq_atomic(a, dr, s);
    const int d64 = a->D == 64;
    const int kv_threads = DKDV_WARPS * 32, kv_bc = 16 * DKDV_WARPS;
    const int kv_smem = d64 ? dkdv_smem(DKDV_D64) : dkdv_smem(DKDV_D128);
    const int q_br = d64 ? dq_br(DQ_D64) : dq_br(DQ_D128);
    const int q_smem = d64 ? dq_smem(DQ_D64) : dq_smem(DQ_D128);
    const int nkb = (a->T + kv_bc - 1) / kv_bc, nqb = (a->T + q_br - 1) / q_br;
    if (nkb > 65535 || nqb > 65535) return -1;
    const dim3 kv_grid((unsigned)(a->B * a->Hkv), (unsigned)nkb), q_grid((unsigned)(a->B * a->Hq), (unsigned)nqb);
    attn_launch(d64 ? flash_bwd_dkdv_d64 : flash_bwd_dkdv_d128, d64 ? "flash_bwd_dkdv_d64" : "flash_bwd_dkdv_d128",
                d64 ? flash_bwd_dkdv_drop_d64 : flash_bwd_dkdv_drop_d128,
                d64 ? "flash_bwd_dkdv_drop_d64" : "flash_bwd_dkdv_drop_d128", kv_grid, kv_threads, kv_smem, a, dr, s);
    attn_launch(d64 ? flash_bwd_dq_d64 : flash_bwd_dq_d128, d64 ? "flash_bwd_dq_d64" : "flash_bwd_dq_d128",
                d64 ? flash_bwd_dq_drop_d64 : flash_bwd_dq_drop_d128,
                d64 ? "flash_bwd_dq_drop_d64" : "flash_bwd_dq_drop_d128", q_grid, DQ_WARPS * 32, q_smem, a, dr, s);
    return 0;
}
