// benchmarks/benchmark_main.hpp — the main of the Google Benchmark programs: BENCHMARK_MAIN's
// steps, with any exception (a failed collective, an I/O error, a bad flag value) reported as one
// line and exit status 2 by zero::report_exception instead of std::terminate; a benchmark that
// fails a check of its own (bench::fail) makes the exit status 1.
#pragma once

#include <benchmark/benchmark.h>

#include <string>

#include "zero/core/error.hpp"

namespace zero::bench {
// The program's exit status: 1 once any benchmark failed a check of its own (fail() below).
inline int& exit_status() {
  static int status = 0;
  return status;
}
// Marks the benchmark failed (reported as "ERROR OCCURRED: why", error_occurred in JSON) and
// the program's exit status 1, so a scripted run cannot miss it; the other benchmarks still run.
inline void fail(benchmark::State& state, const std::string& why) {
  state.SkipWithError(why.c_str());
  exit_status() = 1;
}
}  // namespace zero::bench

#define ZERO_BENCHMARK_MAIN(program)                                  \
  int main(int argc, char** argv) try {                               \
    benchmark::Initialize(&argc, argv);                               \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2; \
    benchmark::RunSpecifiedBenchmarks();                              \
    benchmark::Shutdown();                                            \
    return zero::bench::exit_status();                                \
  } catch (...) {                                                     \
    return zero::report_exception(program);                           \
  }
