/* half.h: float16 and bfloat16 <-> float32 conversions (round to nearest even), shared by the
 * MPI user ops in reduce.c and the shared-memory kernels in reduce_kernels.c. Private to csrc/;
 * pure functions, any thread. */
#ifndef HVLITE_HALF_H
#define HVLITE_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f);   /* zero or subnormal: man * 2^-24 */
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000 | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffff;
    if (x >= 0x7f800000) return sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0);  /* inf, nan */
    if (x >= 0x477ff000) return sign | 0x7c00;                                 /* overflows */
    if (x < 0x38800000) {                                                      /* subnormal */
        float v;
        memcpy(&v, &x, 4);
        return sign | (uint16_t)lrintf(v * 16777216.0f);
    }
    return sign | (uint16_t)((x - 0x38000000 + 0xfff + ((x >> 13) & 1)) >> 13);
}

static inline float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t rounded = (x + 0x7fff + ((x >> 16) & 1)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x40;
    return (uint16_t)((x & 0x7fffffff) > 0x7f800000 ? quiet_nan : rounded);   /* a select: vectorises */
}

#endif /* HVLITE_HALF_H */
