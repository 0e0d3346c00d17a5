// The CPU kernels of flashmask_cpu.cc compiled once more, for AVX2 and FMA (x86-64-v3); fm3_cpu_fwd /
// fm3_cpu_bwd run this copy on CPUs that have it (cpu_isa.h).
#include "cpu_isa.h"
#if FM3_CPU_DISPATCH
// Everything shared with the other copies is included before the target pragma, so its inline
// functions stay compiled for the build's own target (one definition for all copies).
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "cpu_threads.h"
#include "fm3/mask.h"
#include "fm3/params.h"
#include "fm3_generated_config.h"

#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#undef FM3_CPU_ISA
#define FM3_CPU_ISA avx2
#define FM3_CPU_VARIANT 1
#define FM3_CPU_AVX2 1  // GCC's C++ front end does not define __AVX2__ after a target pragma
#include "flashmask_cpu.cc"
#endif
