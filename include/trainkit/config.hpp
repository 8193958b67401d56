// trainkit/config.hpp - the only place where the compiler and the build decide things.
#pragma once

#define TRAINKIT_VERSION_MAJOR 0
#define TRAINKIT_VERSION_MINOR 1
#define TRAINKIT_VERSION_PATCH 0

// Per-element math is written once as functors that both backends call; under nvcc
// they are compiled for host and device.
#if defined(__CUDACC__)
#define TRAINKIT_HD __host__ __device__
#define TRAINKIT_CUDA_COMPILER 1
#else
#define TRAINKIT_HD
#define TRAINKIT_CUDA_COMPILER 0
#endif

#if defined(_OPENMP)
#define TRAINKIT_HAS_OPENMP 1
#include <omp.h>  // omp_get_num_threads, omp_get_thread_num, omp_get_max_threads
#else
#define TRAINKIT_HAS_OPENMP 0
#endif

// SSE2 (every x86-64 compiler, no -march needed): the 1-bit gradient-compression kernels pack and
// unpack sign bits with it (compression/detail/kernels.hpp); elsewhere they take portable loops.
#if defined(__SSE2__)
#define TRAINKIT_HAS_SSE2 1
#include <emmintrin.h>  // _mm_cmpge_ps, _mm_movemask_ps, _mm_mul_ps, ...
#else
#define TRAINKIT_HAS_SSE2 0
#endif
