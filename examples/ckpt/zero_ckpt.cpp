// zero-ckpt: the offline side of zero's training-state checkpoints (zero/ckpt.hpp).
//   zero-ckpt inspect DIR                     the manifest's summary, every file verified
//   zero-ckpt consolidate DIR --out F.safetensors [--dtype f32|bf16]
//                                             the full weights, streamed parameter by parameter
//   zero-ckpt reshard DIR --world-size M --out DIR2
//                                             the checkpoint rewritten as M ranks would save it
// DIR is a checkpoint (step-<n>) or a root holding `latest`. (A resumed run does not need
// reshard: zero::ckpt::load reads any world size online; reshard is for tools that want the
// files of M ranks.)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "zero/ckpt.hpp"
#include "zero/error.hpp"

int main(int argc, char** argv) try {
  CLI::App app{"zero-ckpt: inspect, export and reshard zero training checkpoints"};
  app.require_subcommand(1);
  std::string dir, out, dtype = "f32";
  int world_size = 0;
  CLI::App* inspect = app.add_subcommand("inspect", "print the manifest and verify every file");
  inspect->add_option("dir", dir, "checkpoint directory or root")->required();
  CLI::App* consolidate =
      app.add_subcommand("consolidate", "write the full parameters as one safetensors file");
  consolidate->add_option("dir", dir, "checkpoint directory or root")->required();
  consolidate->add_option("--out", out, "the .safetensors file to write")->required();
  consolidate->add_option("--dtype", dtype, "f32 (the masters) or bf16 (rounded)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  CLI::App* reshard = app.add_subcommand("reshard", "rewrite the checkpoint for M ranks");
  reshard->add_option("dir", dir, "checkpoint directory or root")->required();
  reshard->add_option("--world-size", world_size, "ranks of the rewritten checkpoint")
      ->required()
      ->check(CLI::PositiveNumber);
  reshard->add_option("--out", out, "root directory of the rewritten checkpoint")->required();
  CLI11_PARSE(app, argc, argv);
  if (*inspect) {
    for (const std::string& line : zero::ckpt::inspect(dir)) std::printf("%s\n", line.c_str());
  } else if (*consolidate) {
    const std::size_t bytes = zero::ckpt::consolidate(dir, out, zero::parse_dtype(dtype));
    std::printf("wrote %s: %zu bytes (%s)\n", out.c_str(), bytes, dtype.c_str());
  } else if (*reshard) {
    const std::string path = zero::ckpt::reshard(dir, world_size, out);
    std::printf("wrote %s for %d ranks\n", path.c_str(), world_size);
  }
  return 0;
} catch (...) {
  return zero::report_exception("zero-ckpt");
}
