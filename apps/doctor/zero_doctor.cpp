// zero-doctor: which rank is where, from the flight recorder's files of a job that hung or failed
// (comm_flight_dir / CommOptions::flight_dir: each rank writes flight_rank<r>.json on a failure,
// on SIGUSR1 and on SIGTERM).
//   zero-doctor DIR     the one-screen answer: a line per rank, then which rank is behind and
//                       where the others wait (zero::flight_report)
// A sibling of zero-ckpt rather than a subcommand of it: zero-ckpt reads training-state
// checkpoints, this reads a job's communication records; neither needs the other's options.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"

int main(int argc, char** argv) try {
  CLI::App app{"zero-doctor: which rank is where, from the ranks' flight records"};
  std::string dir;
  app.add_option("dir", dir, "the directory the ranks wrote flight_rank<r>.json to")->required();
  CLI11_PARSE(app, argc, argv);
  const std::string report = zero::flight_report(dir);
  std::fwrite(report.data(), 1, report.size(), stdout);
  return 0;
} catch (...) {
  return zero::report_exception("zero-doctor");
}
