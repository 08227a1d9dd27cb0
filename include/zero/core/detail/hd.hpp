// zero/core/detail/hd.hpp — marks a function as callable from host and device code.
//
// The per-element math that the CPU path and the CUDA kernels share (conversions, optimizer
// updates) is written once as ZERO_HD inline functions; plain C++ compilers see plain inline.
#pragma once

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__
#else
#define ZERO_HD
#endif
