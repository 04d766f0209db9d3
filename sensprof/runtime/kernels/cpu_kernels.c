/* Compiled CPU versions of the reference kernels (reference.py), same layouts, loaded by cpu_kernels.py.
 *
 * Why C: the PyTorch reference pays one full pass over the cache per op (unpack, scale, matmul, softmax);
 * here one pass unpacks each token's bit-planes into registers and uses them at once, for every query head
 * of the KV head. Plain C with ctypes (no torch headers) compiles in well under a second.
 *
 * Layouts (reference.py): bit-planes [bits, B, H, T, D/8] uint8; keys per channel: scale / zero
 * [B, H, T/G, D] fp16; values per token: scale / zero [B, H, T, D/g] fp16. Strides are in elements, and
 * the last dim of every tensor is contiguous. Quantization is bit-exact with the reference: it is built
 * with -ffp-contract=off and no fast-math, so (x - mn) * inv + 0.5 rounds as PyTorch rounds it.
 *
 * Decode attention has two paths: sp_decode_attention, the fused loops of the KIVI layouts above (scales folded
 * into the query and the softmax weights), and sp_decode_packed, any layout contract.PackedRead describes (bit-
 * planes or fp8 bytes, a code table or an affine offset, fp16 / fp32 parameters of any group and stride, keys
 * stored before RoPE), dequantizing a token row or a tile of SP_VBLOCK tokens at a time into a per-thread scratch.
 * Both take a read mask, and share the split-K cut, the threads (run_job) and the log-sum-exp merge (run_decode).
 *
 * Every exported (non-static) function is declared in cpu_kernels.py's SIGNATURES table, parameter for
 * parameter; a test compares the two. SP_ABI_VERSION is written there too, and a library that reports another
 * version is refused on load.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t SPREAD[256]; /* byte -> 8 bytes, byte i = bit i */
#define SP_VBLOCK 64 /* value tokens whose weights are computed together */
#define SP_MAXTHREADS 64
/* (sequences x KV heads x tokens) below which one thread is quicker: waking the pthread pool costs more than
 * handing items to OpenMP threads still spinning after torch's last op (measured with a torch matmul before each
 * call; benchmarks/results/2026-12-01-cpu-runtime-night.md) */
#define SP_PARALLEL_WORK 1536
#define SP_PARALLEL_WORK_OPENMP 256
#define SP_ABI_VERSION 6      /* = ABI_VERSION in cpu_kernels.py: bump both whenever an exported signature changes */

int sp_abi_version(void) { return SP_ABI_VERSION; }

static void pool_after_fork(void);

void sp_init(void) {
    static int forks_handled = 0;
    for (int b = 0; b < 256; b++) {
        uint64_t w = 0;
        for (int i = 0; i < 8; i++) w |= (uint64_t)((b >> i) & 1) << (8 * i);
        SPREAD[b] = w;
    }
    if (!forks_handled) forks_handled = pthread_atfork(NULL, NULL, pool_after_fork) == 0;
}

#ifdef __F16C__
#include <immintrin.h>
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, f;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* zero or subnormal: m * 2^-24 */
        return sign ? -v : v;
    }
    f = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
    float out;
    memcpy(&out, &f, 4);
    return out;
}
#endif

static inline uint16_t f2h(float x) { /* round to nearest even, as torch's .half() */
    uint32_t f;
    memcpy(&f, &x, 4);
    uint32_t sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0)); /* inf, nan */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                                  /* overflow */
    if (a < 0x38800000u) {                                                                     /* subnormal */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a - 0x38000000u) >> 13), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* codes of one token: bits planes, plane stride ps, nb bytes per plane -> c[8 * nb] as floats */
static inline void unpack_row(const uint8_t *p, int64_t ps, int bits, int64_t nb, float *c) {
    for (int64_t j = 0; j < nb; j++) {
        uint64_t w = 0;
        for (int k = 0; k < bits; k++) w |= SPREAD[p[k * ps + j]] << k;
        uint8_t b8[8];
        memcpy(b8, &w, 8);
        for (int i = 0; i < 8; i++) c[8 * j + i] = (float)b8[i];
    }
}

static inline void pack_row(const uint8_t *codes, int bits, int64_t nb, uint8_t *out, int64_t ps) {
    for (int k = 0; k < bits; k++)
        for (int64_t j = 0; j < nb; j++) {
            uint8_t v = 0;
            for (int i = 0; i < 8; i++) v |= (uint8_t)(((codes[8 * j + i] >> k) & 1) << i);
            out[k * ps + j] = v;
        }
}

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SP_AVX2 1
#define SP_MAXREP 8 /* query heads per KV head whose accumulators stay in registers */

static inline __m256 unpack8(const uint8_t *p, int64_t ps, int bits) { /* 8 codes as floats */
    uint64_t w = 0;
    for (int k = 0; k < bits; k++) w |= SPREAD[p[k * ps]] << k;
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)w)));
}

static inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline __m256 exp8(__m256 x) { /* Cephes expf: 2^n * poly(r), within 2 ulp; x below -87 (-inf) gives 0 */
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), live);
}
#endif

/* x[i] = exp(x[i] - max x) in place; returns the sum, and the max in *max_out. Masked scores are -inf (weight 0);
 * when every score is masked, every weight and the sum are 0 (the max stays -inf, which the merge reads as empty). */
static float softmax_unnormalised(float *x, int64_t n, float *max_out) {
    float mx = -INFINITY, sum = 0.0f;
    int64_t i = 0;
    for (int64_t k = 0; k < n && mx == -INFINITY; k++) mx = x[k] > mx ? x[k] : mx;
    if (mx == -INFINITY) {
        for (int64_t k = 0; k < n; k++) x[k] = 0.0f;
        *max_out = mx;
        return 0.0f;
    }
    mx = -INFINITY;
#ifdef SP_AVX2
    if (n >= 8) {
        __m256 m = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
        mx = hmax(m);
    }
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum(acc);
#else
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    i = 0;
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    *max_out = mx;
    return sum;
}

/* scores of the tokens [t0, t1) of one key group: s[r * n + t] = (base[r] + qs[r] . codes[t]) * scaling */
static void key_scores_generic(const uint8_t *kp, int64_t ts, int64_t ps, int bits, int64_t D, int64_t rep,
                               int64_t n, int64_t t0, int64_t t1, const float *qs, const float *base, float scaling,
                               float *s, float *c) {
    for (int64_t t = t0; t < t1; t++) {
        unpack_row(kp + t * ts, ps, bits, D / 8, c);
        for (int64_t r = 0; r < rep; r++) s[r * n + t] = (base[r] + dot(qs + r * D, c, D)) * scaling;
    }
}

/* acc[r] += w[(r * ng + group) * SP_VBLOCK + t - t0] * codes[t] for the value tokens [t0, t1) */
static void values_generic(const uint8_t *vp, int64_t ts, int64_t ps, int bits, int64_t D, int64_t gv, int64_t rep,
                           int64_t t0, int64_t t1, const float *w, float *acc, float *c) {
    const int64_t ng = D / gv;
    for (int64_t t = t0; t < t1; t++) {
        unpack_row(vp + t * ts, ps, bits, D / 8, c);
        for (int64_t r = 0; r < rep; r++)
            for (int64_t grp = 0; grp < ng; grp++) {
                const float wg = w[(r * ng + grp) * SP_VBLOCK + t - t0];
                float *a = acc + r * D + grp * gv;
                const float *cg = c + grp * gv;
#pragma omp simd
                for (int64_t i = 0; i < gv; i++) a[i] += wg * cg[i];
            }
    }
}

#ifdef SP_AVX2
/* The same loops with the query-head count REP a constant after inlining (one switch case per count), so
 * the per-head accumulators live in registers rather than memory. */
static inline __attribute__((always_inline)) void key_scores_avx2(
    const uint8_t *kp, int64_t ts, int64_t ps, int bits, int64_t D, const int REP, int64_t n, int64_t t0,
    int64_t t1, const float *qs, const float *base, float scaling, float *s) {
    for (int64_t t = t0; t < t1; t++) {
        __m256 acc[SP_MAXREP];
        for (int r = 0; r < REP; r++) acc[r] = _mm256_setzero_ps();
        const uint8_t *row = kp + t * ts;
        for (int64_t j = 0; j < D / 8; j++) {
            const __m256 cv = unpack8(row + j, ps, bits);
            for (int r = 0; r < REP; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + r * D + 8 * j), cv, acc[r]);
        }
        for (int r = 0; r < REP; r++) s[r * n + t] = (base[r] + hsum(acc[r])) * scaling;
    }
}

/* values, eight channels at a time over the block of tokens (accumulators stay in registers) */
static inline __attribute__((always_inline)) void values_avx2(
    const uint8_t *vp, int64_t ts, int64_t ps, int bits, int64_t D, int64_t gv, const int REP, int64_t t0,
    int64_t t1, const float *w, float *acc) {
    const int64_t ng = D / gv;
    for (int64_t j = 0; j < D / 8; j++) {
        const int64_t grp = j / (gv / 8);
        __m256 a[SP_MAXREP];
        for (int r = 0; r < REP; r++) a[r] = _mm256_loadu_ps(acc + r * D + 8 * j);
        const uint8_t *col = vp + j;
        for (int64_t t = t0; t < t1; t++) {
            const __m256 cv = unpack8(col + t * ts, ps, bits);
            const float *wt = w + grp * SP_VBLOCK + t - t0;
            for (int r = 0; r < REP; r++) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(wt + r * ng * SP_VBLOCK), cv, a[r]);
        }
        for (int r = 0; r < REP; r++) _mm256_storeu_ps(acc + r * D + 8 * j, a[r]);
    }
}

/* one case per query-head count (a constant after inlining), each ended by END */
#define SP_REP_CASES(CALL, END)                                                                              \
    case 1: CALL(1); END;                                                                                    \
    case 2: CALL(2); END;                                                                                    \
    case 3: CALL(3); END;                                                                                    \
    case 4: CALL(4); END;                                                                                    \
    case 5: CALL(5); END;                                                                                    \
    case 6: CALL(6); END;                                                                                    \
    case 7: CALL(7); END;                                                                                    \
    case 8: CALL(8); END;
#define SP_FOR_REP(CALL)                                                                                     \
    switch (rep) { SP_REP_CASES(CALL, return) }
#endif

static void key_scores(const uint8_t *kp, const int64_t *kcs, int bits, int64_t D, int64_t rep, int64_t n,
                       int64_t t0, int64_t t1, const float *qs, const float *base, float scaling, float *s, float *c) {
#ifdef SP_AVX2
#define SP_KEYS(R) key_scores_avx2(kp, kcs[3], kcs[0], bits, D, R, n, t0, t1, qs, base, scaling, s)
    SP_FOR_REP(SP_KEYS)
#undef SP_KEYS
#endif
    key_scores_generic(kp, kcs[3], kcs[0], bits, D, rep, n, t0, t1, qs, base, scaling, s, c);
}

static void value_accumulate(const uint8_t *vp, const int64_t *vcs, int bits, int64_t D, int64_t gv, int64_t rep,
                             int64_t t0, int64_t t1, const float *w, float *acc, float *c) {
#ifdef SP_AVX2
    if (gv % 8 == 0) {
#define SP_VALUES(R) values_avx2(vp, vcs[3], vcs[0], bits, D, gv, R, t0, t1, w, acc)
        SP_FOR_REP(SP_VALUES)
#undef SP_VALUES
    }
#endif
    values_generic(vp, vcs[3], vcs[0], bits, D, gv, rep, t0, t1, w, acc, c);
}

/* Any layout (contract.PackedRead): value[b, h, t, d] = lut[code] * scale[b, h, t / tg, d / cg] + zero[same], the
 * codes bit-planes [bits, B, H, T, D/8] or bytes [B, H, T, D] (last dim contiguous), scale / zero fp16 or fp32
 * with any strides (0 for a constant), rope (cos, sin) float32 [B, T, R/2] for keys stored before RoPE.
 * cpu_kernels.py passes one as pointers [codes, lut, scale, zero, cos, sin] (zero, cos, sin may be NULL) and
 * int64 fields indexed by the SP_R_* names below (strides in elements); `offset` is used when SP_R_AFFINE is set
 * (lut[c] = c - offset, computed rather than looked up). */
enum {
    SP_R_BYTES, SP_R_BITS, SP_R_TG, SP_R_CG, SP_R_AFFINE, SP_R_SCALE32, SP_R_ZERO32, SP_R_ROPE, /* R, 0 = none */
    SP_R_CS = 8,  /* code strides: plane (0 for bytes), batch, head, token */
    SP_R_SS = 12, /* scale strides: batch, head, token group, channel group */
    SP_R_ZS = 16, /* zero strides */
    SP_R_RS = 20, /* cos / sin strides: batch, token (the last dim contiguous) */
    SP_R_FP8 = 22, /* the table is fp8's own (1: e4m3fn, 2: e5m2): the bytes convert through fp16, no gather */
    SP_R_WORD = 23, /* the scale is vLLM's int4 fp32 word (one per token and head): zero-point code in its low 4 bits */
    SP_R_DENSE = 24, /* the codes are the values (an unquantized side): 1 fp32, 2 fp16, 3 bf16; code strides in bytes */
    SP_R_WIDE = 25,  /* channels below it have one more code bit, plane `bits`; the others read lut[2^(bits+1) + c] */
    SP_R_FIELDS = 26
};

#define SP_MAXCHUNKS 128 /* head dims up to 1024 on the generic path */
typedef struct {
    const uint8_t *codes;
    const float *lut, *cos, *sin;
    const char *scale, *zero;
    int bytes, bits, affine, fp8, s32, z32, smode, zmode, word, dense, special; /* smode / zmode: how 8 channels'
                                                                                * parameters load; special: dense,
                                                                                * wide (raw8) */
    int64_t tg, cg, R, cs[4], ss[4], zs[4], rs[2], wide;
    uint64_t narrow; /* wide reads: 2^(bits+1) in every byte, the second codebook's start */
    float offset;
    int64_t soff[SP_MAXCHUNKS], zoff[SP_MAXCHUNKS]; /* broadcast: each 8 channels' parameter offset in its row */
} read_t;

/* the 8 codes of channels 8j .. 8j+7 of the token whose codes start at c, a byte each (little-endian) */
static inline uint64_t plain_codes8(const read_t *r, const uint8_t *c, int64_t j) { /* bytes or planes */
    uint64_t w = 0;
    if (r->bytes)
        memcpy(&w, c + 8 * j, 8);
    else
        for (int k = 0; k < r->bits; k++) w |= SPREAD[c[k * r->cs[0] + j]] << k;
    return w;
}

static inline uint64_t codes8(const read_t *r, const uint8_t *c, int64_t j) { /* with a wide read's extra bit */
    const uint64_t w = plain_codes8(r, c, j);
    if (!r->wide) return w;
    return w | (8 * j < r->wide ? SPREAD[c[r->bits * r->cs[0] + j]] << r->bits : r->narrow);
}

/* vLLM's int4 word (contract.split_word): the scale is the word with its low 4 bits cleared, the zero -zp * scale */
static inline void word_params(const char *p, float *scale, float *zero) {
    uint32_t u, m;
    memcpy(&u, p, 4);
    m = u & ~(uint32_t)0xF;
    memcpy(scale, &m, 4);
    *zero = -(float)(u & 0xF) * *scale;
}

/* channel d of an unquantized row (SP_R_DENSE) as fp32 */
static inline float dense_value(const read_t *r, const uint8_t *c, int64_t d) {
    uint16_t x;
    if (r->dense == 1) return ((const float *)c)[d];
    memcpy(&x, c + 2 * d, 2);
    if (r->dense == 2) return h2f(x);
    const uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* a code's value before scaling: the affine offset or the table */
static inline float code_value(const read_t *r, uint8_t code) {
    return r->affine ? (float)code - r->offset : r->lut[code];
}

enum { SP_P_BROADCAST, SP_P_VECTOR, SP_P_EXPAND }; /* one parameter per 8 channels; 8 contiguous; anything else */

/* One decode step is cut into items, (sequence, KV head, slice of the packed tokens); the last slice of a
 * head also takes the full-precision tail. Each item leaves its unnormalised output with its softmax max and
 * sum, and the slices of a head are merged by log-sum-exp (split-K), so threads share even one long head.
 * mask (NULL = every token): uint8 [B, T + Tt], 0 = not read. `any` selects the generic path (reads k, v). */
typedef struct {
    int64_t B, Hq, H, D, T, Tt;
    const float *q;
    const uint8_t *kc, *vc;
    const int64_t *kcs, *kss, *kzs, *vcs, *vss, *vzs;
    const uint16_t *ks, *kz, *vs, *vz;
    const float *kt, *vt;
    int bits_k, bits_v;
    int64_t gk, gv, chunk, nsplit, items;
    float scaling;
    float *partial; /* [items, rep, D + 2]: unnormalised output, max, sum */
    int64_t next;   /* the next item to take (atomic) */
    int failed;
    const uint8_t *mask;
    int any;
    read_t k, v;
} job_t;

static size_t item_scratch(const job_t *j) {
    const int64_t rep = j->Hq / j->H, ng = j->D / j->gv;
    if (j->any) /* scores, q * scaling, accumulators, a tile, four expanded parameter rows, q * scale, q . zero,
                 * the zero-points' share per group */
        return sizeof(float) * (size_t)(rep * (j->chunk + j->Tt) + 3 * rep * j->D + SP_VBLOCK * j->D + 4 * j->D +
                                        rep * (j->D + 1));
    return sizeof(float) * (size_t)(rep * (j->chunk + j->Tt) + 3 * rep * j->D + j->D + rep * ng * (SP_VBLOCK + 1) + rep +
                                   2 * ng * SP_VBLOCK);
}

static void run_item(const job_t *j, int64_t item, float *buf) {
    const int64_t D = j->D, H = j->H, rep = j->Hq / H, ng = D / j->gv, gk = j->gk;
    const int64_t b = item / (H * j->nsplit), h = item / j->nsplit % H, sp = item % j->nsplit;
    const int64_t lo = sp * j->chunk, hi = lo + j->chunk < j->T ? lo + j->chunk : j->T;
    const int64_t m = hi - lo, tail = sp == j->nsplit - 1 ? j->Tt : 0, n = m + tail;
    float *s = buf, *qs = s + rep * n, *acc = qs + rep * D, *qz = acc + rep * D, *c = qz + rep * D,
          *zs = c + D, *base = zs + rep * ng, *w = base + rep, *fs = w + rep * ng * SP_VBLOCK,
          *fz = fs + ng * SP_VBLOCK;
    const float *qh = j->q + (b * j->Hq + h * rep) * D;
    const uint8_t *kp = j->kc + b * j->kcs[1] + h * j->kcs[2] + lo * j->kcs[3];
    const uint8_t *vp = j->vc + b * j->vcs[1] + h * j->vcs[2] + lo * j->vcs[3];
    /* scores over the packed keys: per group, q * scale and q . zero once, then one dot per token */
    for (int64_t g = lo / gk; g < hi / gk; g++) {
        const uint16_t *sc = j->ks + b * j->kss[0] + h * j->kss[1] + g * j->kss[2];
        const uint16_t *ze = j->kz + b * j->kzs[0] + h * j->kzs[1] + g * j->kzs[2];
        for (int64_t d = 0; d < D; d++) {
            c[d] = h2f(sc[d]);
            qz[d] = h2f(ze[d]);
        }
        for (int64_t r = 0; r < rep; r++) {
            const float *qr = qh + r * D;
            float *qsr = qs + r * D, z = 0.0f;
#pragma omp simd reduction(+ : z)
            for (int64_t d = 0; d < D; d++) {
                qsr[d] = qr[d] * c[d];
                z += qr[d] * qz[d];
            }
            base[r] = z;
        }
        key_scores(kp, j->kcs, j->bits_k, D, rep, n, g * gk - lo, (g + 1) * gk - lo, qs, base, j->scaling, s, c);
    }
    const float *kth = j->kt + (b * H + h) * j->Tt * D, *vth = j->vt + (b * H + h) * j->Tt * D;
    for (int64_t t = 0; t < tail; t++)
        for (int64_t r = 0; r < rep; r++) s[r * n + m + t] = dot(qh + r * D, kth + t * D, D) * j->scaling;
    if (j->mask) { /* tokens not read score -inf: weight 0 (their codes and scales are finite) */
        const uint8_t *mk = j->mask + b * (j->T + j->Tt);
        for (int64_t t = 0; t < n; t++)
            if (!mk[t < m ? lo + t : j->T + t - m])
                for (int64_t r = 0; r < rep; r++) s[r * n + t] = -INFINITY;
    }
    float *out = j->partial + item * rep * (D + 2);
    for (int64_t r = 0; r < rep; r++) /* exp(s - max), normalised after the merge */
        out[r * (D + 2) + D + 1] = softmax_unnormalised(s + r * n, n, out + r * (D + 2) + D);
    memset(acc, 0, sizeof(float) * (size_t)(rep * D));
    memset(zs, 0, sizeof(float) * (size_t)(rep * ng));
    /* values: per block of tokens, the weights p * scale, then the codes once per token for every query head */
    for (int64_t t0 = 0; t0 < m; t0 += SP_VBLOCK) {
        const int64_t t1 = t0 + SP_VBLOCK < m ? t0 + SP_VBLOCK : m;
        const int64_t mb = t1 - t0;
        for (int64_t t = 0; t < mb; t++) { /* this block's scales and zero-points, one row per group */
            const uint16_t *sc = j->vs + b * j->vss[0] + h * j->vss[1] + (lo + t0 + t) * j->vss[2];
            const uint16_t *ze = j->vz + b * j->vzs[0] + h * j->vzs[1] + (lo + t0 + t) * j->vzs[2];
            for (int64_t g = 0; g < ng; g++) {
                fs[g * SP_VBLOCK + t] = h2f(sc[g]);
                fz[g * SP_VBLOCK + t] = h2f(ze[g]);
            }
        }
        for (int64_t r = 0; r < rep; r++)
            for (int64_t g = 0; g < ng; g++) {
                const float *pr = s + r * n + t0, *fsg = fs + g * SP_VBLOCK, *fzg = fz + g * SP_VBLOCK;
                float *wr = w + (r * ng + g) * SP_VBLOCK, z = 0.0f;
#pragma omp simd reduction(+ : z)
                for (int64_t t = 0; t < mb; t++) {
                    wr[t] = pr[t] * fsg[t];
                    z += pr[t] * fzg[t];
                }
                zs[r * ng + g] += z;
            }
        value_accumulate(vp, j->vcs, j->bits_v, D, j->gv, rep, t0, t1, w, acc, c);
    }
    for (int64_t t = 0; t < tail; t++)
        for (int64_t r = 0; r < rep; r++) {
            const float p = s[r * n + m + t], *v = vth + t * D;
            float *a = acc + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) a[d] += p * v[d];
        }
    for (int64_t r = 0; r < rep; r++)
        for (int64_t d = 0; d < D; d++) out[r * (D + 2) + d] = acc[r * D + d] + zs[r * ng + d / j->gv];
}

/* ---- any layout: tiles of dequantized tokens in a per-thread scratch ---- */

static inline float param(const char *p, int f32, int64_t i) {
    return f32 ? ((const float *)p)[i] : h2f(((const uint16_t *)p)[i]);
}

/* The parameters of one token group for every channel (d / cg, any stride): out[D]. */
static void expand_params(const char *p, int f32, int64_t stride, int64_t cg, int64_t D, float *out) {
    if (cg == 1 && stride == 1 && f32) {
        memcpy(out, p, sizeof(float) * (size_t)D);
    } else if (cg == 1) {
        int64_t d = 0;
#if defined(SP_AVX2) && defined(__F16C__)
        if (stride == 1)
            for (; d + 8 <= D; d += 8) _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * d))));
#endif
        for (; d < D; d++) out[d] = param(p, f32, d * stride);
    } else {
        for (int64_t d = 0; d < D; d++) out[d] = param(p, f32, d / cg * stride);
    }
}

/* The scale and zero-point rows of token t's group (zp NULL without zero-points); ps / pz hold the expanded
 * parameters of the last group seen (*last: its scale row) where 8 channels' parameters are neither one value
 * nor 8 contiguous ones. */
static inline void row_params(const read_t *r, int64_t b, int64_t h, int64_t t, int64_t D, const char **sp,
                              const char **zp, float *ps, float *pz, const char **last) {
    const int64_t g = t / r->tg;
    *sp = r->scale + (b * r->ss[0] + h * r->ss[1] + g * r->ss[2]) * (r->s32 ? 4 : 2);
    *zp = r->zero ? r->zero + (b * r->zs[0] + h * r->zs[1] + g * r->zs[2]) * (r->z32 ? 4 : 2) : NULL;
    if (r->word) { /* decoded into the first slot of the expanded rows, read from there as fp32 */
        word_params(*sp, ps, pz);
        *sp = (const char *)ps, *zp = (const char *)pz;
        return;
    }
    if ((r->smode == SP_P_EXPAND || r->zmode == SP_P_EXPAND) && *sp != *last) {
        expand_params(*sp, r->s32, r->ss[3], r->cg, D, ps);
        if (*zp) expand_params(*zp, r->z32, r->zs[3], r->cg, D, pz);
        *last = *sp;
    }
}

#ifdef SP_AVX2
static inline __m256 param8(const char *p, int f32, int mode, int64_t off, int64_t j, const float *expanded) {
    if (mode == SP_P_BROADCAST) return _mm256_set1_ps(param(p, f32, off));
    if (mode == SP_P_VECTOR) {
        if (f32) return _mm256_loadu_ps((const float *)p + 8 * j);
#ifdef __F16C__
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * j)));
#else
        float x[8];
        for (int i = 0; i < 8; i++) x[i] = param(p, 0, 8 * j + i);
        return _mm256_loadu_ps(x);
#endif
    }
    return _mm256_loadu_ps(expanded + 8 * j);
}

/* the code values (table or affine) of channels 8j .. 8j+7 of the token whose codes start at c */
static inline __m256 lut8(const read_t *r, uint64_t codes) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)codes));
    return r->affine ? _mm256_sub_ps(_mm256_cvtepi32_ps(idx), _mm256_set1_ps(r->offset))
                     : _mm256_i32gather_ps(r->lut, idx, 4);
}

#ifdef __F16C__
/* fp8 bytes as fp16 bits: e5m2 is fp16's top byte; e4m3fn shifted in reads 2^-8 of its value */
static inline __m256 fp8_8(const read_t *r, const uint8_t *c, int64_t j) {
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(c + 8 * j)));
    if (r->fp8 == 2) return _mm256_cvtph_ps(_mm_slli_epi16(x, 8));
    const __m128i mag = _mm_and_si128(x, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
    return _mm256_blendv_ps(v, _mm256_set1_ps(NAN), nan); /* S.1111.111: e4m3fn's NaN */
}
#endif

/* raw8 for the rarer reads: wide codes and dense values */
static __m256 special8(const read_t *r, const uint8_t *c, int64_t j) {
    if (r->wide) return lut8(r, codes8(r, c, j));
    if (r->dense == 1) return _mm256_loadu_ps((const float *)c + 8 * j);
    if (r->dense == 3) /* bf16: the top half of an fp32 */
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)c + j)), 16));
#ifdef __F16C__
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)c + j)); /* fp16 */
#else
    float x[8];
    for (int i = 0; i < 8; i++) x[i] = dense_value(r, c, 8 * j + i);
    return _mm256_loadu_ps(x);
#endif
}

/* the code values (table or affine) of channels 8j .. 8j+7 of the token whose codes start at c: fp8 converted
 * without a gather; the rarer reads behind one predictable branch, off the common path */
static inline __m256 raw8(const read_t *r, const uint8_t *c, int64_t j) {
#ifdef __F16C__
    if (r->fp8) return fp8_8(r, c, j);
#endif
    if (__builtin_expect(r->special, 0)) return special8(r, c, j);
    return lut8(r, plain_codes8(r, c, j));
}

/* channels 8j .. 8j+7 of the token whose codes start at c, dequantized */
static inline __m256 dq8(const read_t *r, const uint8_t *c, int64_t j, const char *sp, const char *zp,
                         const float *ps, const float *pz) {
    const __m256 v = raw8(r, c, j);
    const __m256 sv = param8(sp, r->s32, r->smode, r->soff[j], j, ps);
    if (!zp) return _mm256_mul_ps(v, sv);
    return _mm256_fmadd_ps(v, sv, param8(zp, r->z32, r->zmode, r->zoff[j], j, pz));
}
#endif

/* Token t of the read (b, h) dequantized into row[D], RoPE applied. */
static void dequant_row(const read_t *r, int64_t b, int64_t h, int64_t t, int64_t D, float *row, float *ps,
                        float *pz, const char **last) {
    const uint8_t *c = r->codes + b * r->cs[1] + h * r->cs[2] + t * r->cs[3];
    const char *sp, *zp;
    row_params(r, b, h, t, D, &sp, &zp, ps, pz, last);
#ifdef SP_AVX2
    for (int64_t j = 0; j < D / 8; j++) _mm256_storeu_ps(row + 8 * j, dq8(r, c, j, sp, zp, ps, pz));
#else
    for (int64_t j = 0; j < D / 8; j++) {
        uint8_t b8[8];
        const uint64_t w = r->dense ? 0 : codes8(r, c, j);
        memcpy(b8, &w, 8);
        for (int i = 0; i < 8; i++) {
            const int64_t d = 8 * j + i, k = d / r->cg;
            const float v = r->dense ? dense_value(r, c, d) : code_value(r, b8[i]);
            const float sv = r->smode == SP_P_EXPAND ? ps[d] : param(sp, r->s32, k * r->ss[3]);
            const float zv = !zp ? 0.0f : (r->zmode == SP_P_EXPAND ? pz[d] : param(zp, r->z32, k * r->zs[3]));
            row[d] = v * sv + zv;
        }
    }
#endif
    if (r->R) { /* rotate-half RoPE over the first R channels, at this token's position */
        const int64_t half = r->R / 2;
        const float *cs = r->cos + b * r->rs[0] + t * r->rs[1], *sn = r->sin + b * r->rs[0] + t * r->rs[1];
#pragma omp simd
        for (int64_t d = 0; d < half; d++) {
            const float x1 = row[d], x2 = row[d + half];
            row[d] = x1 * cs[d] - x2 * sn[d];
            row[d + half] = x2 * cs[d] + x1 * sn[d];
        }
    }
}

/* Token t's key dequantized in registers straight into the REP scores s[r * n] (q * scaling in qs); returns 0 where
 * it does not apply (keys stored before RoPE: dequant_row, then row_scores; rotating in registers was slower). */
static inline __attribute__((always_inline)) int fused_key_scores(const read_t *r, int64_t b, int64_t h, int64_t t,
                                                                  int64_t D, const float *qs, const float *qsum,
                                                                  const int64_t REP, float *s, int64_t n, float *ps,
                                                                  float *pz, const char **last) {
#ifdef SP_AVX2
    if (REP <= SP_MAXREP && !r->R) {
        const uint8_t *c = r->codes + b * r->cs[1] + h * r->cs[2] + t * r->cs[3];
        const char *sp, *zp;
        row_params(r, b, h, t, D, &sp, &zp, ps, pz, last);
        __m256 acc[SP_MAXREP];
        for (int64_t i = 0; i < REP; i++) acc[i] = _mm256_setzero_ps();
        if (r->smode == SP_P_BROADCAST && r->cg >= D) { /* one scale per token and head: out of the sum */
            for (int64_t j = 0; j < D / 8; j++) {
                const __m256 v = raw8(r, c, j);
                for (int64_t i = 0; i < REP; i++)
                    acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + i * D + 8 * j), v, acc[i]);
            }
            const float sv = param(sp, r->s32, 0), zv = zp ? param(zp, r->z32, 0) : 0.0f;
            for (int64_t i = 0; i < REP; i++) s[i * n] = sv * hsum(acc[i]) + (zp ? zv * qsum[i] : 0.0f);
            return 1;
        }
        if (r->smode == SP_P_BROADCAST) { /* one scale (and zero-point) per `per` chunks */
            const int64_t per = r->cg / 8 < D / 8 ? r->cg / 8 : D / 8;
            for (int64_t j0 = 0; j0 < D / 8; j0 += per) {
                const __m256 sv = _mm256_set1_ps(param(sp, r->s32, r->soff[j0]));
                const __m256 zv = zp ? _mm256_set1_ps(param(zp, r->z32, r->zoff[j0])) : _mm256_setzero_ps();
                for (int64_t j = j0; j < j0 + per; j++) {
                    const __m256 v = _mm256_fmadd_ps(raw8(r, c, j), sv, zv);
                    for (int64_t i = 0; i < REP; i++)
                        acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + i * D + 8 * j), v, acc[i]);
                }
            }
        } else {
            for (int64_t j = 0; j < D / 8; j++) {
                const __m256 v = dq8(r, c, j, sp, zp, ps, pz);
                for (int64_t i = 0; i < REP; i++)
                    acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + i * D + 8 * j), v, acc[i]);
            }
        }
        for (int64_t i = 0; i < REP; i++) s[i * n] = hsum(acc[i]);
        return 1;
    }
#endif
    (void)r, (void)b, (void)h, (void)t, (void)D, (void)qs, (void)qsum, (void)REP, (void)s, (void)n, (void)ps, (void)pz,
        (void)last;
    return 0;
}

/* s[r * n] = qs[r] . row for the REP query heads (scaling already in qs) */
static inline __attribute__((always_inline)) void row_scores(const float *row, const float *qs, int64_t D,
                                                             const int64_t REP, float *s, int64_t n) {
#ifdef SP_AVX2
    if (REP <= SP_MAXREP) {
        __m256 acc[SP_MAXREP];
        for (int64_t r = 0; r < REP; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < D / 8; j++) {
            const __m256 v = _mm256_loadu_ps(row + 8 * j);
            for (int64_t r = 0; r < REP; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + r * D + 8 * j), v, acc[r]);
        }
        for (int64_t r = 0; r < REP; r++) s[r * n] = hsum(acc[r]);
        return;
    }
#endif
    for (int64_t r = 0; r < REP; r++) s[r * n] = dot(qs + r * D, row, D);
}

/* acc[r] += p[r * n + t] * tile[t] over the nt tokens of a tile */
static inline __attribute__((always_inline)) void tile_values(const float *tile, int64_t nt, const float *p,
                                                              int64_t n, int64_t D, const int64_t REP, float *acc) {
#ifdef SP_AVX2
    if (REP <= SP_MAXREP) {
        for (int64_t j = 0; j < D / 8; j++) {
            __m256 a[SP_MAXREP];
            for (int64_t r = 0; r < REP; r++) a[r] = _mm256_loadu_ps(acc + r * D + 8 * j);
            for (int64_t t = 0; t < nt; t++) {
                const __m256 v = _mm256_loadu_ps(tile + t * D + 8 * j);
                for (int64_t r = 0; r < REP; r++) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * n + t), v, a[r]);
            }
            for (int64_t r = 0; r < REP; r++) _mm256_storeu_ps(acc + r * D + 8 * j, a[r]);
        }
        return;
    }
#endif
    for (int64_t t = 0; t < nt; t++)
        for (int64_t r = 0; r < REP; r++) {
            const float w = p[r * n + t], *v = tile + t * D;
            float *a = acc + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) a[d] += w * v[d];
        }
}

/* Keys whose parameters hold for a group of tokens (per channel): per group, q * scale and q . zero once
 * (qf, base), then each token's code values against every query head: s[i * n] = base[i] + qf[i] . values. */
static inline __attribute__((always_inline)) void folded_key_scores(const read_t *r, const uint8_t *c, int64_t D,
                                                                    const float *qf, const float *base,
                                                                    const int64_t REP, float *s, int64_t n) {
#ifdef SP_AVX2
    if (REP <= SP_MAXREP) {
        __m256 acc[SP_MAXREP];
        for (int64_t i = 0; i < REP; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t j = 0; j < D / 8; j++) {
            const __m256 v = raw8(r, c, j);
            for (int64_t i = 0; i < REP; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qf + i * D + 8 * j), v, acc[i]);
        }
        for (int64_t i = 0; i < REP; i++) s[i * n] = base[i] + hsum(acc[i]);
        return;
    }
#endif
    float v[8 * SP_MAXCHUNKS];
    for (int64_t j = 0; j < D / 8; j++) {
        uint8_t b8[8];
        const uint64_t w = codes8(r, c, j);
        memcpy(b8, &w, 8);
        for (int i = 0; i < 8; i++) v[8 * j + i] = code_value(r, b8[i]);
    }
    for (int64_t i = 0; i < REP; i++) s[i * n] = base[i] + dot(qf + i * D, v, D);
}

#ifdef SP_AVX2
/* Values with one parameter per group of cg channels (cg a multiple of 8: per token, per head, per tensor):
 * acc[i] += sum over the tile's tokens of (p * scale) * values; p * zero-point summed per group in zs
 * (added once at the end). rows[t]: the codes of token t, NULL for a token not read. */
static inline __attribute__((always_inline)) void folded_values(const read_t *r, const uint8_t *const *rows,
                                                                int64_t nt, const float *w, int64_t D,
                                                                const int64_t REP, float *acc) {
    const int64_t ng = D / r->cg > 0 ? D / r->cg : 1, per = r->cg / 8 < D / 8 ? r->cg / 8 : D / 8;
    for (int64_t j = 0; j < D / 8; j++) {
        const int64_t g = j / per;
        __m256 a[SP_MAXREP];
        for (int64_t i = 0; i < REP; i++) a[i] = _mm256_loadu_ps(acc + i * D + 8 * j);
        for (int64_t t = 0; t < nt; t++) {
            if (!rows[t]) continue;
            const __m256 v = raw8(r, rows[t], j);
            const float *wt = w + g * SP_VBLOCK + t;
            for (int64_t i = 0; i < REP; i++) a[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(wt + i * ng * SP_VBLOCK), v, a[i]);
        }
        for (int64_t i = 0; i < REP; i++) _mm256_storeu_ps(acc + i * D + 8 * j, a[i]);
    }
}
#endif

#ifdef SP_AVX2 /* REP a constant where the accumulators fit in registers */
#define SP_ANY_FOR_REP(CALL)                                                                                 \
    switch (rep) {                                                                                           \
        SP_REP_CASES(CALL, break)                                                                            \
    default: CALL(rep);                                                                                      \
    }
#else
#define SP_ANY_FOR_REP(CALL) CALL(rep);
#endif

static void run_item_any(const job_t *j, int64_t item, float *buf) {
    const int64_t D = j->D, H = j->H, rep = j->Hq / H;
    const int64_t b = item / (H * j->nsplit), h = item / j->nsplit % H, sp = item % j->nsplit;
    const int64_t lo = sp * j->chunk, hi = lo + j->chunk < j->T ? lo + j->chunk : j->T;
    const int64_t m = hi > lo ? hi - lo : 0, tail = sp == j->nsplit - 1 ? j->Tt : 0, n = m + tail;
    float *s = buf, *qs = s + rep * n, *acc = qs + rep * D, *tile = acc + rep * D, *kps = tile + SP_VBLOCK * D,
          *kpz = kps + D, *vps = kpz + D, *vpz = vps + D, *qf = vpz + D, *base = qf + rep * D, *zs = base + rep;
    const read_t *kr = &j->k, *vr = &j->v;
    (void)vr, (void)zs; /* the folded value loop is AVX2 only */
    const char *klast = NULL, *vlast = NULL;
    const uint8_t *mk = j->mask ? j->mask + b * (j->T + j->Tt) : NULL;
    const float *qh = j->q + (b * j->Hq + h * rep) * D;
    for (int64_t i = 0; i < rep * D; i++) qs[i] = qh[i] * j->scaling;
    if (kr->tg == 1) /* base: each query head's channel sum, for keys whose zero-point is one per token and head */
        for (int64_t r = 0; r < rep; r++) {
            float z = 0.0f;
            for (int64_t d = 0; d < D; d++) z += qs[r * D + d];
            base[r] = z;
        }
    /* scores: a key row at a time (dequantized, rotated), against every query head of the KV head */
    int64_t kg = -1; /* the key group whose q * scale is in qf */
    for (int64_t t = 0; t < m; t++) {
        if (mk && !mk[lo + t]) {
            for (int64_t r = 0; r < rep; r++) s[r * n + t] = -INFINITY;
            continue;
        }
        if (kr->tg > 1 && !kr->R) {
            const int64_t g = (lo + t) / kr->tg;
            if (g != kg) {
                const char *sp = kr->scale + (b * kr->ss[0] + h * kr->ss[1] + g * kr->ss[2]) * (kr->s32 ? 4 : 2);
                expand_params(sp, kr->s32, kr->ss[3], kr->cg, D, kps);
                if (kr->zero) {
                    const char *zp = kr->zero + (b * kr->zs[0] + h * kr->zs[1] + g * kr->zs[2]) * (kr->z32 ? 4 : 2);
                    expand_params(zp, kr->z32, kr->zs[3], kr->cg, D, kpz);
                }
                for (int64_t r = 0; r < rep; r++) {
                    const float *qr = qs + r * D;
                    float *qfr = qf + r * D, z = 0.0f;
                    for (int64_t d = 0; d < D; d++) qfr[d] = qr[d] * kps[d];
                    if (kr->zero) z = dot(qr, kpz, D);
                    base[r] = z;
                }
                kg = g;
            }
            const uint8_t *c = kr->codes + b * kr->cs[1] + h * kr->cs[2] + (lo + t) * kr->cs[3];
#define SP_FOLDED(R) folded_key_scores(kr, c, D, qf, base, R, s + t, n)
            SP_ANY_FOR_REP(SP_FOLDED)
#undef SP_FOLDED
            continue;
        }
#define SP_FUSED(R) fused = fused_key_scores(&j->k, b, h, lo + t, D, qs, base, R, s + t, n, kps, kpz, &klast)
        int fused = 0;
        SP_ANY_FOR_REP(SP_FUSED)
#undef SP_FUSED
        if (fused) continue;
        dequant_row(&j->k, b, h, lo + t, D, tile, kps, kpz, &klast);
#define SP_SCORES(R) row_scores(tile, qs, D, R, s + t, n)
        SP_ANY_FOR_REP(SP_SCORES)
#undef SP_SCORES
    }
    const float *kth = j->kt + (b * H + h) * j->Tt * D, *vth = j->vt + (b * H + h) * j->Tt * D;
    for (int64_t t = 0; t < tail; t++)
        for (int64_t r = 0; r < rep; r++)
            s[r * n + m + t] = mk && !mk[j->T + t] ? -INFINITY : dot(qs + r * D, kth + t * D, D);
    float *out = j->partial + item * rep * (D + 2);
    for (int64_t r = 0; r < rep; r++) /* exp(s - max), normalised after the merge */
        out[r * (D + 2) + D + 1] = softmax_unnormalised(s + r * n, n, out + r * (D + 2) + D);
    memset(acc, 0, sizeof(float) * (size_t)(rep * D));
#ifdef SP_AVX2
    if (vr->smode == SP_P_BROADCAST && rep <= SP_MAXREP) { /* values: scales folded into the weights */
        const int64_t ng = D / vr->cg > 0 ? D / vr->cg : 1, cpg = vr->cg < D ? vr->cg : D;
        float *w = tile; /* rep * ng * SP_VBLOCK <= the tile's SP_VBLOCK * D (ng <= D / 8, rep <= 8) */
        const uint8_t *rows[SP_VBLOCK];
        memset(zs, 0, sizeof(float) * (size_t)(rep * ng));
        for (int64_t t0 = 0; t0 < m; t0 += SP_VBLOCK) {
            const int64_t nt = t0 + SP_VBLOCK < m ? SP_VBLOCK : m - t0;
            int64_t read = 0;
            for (int64_t t = 0; t < nt; t++) {
                const int64_t tt = lo + t0 + t, g = tt / vr->tg;
                if (mk && !mk[tt]) {
                    rows[t] = NULL;
                    for (int64_t i = 0; i < rep * ng; i++) w[i * SP_VBLOCK + t] = 0.0f;
                    continue;
                }
                rows[t] = vr->codes + b * vr->cs[1] + h * vr->cs[2] + tt * vr->cs[3];
                const char *sp = vr->scale + (b * vr->ss[0] + h * vr->ss[1] + g * vr->ss[2]) * (vr->s32 ? 4 : 2);
                const char *zp = vr->zero ? vr->zero + (b * vr->zs[0] + h * vr->zs[1] + g * vr->zs[2]) * (vr->z32 ? 4 : 2)
                                          : NULL;
                for (int64_t gi = 0; gi < ng; gi++) {
                    float sc, ze;
                    if (vr->word) {
                        word_params(sp, &sc, &ze);
                    } else {
                        sc = param(sp, vr->s32, gi * vr->ss[3]);
                        ze = zp ? param(zp, vr->z32, gi * vr->zs[3]) : 0.0f;
                    }
                    for (int64_t r = 0; r < rep; r++) {
                        const float pr = s[r * n + t0 + t];
                        w[(r * ng + gi) * SP_VBLOCK + t] = pr * sc;
                        zs[r * ng + gi] += pr * ze;
                    }
                }
                read++;
            }
            if (!read) continue;
#define SP_VALUES(R) folded_values(vr, rows, nt, w, D, R, acc)
            SP_ANY_FOR_REP(SP_VALUES)
#undef SP_VALUES
        }
        for (int64_t r = 0; r < rep; r++)
            for (int64_t d = 0; d < D; d++) acc[r * D + d] += zs[r * ng + d / cpg];
    } else
#endif
    /* values: tiles of SP_VBLOCK dequantized tokens (tokens not read: zero rows, weight 0) */
    for (int64_t t0 = 0; t0 < m; t0 += SP_VBLOCK) {
        const int64_t nt = t0 + SP_VBLOCK < m ? SP_VBLOCK : m - t0;
        int64_t read = 0;
        for (int64_t t = 0; t < nt; t++) {
            if (mk && !mk[lo + t0 + t]) {
                memset(tile + t * D, 0, sizeof(float) * (size_t)D);
                continue;
            }
            dequant_row(&j->v, b, h, lo + t0 + t, D, tile + t * D, vps, vpz, &vlast);
            read++;
        }
        if (!read) continue;
#define SP_VALUES(R) tile_values(tile, nt, s + t0, n, D, R, acc)
        SP_ANY_FOR_REP(SP_VALUES)
#undef SP_VALUES
    }
    if (tail) {
#define SP_TAIL(R) tile_values(vth, tail, s + m, n, D, R, acc)
        SP_ANY_FOR_REP(SP_TAIL)
#undef SP_TAIL
    }
    for (int64_t r = 0; r < rep; r++) memcpy(out + r * (D + 2), acc + r * D, sizeof(float) * (size_t)D);
}

static void worker(job_t *j) {
    float *buf = malloc(item_scratch(j));
    if (!buf) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (;;) {
        const int64_t item = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (item >= j->items) break;
        if (j->any)
            run_item_any(j, item, buf);
        else
            run_item(j, item, buf);
    }
    free(buf);
}

/* The worker threads. Built with OpenMP, a job runs on the OpenMP threads of the calling thread: in a torch process
 * those are torch's own (one libgomp is loaded, torch's), which spin for a while after each of torch's parallel ops
 * and so take a decode step's items at once; threads of our own would compete with those spinning workers for the
 * same cores (the C decode of a 1K-context step took 1.2-2.6x as long that way: benchmarks/results/
 * 2026-12-01-cpu-runtime-night.md). Without OpenMP, and in a forked child (libgomp's threads do not survive
 * fork()), the pthread pool below: one for the process, started on first need and grown to the largest count a call
 * asks for (Python passes torch.get_num_threads() with every call), so no call starts threads of its own. A job
 * hands out `tickets`; each idle worker takes one and runs the job's items until none is left. One job at a time: a
 * caller that finds the pool busy (another Python thread: ctypes releases the GIL) runs its items alone. None of
 * this changes a result: the items, and their merge, do not depend on which thread runs them. */
static struct {
    pthread_mutex_t lock, busy; /* lock guards the fields below; busy is held for a whole job */
    pthread_cond_t wake, done;
    int started, tickets, running; /* workers alive; tickets not yet taken; taken and not yet finished */
    job_t *job;
    int forked; /* this process is a forked child: OpenMP's threads are the parent's */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, 0, NULL, 0};

/* 1 where a job runs on OpenMP's threads, 0 on the pthread pool (cpu_kernels.threading()). */
int sp_threading(void) {
#ifdef _OPENMP
    return !pool.forked;
#else
    return 0;
#endif
}

static void pool_after_fork(void) { /* a forked child has only the forking thread: forget the parent's workers */
    pthread_mutex_init(&pool.lock, NULL);
    pthread_mutex_init(&pool.busy, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.started = pool.tickets = pool.running = 0;
    pool.job = NULL;
    pool.forked = 1;
}

static void *pool_worker(void *unused) {
    (void)unused;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (!pool.tickets) pthread_cond_wait(&pool.wake, &pool.lock);
        pool.tickets--;
        job_t *j = pool.job;
        pthread_mutex_unlock(&pool.lock);
        worker(j);
        pthread_mutex_lock(&pool.lock);
        if (!--pool.running) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* Grows the pool to n workers where threads can be started; returns how many there are. Holds pool.lock. */
static int pool_grow(int n) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* workers inherit it: signals stay with Python's threads */
    while (pool.started < n) {
        pthread_t t;
        if (pthread_create(&t, NULL, pool_worker, NULL)) break;
#ifdef __linux__
        pthread_setname_np(t, "sp-kernels");
#endif
        pthread_detach(t);
        pool.started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return pool.started;
}

/* Runs the job's items on this thread and on up to `helpers` pool workers; returns when every item is done. */
static void run_job(job_t *j, int helpers) {
#ifdef _OPENMP
    if (helpers >= 1 && sp_threading()) { /* the calling thread's OpenMP team: torch's own threads */
#pragma omp parallel num_threads(helpers + 1)
        worker(j);
        return;
    }
#endif
    if (helpers < 1 || pthread_mutex_trylock(&pool.busy)) {
        worker(j);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    const int n = pool_grow(helpers);
    pool.job = j;
    pool.tickets = pool.running = n < helpers ? n : helpers;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    worker(j); /* this thread works too, and finishes whatever the workers have not taken */
    pthread_mutex_lock(&pool.lock);
    while (pool.running) pthread_cond_wait(&pool.done, &pool.lock);
    pool.job = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

/* Cuts the job into items for `threads` threads (this one and the pool's; the cut depends on `threads` only, never
 * on how many workers run it: slices of `align` tokens), runs them and merges the slices of each head by
 * log-sum-exp into out [B, Hq, D]. Returns 0, or -1 without memory. */
static int run_decode(job_t *j, int64_t threads, int64_t align, float *out) {
    const int64_t B = j->B, H = j->H, T = j->T, D = j->D, rep = j->Hq / H;
    j->chunk = T, j->nsplit = 1, j->items = B * H;
    if (threads > SP_MAXTHREADS) threads = SP_MAXTHREADS;
    if (threads > 1 && B * H * T >= (sp_threading() ? SP_PARALLEL_WORK_OPENMP : SP_PARALLEL_WORK)) { /* ~4 items a thread */
        j->nsplit = (4 * threads + B * H - 1) / (B * H);
        j->chunk = ((T + j->nsplit - 1) / j->nsplit + align - 1) / align * align;
        j->nsplit = (T + j->chunk - 1) / j->chunk;
        j->items = B * H * j->nsplit;
    } else {
        threads = 1;
    }
    j->partial = malloc(sizeof(float) * (size_t)(j->items * rep * (D + 2)));
    if (!j->partial) return -1;
    run_job(j, (int)threads - 1);
    if (j->failed) {
        free(j->partial);
        return -1;
    }
    for (int64_t bh = 0; bh < B * H; bh++) /* merge the slices of each head by log-sum-exp */
        for (int64_t r = 0; r < rep; r++) {
            const float *p0 = j->partial + (bh * j->nsplit * rep + r) * (D + 2);
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t sp = 0; sp < j->nsplit; sp++) mx = fmaxf(mx, p0[sp * rep * (D + 2) + D]);
            float *o = out + (bh * rep + r) * D;
            for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
            for (int64_t sp = 0; sp < j->nsplit; sp++) {
                const float *p = p0 + sp * rep * (D + 2), f = p[D] == -INFINITY ? 0.0f : expf(p[D] - mx);
                sum += f * p[D + 1];
                for (int64_t d = 0; d < D; d++) o[d] += f * p[d];
            }
            for (int64_t d = 0; d < D; d++) o[d] /= sum; /* every token masked: 0 / 0, as the reference's softmax */
        }
    free(j->partial);
    return 0;
}

/* One query per sequence over the packed cache plus a full-precision tail (reference.decode_attention), KIVI
 * layouts: kcs / vcs: strides of [bits, B, H, T, D/8]; kss, kzs: [B, H, T/G, D]; vss, vzs: [B, H, T, D/g] fp16.
 * q [B, Hq, D], tails [B, H, Tt, D] fp32 contiguous; mask uint8 [B, T + Tt] or NULL; out [B, Hq, D]. Long contexts
 * are cut into items of whole key groups for `threads` threads. Returns 0, or -1 without memory. */
int sp_decode_attention(int64_t B, int64_t Hq, int64_t H, int64_t D, int64_t T, int64_t Tt, const float *q,
                        const uint8_t *kc, const int64_t *kcs, const uint16_t *ks, const int64_t *kss,
                        const uint16_t *kz, const int64_t *kzs, const uint8_t *vc, const int64_t *vcs,
                        const uint16_t *vs, const int64_t *vss, const uint16_t *vz, const int64_t *vzs,
                        const float *kt, const float *vt, const uint8_t *mask, int64_t bits_k, int64_t bits_v,
                        int64_t gk, int64_t gv, float scaling, float *out, int64_t threads) {
    job_t j = {B, Hq, H, D, T, Tt, q, kc, vc, kcs, kss, kzs, vcs, vss, vzs, ks, kz, vs, vz, kt, vt,
               (int)bits_k, (int)bits_v, gk, gv, T, 1, B * H, scaling, NULL, 0, 0, mask, 0, {0}, {0}};
    return run_decode(&j, threads, gk, out);
}

static void read_of(read_t *r, const void *const *ptrs, const int64_t *f, float offset, int64_t D) {
    memset(r, 0, sizeof(*r));
    r->codes = ptrs[0], r->lut = ptrs[1], r->scale = ptrs[2], r->zero = ptrs[3], r->cos = ptrs[4], r->sin = ptrs[5];
    r->bytes = (int)f[SP_R_BYTES], r->bits = (int)f[SP_R_BITS], r->affine = (int)f[SP_R_AFFINE];
    r->s32 = (int)f[SP_R_SCALE32], r->z32 = (int)f[SP_R_ZERO32];
    r->tg = f[SP_R_TG], r->cg = f[SP_R_CG], r->R = f[SP_R_ROPE], r->offset = offset;
    for (int i = 0; i < 4; i++) r->cs[i] = f[SP_R_CS + i], r->ss[i] = f[SP_R_SS + i], r->zs[i] = f[SP_R_ZS + i];
    r->rs[0] = f[SP_R_RS], r->rs[1] = f[SP_R_RS + 1];
#if defined(__F16C__)
    r->fp8 = r->bytes && !r->affine ? (int)f[SP_R_FP8] : 0;
#endif
    r->word = (int)f[SP_R_WORD];
    r->dense = (int)f[SP_R_DENSE];
    r->wide = f[SP_R_WIDE];
    r->narrow = 0x0101010101010101ull << (r->bits + 1);
    r->special = r->dense || r->wide;
    if (r->word) r->s32 = r->z32 = 1; /* the word is fp32-sized; decoded parameters are read as fp32 */
    r->smode = r->cg % 8 == 0 ? SP_P_BROADCAST : (r->cg == 1 && r->ss[3] == 1 ? SP_P_VECTOR : SP_P_EXPAND);
    r->zmode = r->cg % 8 == 0 ? SP_P_BROADCAST : (r->cg == 1 && r->zs[3] == 1 ? SP_P_VECTOR : SP_P_EXPAND);
    for (int64_t j = 0; j < D / 8 && j < SP_MAXCHUNKS; j++) {
        r->soff[j] = 8 * j / r->cg * r->ss[3];
        r->zoff[j] = 8 * j / r->cg * r->zs[3];
    }
}

/* The same over any layout (contract.PackedRead, read_t above): kp / vp the pointers, kf / vf the SP_R_* fields
 * (SP_R_FIELDS of them), koff / voff the affine offsets; D a multiple of 8. Per (sequence, KV head, slice of the
 * tokens): key rows dequantized (and rotated) one at a time against every query head, value tiles of SP_VBLOCK
 * tokens; tokens the mask excludes are neither dequantized nor read. Returns 0, -1 without memory, -2 for a head dim over
 * 8 * SP_MAXCHUNKS. */
int sp_decode_packed(int64_t B, int64_t Hq, int64_t H, int64_t D, int64_t T, int64_t Tt, const float *q,
                     const void *const *kp, const int64_t *kf, float koff, const void *const *vp, const int64_t *vf,
                     float voff, const float *kt, const float *vt, const uint8_t *mask, float scaling, float *out,
                     int64_t threads) {
    job_t j = {B, Hq, H, D, T, Tt, q, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, kt, vt,
               0, 0, 1, D, T, 1, B * H, scaling, NULL, 0, 0, mask, 1, {0}, {0}};
    if (D > 8 * SP_MAXCHUNKS) return -2;
    read_of(&j.k, kp, kf, koff, D);
    read_of(&j.v, vp, vf, voff, D);
    return run_decode(&j, threads, SP_VBLOCK, out);
}

/* Codes of a packed range as floats minus `offset` (reference.unpack_float): codes [bits, B, H, T, D/8]
 * with strides cs (elements); out [B, H, T, D] contiguous. The dense read path: prefill and the layouts the
 * decode kernel does not read. */
void sp_unpack_float(int64_t B, int64_t H, int64_t T, int64_t D, int64_t bits, const uint8_t *codes,
                     const int64_t *cs, float offset, float *out) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const uint8_t *row = codes + b * cs[1] + h * cs[2] + t * cs[3];
                float *o = out + ((b * H + h) * T + t) * D;
#ifdef SP_AVX2
                const __m256 off = _mm256_set1_ps(offset);
                for (int64_t j = 0; j < D / 8; j++)
                    _mm256_storeu_ps(o + 8 * j, _mm256_sub_ps(unpack8(row + j, cs[0], (int)bits), off));
#else
                unpack_row(row, cs[0], (int)bits, D / 8, o);
                for (int64_t d = 0; d < D; d++) o[d] -= offset;
#endif
            }
}

/* Dequantized codes (reference.dequantize_tokens / dequantize_channels): (code - offset) * scale + zero, with
 * scale / zero fp32 [B, H, T, D/g] per token (channel == 0) or [B, H, T/G, D] per channel; zero may be NULL.
 * codes [bits, B, H, T, D/8] with strides cs; out [B, H, T, D] contiguous. */
void sp_dequantize(int64_t B, int64_t H, int64_t T, int64_t D, int64_t bits, const uint8_t *codes, const int64_t *cs,
                   const float *scale, const float *zero, int64_t channel, int64_t group, float offset, float *out) {
    const int64_t ns = channel ? D : D / group; /* scale entries per row of the scale tensor */
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t t = 0; t < T; t++) {
            const uint8_t *row = codes + (bh / H) * cs[1] + (bh % H) * cs[2] + t * cs[3];
            const int64_t srow = bh * (channel ? T / group : T) + (channel ? t / group : t);
            const float *sc = scale + srow * ns, *ze = zero ? zero + srow * ns : NULL;
            float *o = out + (bh * T + t) * D;
#ifdef SP_AVX2
            if (channel || group % 8 == 0) {
                const __m256 off = _mm256_set1_ps(offset);
                for (int64_t j = 0; j < D / 8; j++) {
                    const __m256 cv = _mm256_sub_ps(unpack8(row + j, cs[0], (int)bits), off);
                    const __m256 sv = channel ? _mm256_loadu_ps(sc + 8 * j) : _mm256_set1_ps(sc[8 * j / group]);
                    const __m256 zv = !ze ? _mm256_setzero_ps()
                                          : (channel ? _mm256_loadu_ps(ze + 8 * j) : _mm256_set1_ps(ze[8 * j / group]));
                    _mm256_storeu_ps(o + 8 * j, _mm256_add_ps(_mm256_mul_ps(cv, sv), zv));
                }
                continue;
            }
#endif
            unpack_row(row, cs[0], (int)bits, D / 8, o);
            for (int64_t d = 0; d < D; d++) {
                const int64_t k = channel ? d : d / group;
                o[d] = (o[d] - offset) * sc[k] + (ze ? ze[k] : 0.0f);
            }
        }
}

/* Per-token asymmetric quantization of x [N, D] over groups of g channels (reference.quantize_pack_tokens):
 * codes [bits, N, D/8], scale / zero [N, D/g] as fp16 bits. */
void sp_quantize_pack_tokens(int64_t N, int64_t D, int64_t g, int64_t bits, const float *x, uint8_t *codes,
                             uint16_t *scale, uint16_t *zero) {
    const float levels = (float)((1 << bits) - 1);
    uint8_t row[1024];
    for (int64_t t = 0; t < N; t++) {
        const float *xr = x + t * D;
        for (int64_t j = 0; j < D / g; j++) {
            const float *xg = xr + j * g;
            float mn = xg[0], mx = xg[0];
            for (int64_t i = 1; i < g; i++) {
                mn = xg[i] < mn ? xg[i] : mn;
                mx = xg[i] > mx ? xg[i] : mx;
            }
            float sc = (mx - mn) / levels, inv = sc > 0 ? 1.0f / sc : 0.0f;
            for (int64_t i = 0; i < g; i++) {
                float v = floorf((xg[i] - mn) * inv + 0.5f);
                v = v < 0 ? 0 : (v > levels ? levels : v);
                row[j * g + i] = (uint8_t)v;
            }
            scale[t * (D / g) + j] = f2h(sc);
            zero[t * (D / g) + j] = f2h(mn);
        }
        pack_row(row, (int)bits, D / 8, codes + t * (D / 8), N * (D / 8));
    }
}

static inline float bf16_round(float x) { /* round to nearest even, as torch's .bfloat16() (NaN kept a NaN) */
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static inline float rha(float v) { return truncf(v >= 0 ? v + 0.5f : v - 0.5f); } /* half away from zero */

/* vLLM's int4_per_token_head write (engines/vllm/per_token_head.quantize_int4), bit for bit: x [N, D] (fp32 values
 * of the model's dtype) rotated blockwise by H_b diag(signs) (b = the largest power-of-two divisor of D; the
 * butterfly in the pair order of the reference, so every fp32 sum rounds the same), rounded back to the model's
 * dtype (rnd: 1 fp32, 2 fp16, 3 bf16, as SP_R_DENSE names them), then min/max codes per row: codes as 4 bit-planes
 * [4, N, D/8], and the fp32 word [N] (the scale's bits with the zero-point in the low 4). D a multiple of 8, at most
 * 1024. */
void sp_quantize_int4_rht(int64_t N, int64_t D, int64_t rnd, const float *x, const float *signs, uint8_t *codes,
                          float *word) {
    const int64_t bsz = D & -D;
    float y[1024];
    uint8_t row[1024];
    for (int64_t t = 0; t < N; t++) {
        const float *xr = x + t * D;
        for (int64_t d = 0; d < D; d++) y[d] = xr[d] * signs[d % bsz];
        for (int64_t blk = 0; blk < D; blk += bsz)
            for (int64_t hh = 1; hh < bsz; hh <<= 1)
                for (int64_t i = blk; i < blk + bsz; i += 2 * hh)
                    for (int64_t k = i; k < i + hh; k++) {
                        const float a = y[k], c = y[k + hh];
                        y[k] = a + c;
                        y[k + hh] = a - c;
                    }
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t d = 0; d < D; d++) {
            if (rnd == 2) y[d] = h2f(f2h(y[d]));
            else if (rnd == 3) y[d] = bf16_round(y[d]);
            mn = y[d] < mn ? y[d] : mn;
            mx = y[d] > mx ? y[d] : mx;
        }
        float scale = (mx - mn) / 15.0f;
        scale = scale < 1e-6f ? 1e-6f : scale;
        float zp = rha(-mn / scale);
        zp = zp < 0 ? 0 : (zp > 15 ? 15 : zp);
        const float inv = 1.0f / scale;
        for (int64_t d = 0; d < D; d++) {
            const float prod = y[d] * inv;
            float v = rha(prod + zp);
            v = v < 0 ? 0 : (v > 15 ? 15 : v);
            row[d] = (uint8_t)v;
        }
        uint32_t u;
        memcpy(&u, &scale, 4);
        u = (u & ~(uint32_t)0xF) | (uint32_t)zp;
        memcpy(word + t, &u, 4);
        pack_row(row, 4, D / 8, codes + t * (D / 8), N * (D / 8));
    }
}

/* Per-channel asymmetric quantization of x [N, T, D] over groups of G tokens (reference.quantize_pack_channels):
 * codes [bits, N, T, D/8], scale / zero [N, T/G, D] as fp16 bits. */
int sp_quantize_pack_channels(int64_t N, int64_t T, int64_t D, int64_t G, int64_t bits, const float *x,
                              uint8_t *codes, uint16_t *scale, uint16_t *zero) {
    const float levels = (float)((1 << bits) - 1);
    float *mn = malloc(sizeof(float) * (size_t)(3 * D));
    uint8_t *c = malloc((size_t)(G * D));
    if (!mn || !c) {
        free(mn);
        free(c);
        return -1;
    }
    float *mx = mn + D, *inv = mx + D;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < T / G; g++) {
            const float *xg = x + (n * T + g * G) * D;
            for (int64_t d = 0; d < D; d++) mn[d] = mx[d] = xg[d];
            for (int64_t t = 1; t < G; t++)
                for (int64_t d = 0; d < D; d++) {
                    float v = xg[t * D + d];
                    mn[d] = v < mn[d] ? v : mn[d];
                    mx[d] = v > mx[d] ? v : mx[d];
                }
            uint16_t *so = scale + (n * (T / G) + g) * D, *zo = zero + (n * (T / G) + g) * D;
            for (int64_t d = 0; d < D; d++) {
                float sc = (mx[d] - mn[d]) / levels;
                inv[d] = sc > 0 ? 1.0f / sc : 0.0f;
                so[d] = f2h(sc);
                zo[d] = f2h(mn[d]);
            }
            for (int64_t t = 0; t < G; t++)
                for (int64_t d = 0; d < D; d++) {
                    float v = floorf((xg[t * D + d] - mn[d]) * inv[d] + 0.5f);
                    v = v < 0 ? 0 : (v > levels ? levels : v);
                    c[t * D + d] = (uint8_t)v;
                }
            for (int64_t t = 0; t < G; t++)
                pack_row(c + t * D, (int)bits, D / 8, codes + (n * T + g * G + t) * (D / 8), N * T * (D / 8));
        }
    free(mn);
    free(c);
    return 0;
}
