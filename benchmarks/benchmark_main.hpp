// benchmarks/benchmark_main.hpp — the main of the Google Benchmark programs: BENCHMARK_MAIN's
// steps, with any exception (a failed collective, an I/O error, a bad flag value) reported as one
// line and exit status 2 by zero::report_exception instead of std::terminate.
#pragma once

#include <benchmark/benchmark.h>

#include "zero/error.hpp"

#define ZERO_BENCHMARK_MAIN(program)                                  \
  int main(int argc, char** argv) try {                               \
    benchmark::Initialize(&argc, argv);                               \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2; \
    benchmark::RunSpecifiedBenchmarks();                              \
    benchmark::Shutdown();                                            \
    return 0;                                                         \
  } catch (...) {                                                     \
    return zero::report_exception(program);                           \
  }
