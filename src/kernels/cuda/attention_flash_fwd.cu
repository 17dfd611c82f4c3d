/* Flash attention forward on tensor cores (bf16 storage, fp32 accumulation), FlashAttention-2
 * style: one CTA of four warps owns BR = 64 * MT consecutive queries of one (batch, query head);
 * each warp owns 16 * MT of those rows, keeps their Q fragments, the output accumulator and the
 * running max / sum in registers, and walks the key blocks of BC keys up to the diagonal. K and V
 * tiles are double-buffered in shared memory with cp.async, so the next block lands while this one
 * is multiplied.
 *
 * Per key block and warp: S = Q K^T (mma, fp32), mask only where the block crosses the warp's
 * diagonal, online softmax in the exp2 domain with the scale folded into one FFMA, then the
 * probabilities are packed to bf16 in registers as the A operand of O += P V. At the end out =
 * O / l (bf16, staged through shared memory for 16-byte stores) and lse = ln(sum exp(scaled
 * scores)) = (m + log2 l) * ln 2.
 *
 * Head-dimension variants are separate kernels that call one force-inlined body with constant
 * tile parameters; its register arrays are sized for the largest variant and shrink to what the
 * constants touch once the loops unroll.
 *
 * Dropout (DROP = 1 variants): after the online softmax, the probabilities a lane holds are
 * zeroed where the mask drops them, before they become P V's A operand; l keeps the undropped sum
 * (lse stays the softmax's) and 1 / (1 - p) joins 1 / l in the epilogue. The lane's 8 elements of
 * a 16 x 16 tile are two whole Philox groups (src/kernels/dropout.h), and tiles wholly above the
 * diagonal draw nothing.
 *
 * Sliding window (a.window > 0): the key walk starts at the block of the first key any row of the
 * CTA sees, a warp skips blocks wholly before its rows' windows, and keys at or before a row's
 * query minus the window are masked like keys after it. A row with nothing visible in a block
 * keeps m = -inf (or its max) and adds zeros. */
#include "attention_common.cuh"

#define FWD_WARPS 4
/* Bounds of the register arrays (largest variant). */
#define FWD_MT_MAX 2
#define FWD_BC_MAX 64
#define FWD_D_MAX 128

static __device__ __forceinline__ void flash_fwd_body(const attn_args a, const attn_dropout &dr, const int DROP,
                                                      const int D, const int MT, const int BC, const int QREG) {
    const int NT = FWD_WARPS * 32, BR = 16 * MT * FWD_WARPS, LD = D + 8, WR = 16 * MT; /* WR rows per warp */
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sq = (bf16 *)smem;        /* [BR][LD]; later the output staging area */
    bf16 *sk = sq + BR * LD;        /* [2][BC][LD] */
    bf16 *sv = sk + 2 * BC * LD;    /* [2][BC][LD] */
    const uint32_t sq_a = attn_smem_addr(sq), sk_a = attn_smem_addr(sk), sv_a = attn_smem_addr(sv);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int T = a.T, bh = blockIdx.x, b = bh / a.Hq, h = bh % a.Hq, kvh = h / a.group;
    /* The longest query blocks (most key blocks) are scheduled first. */
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;
    const bf16 *qkv = (const bf16 *)a.qkv + (long long)b * T * a.W;
    const bf16 *qg = qkv + (long long)q0 * a.W + (long long)h * D;
    const bf16 *kg = qkv + (long long)(a.Hq + kvh) * D;
    const bf16 *vg = qkv + (long long)(a.Hq + a.Hkv + kvh) * D;

    /* Keys 0 .. min(q0 + BR, T) - 1 can be seen by some row of this block; with a sliding window
     * none before q0 - window + 1, so the walk starts at that key's block kb0. */
    const int kend = min(q0 + BR, T), nkb = (kend + BC - 1) / BC;
    const int kb0 = a.window ? max(0, q0 - a.window + 1) / BC : 0;

    attn_load_tile(sq_a, qg, a.W, BR, T - q0, D, LD, tid, NT);
    attn_load_tile(sk_a, kg + (long long)kb0 * BC * a.W, a.W, BC, T - kb0 * BC, D, LD, tid, NT);
    attn_load_tile(sv_a, vg + (long long)kb0 * BC * a.W, a.W, BC, T - kb0 * BC, D, LD, tid, NT);
    attn_cp_async_commit();
    attn_cp_async_wait0();
    __syncthreads();

    const int wrow = warp * WR;    /* first row of this warp inside the block */
    const int wr0 = q0 + wrow;     /* ... and as a query index */
    const uint32_t off_a = attn_lane_off_a(lane, LD), off_b = attn_lane_off_b(lane, LD);

    /* Q fragments stay in registers (QREG) or are re-read from the warp's rows of sq per block. */
    uint32_t qf[FWD_MT_MAX][FWD_D_MAX / 16][4];
    if (QREG) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                attn_ldsm_x4(qf[mt][kk], sq_a + attn_at(wrow + mt * 16, kk * 16, LD) + off_a);
    }

    float o[FWD_MT_MAX][FWD_D_MAX / 8][4];
    float m[FWD_MT_MAX][2], l[FWD_MT_MAX][2]; /* per row g (index 0) and g + 8 (index 1) of each m-tile */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        attn_zero_c(o[mt], D / 8);
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int kb = kb0; kb < nkb; kb++) {
        const int st = (kb - kb0) & 1, k0 = kb * BC;
        attn_kv_step(kb, nkb, st, k0, sk_a, sv_a, kg, vg, a.W, T, BC, D, LD, tid, NT);

        /* Skip the block when every key is after every row of this warp, or before every row's
         * window (warp-uniform). */
        if (k0 <= wr0 + WR - 1 && (!a.window || k0 + BC - 1 > wr0 - a.window)) {
            const uint32_t skb = sk_a + (uint32_t)st * BC * LD * 2, svb = sv_a + (uint32_t)st * BC * LD * 2;
            float s[FWD_MT_MAX][FWD_BC_MAX / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) attn_zero_c(s[mt], BC / 8);

            /* S = Q K^T: K is stored [key][dim] = [n][k], so its B fragments need no transpose. */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[FWD_MT_MAX][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (QREG) {
#pragma unroll
                        for (int i = 0; i < 4; i++) qa[mt][i] = qf[mt][kk][i];
                    } else {
                        attn_ldsm_x4(qa[mt], sq_a + attn_at(wrow + mt * 16, kk * 16, LD) + off_a);
                    }
                }
#pragma unroll
                for (int np = 0; np < BC / 16; np++)
                    attn_mma_ntile_pair<0>(s, np, qa, MT, skb + attn_at(np * 16, kk * 16, LD) + off_b);
            }

            /* Causal mask, only when some key of the block is after some row of the warp; the
             * window's, only when some key is at or before some row's window. */
            if (k0 + BC - 1 > wr0) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (attn_key_after_query(wr0 + mt * 16, k0 + nt * 8, e, g, c)) s[mt][nt][e] = -INFINITY;
            }
            if (a.window && k0 <= wr0 + WR - 1 - a.window) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (attn_key_before_window(wr0 + mt * 16, k0 + nt * 8, e, g, c, a.window))
                                s[mt][nt][e] = -INFINITY;
            }

            /* Online softmax. m is kept in the scaled exp2 domain; l is this thread's partial sum
             * over its columns (the quad's four partials are added once, at the end). */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < BC / 8; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m[mt][r], mx * a.sl2);
                    /* A row with nothing visible yet keeps m = -inf; subtract 0 then so that
                     * exp2(-inf - -inf) never makes a NaN. */
                    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                    const float alpha = attn_exp2(m[mt][r] - m_use);
                    m[mt][r] = m_new;
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < BC / 8; nt++) {
                        const float p0 = attn_exp2(fmaf(s[mt][nt][2 * r], a.sl2, -m_use));
                        const float p1 = attn_exp2(fmaf(s[mt][nt][2 * r + 1], a.sl2, -m_use));
                        s[mt][nt][2 * r] = p0;
                        s[mt][nt][2 * r + 1] = p1;
                        sum += p0 + p1;
                    }
                    l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
                    for (int dt = 0; dt < D / 8; dt++) {
                        o[mt][dt][2 * r] *= alpha;
                        o[mt][dt][2 * r + 1] *= alpha;
                    }
                }

            /* Dropout: dropped P = 0 (1 / (1 - p) joins 1 / l in the epilogue). */
            if (DROP)
                attn_drop_rows(s, dr, dr.drop.sample_base + b, h, wr0, k0, MT, BC, g, c,
                               [](float &p, unsigned keep) { p = keep ? p : 0.0f; });

            /* O += P V: V is stored [key][dim] = [k][n]. */
            uint32_t pa[FWD_MT_MAX][4];
            attn_mma_packed_kn(o, s, pa, MT, BC, D, svb, off_a, LD);
        }
    }

    /* Epilogue. Every row of a warp saw at least its own diagonal key, so l > 0 for real rows. The
     * warp's own Q rows in shared memory (read only by this warp) stage its output. */
    __syncwarp();
    bf16 *stage = sq + wrow * LD;
    float *lse = a.lse_out + (long long)bh * T;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[mt][r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            const float inv = DROP ? dr.drop.scale / lt : 1.0f / lt;
            const int row = mt * 16 + g + r * 8; /* inside the warp's rows */
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) attn_stage_half(stage, row, dt * 8 + 2 * c, LD, o[mt][dt], r, inv);
            if (c == 0 && wr0 + row < T) lse[wr0 + row] = (m[mt][r] + __log2f(lt)) * ATTN_LN2;
        }
    __syncwarp();
    attn_store_rows((bf16 *)a.o + (((long long)b * T + wr0) * a.Hq + h) * D, (long long)a.Hq * D, stage, WR,
                    T - wr0, D, LD, lane);
}

/* Tile shapes (D, MT, BC, QREG) of each variant. Both take 128 queries per CTA (32 rows per warp),
 * so that each K/V fragment read from shared memory feeds two m-tiles (measured on H100: at D = 128
 * this is 16% faster than 16 rows per warp). At D = 128 the 128 accumulator registers leave no room
 * for Q's 64, so Q is re-read from shared memory, and key blocks are 32 wide. */
#define FWD_D64 64, 2, 64, 1
#define FWD_D128 128, 2, 32, 0

ATTN_FLASH_KERNELS(flash_fwd_body, FWD_WARPS, flash_fwd_d64, flash_fwd_drop_d64, FWD_D64)
ATTN_FLASH_KERNELS(flash_fwd_body, FWD_WARPS, flash_fwd_d128, flash_fwd_drop_d128, FWD_D128)

/* Shared memory of a variant: the Q tile and two stages of K and V. */
static int fwd_smem(int D, int MT, int BC, int QREG) { return (16 * MT * FWD_WARPS + 4 * BC) * (D + 8) * 2; }
/* Queries per CTA. */
static int fwd_br(int D, int MT, int BC, int QREG) { return 16 * MT * FWD_WARPS; }

int attn_tc_forward(const attn_args *a, const attn_dropout *dr, cudaStream_t s) {
    if (a->D != 64 && a->D != 128) return -1;
    const int br = a->D == 64 ? fwd_br(FWD_D64) : fwd_br(FWD_D128);
    const int smem = a->D == 64 ? fwd_smem(FWD_D64) : fwd_smem(FWD_D128);
    const int nqb = (a->T + br - 1) / br;
    if (nqb > 65535) return -1;
    const dim3 grid((unsigned)(a->B * a->Hq), (unsigned)nqb), block(FWD_WARPS * 32);
    const int d64 = a->D == 64;
    attn_launch(d64 ? flash_fwd_d64 : flash_fwd_d128, d64 ? "flash_fwd_d64" : "flash_fwd_d128",
                d64 ? flash_fwd_drop_d64 : flash_fwd_drop_d128, d64 ? "flash_fwd_drop_d64" : "flash_fwd_drop_d128",
                grid, (int)block.x, smem, a, dr, s);
    return 0;
}
