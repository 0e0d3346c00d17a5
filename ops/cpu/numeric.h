// Storage types of the CPU kernels and their exact conversions to/from fp32.
// Framework-free: fp16 and bf16 are handled as raw 16-bit patterns.
#pragma once
#include <stdint.h>
#include <string.h>

#include <cmath>

#include "cpu_isa.h"

namespace fm3::cpu::FM3_CPU_ISA {

struct half_bits { uint16_t x; };
struct bf16_bits { uint16_t x; };

inline float to_float(float v) { return v; }

inline float to_float(bf16_bits v) {
  uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline float to_float(half_bits v) {
  const uint32_t sign = static_cast<uint32_t>(v.x & 0x8000) << 16;
  const uint32_t exp = (v.x >> 10) & 0x1f;
  const uint32_t man = v.x & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    mag = man ? NAN : INFINITY;
  } else {
    uint32_t u = ((exp + 112) << 23) | (man << 13);
    memcpy(&mag, &u, 4);
  }
  uint32_t u;
  memcpy(&u, &mag, 4);
  u |= sign;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

template <typename T> T from_float(float f);

template <> inline float from_float<float>(float f) { return f; }

// Round to nearest even, NaN kept quiet.
template <> inline bf16_bits from_float<bf16_bits>(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_bits{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_bits{static_cast<uint16_t>(u >> 16)};
}

// Round to nearest even, with subnormals and overflow to inf.
template <> inline half_bits from_float<half_bits>(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return half_bits{static_cast<uint16_t>(sign | 0x7e00)};
  if (a >= 0x477ff000u) return half_bits{static_cast<uint16_t>(sign | 0x7c00)};  // rounds to inf
  if (a < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float af;
    memcpy(&af, &a, 4);
    const float scaled = af * 16777216.0f;  // units of 2^-24, exact
    const uint16_t m = static_cast<uint16_t>(std::nearbyint(scaled));  // ties to even
    return half_bits{static_cast<uint16_t>(sign | m)};
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return half_bits{static_cast<uint16_t>(sign | (r >> 13))};
}

// x[i] = 2^(x[i] - shift) for finite shift; results below 2^-126 (and -inf
// inputs, i.e. masked scores) give 0, NaN stays NaN, exponents are capped at
// 127. Cephes' exp2f polynomial on [-0.5, 0.5] (relative error ~2e-7): a plain
// loop the compiler vectorizes, ~10x faster than std::exp2 per element, which
// dominated the softmax.
inline void exp2_shifted(float* __restrict x, int n, float shift) {
  for (int i = 0; i < n; ++i) {
    const float t = x[i] - shift;
    const bool nan = t != t, tiny = t < -126.f;
    const float tc = (nan || tiny) ? 0.f : (t > 127.f ? 127.f : t);
    const float whole = std::rint(tc);
    const float f = tc - whole;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const int32_t bits = __builtin_bit_cast(int32_t, p) + (static_cast<int32_t>(whole) << 23);
    x[i] = tiny ? 0.f : (nan ? t : __builtin_bit_cast(float, bits));
  }
}

}  // namespace fm3::cpu::FM3_CPU_ISA
