// Run-time choice of the CPU kernels' instruction set. flashmask_cpu.cc holds the kernels; the
// build compiles it once for its own target (namespace fm3::cpu::base: portable x86-64 by
// default) and, with GCC on x86-64, once more for AVX2+FMA and for AVX-512
// (flashmask_cpu_avx2.cc, flashmask_cpu_avx512.cc). fm3_cpu_fwd / fm3_cpu_bwd call the widest
// copy this CPU runs.
#pragma once
#include <stddef.h>

#include "fm3/params.h"

#ifndef FM3_CPU_ISA
#define FM3_CPU_ISA base  // namespace of the kernels in this translation unit
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FM3_CPU_DISPATCH 1  // the AVX2 / AVX-512 copies are built (they need GCC's target pragma)
#else
#define FM3_CPU_DISPATCH 0
#endif

namespace fm3::cpu {
#define FM3_CPU_DECLARE_ENTRIES(isa)                                  \
  namespace isa {                                                     \
  int fwd(const fm3_fwd_params* p, char* err, size_t err_len);       \
  int bwd(const fm3_bwd_params* p, char* err, size_t err_len);       \
  }
FM3_CPU_DECLARE_ENTRIES(base)
#if FM3_CPU_DISPATCH
FM3_CPU_DECLARE_ENTRIES(avx2)
FM3_CPU_DECLARE_ENTRIES(avx512)
#endif
#undef FM3_CPU_DECLARE_ENTRIES
}  // namespace fm3::cpu
