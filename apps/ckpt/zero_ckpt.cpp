// zero-ckpt: the offline side of zero's training-state checkpoints (zero/ckpt/ckpt.hpp).
//   zero-ckpt inspect DIR                     the manifest's summary, every file verified
//   zero-ckpt consolidate DIR --out F.safetensors [--dtype f32|bf16]
//                                             the full weights, streamed parameter by parameter
//   zero-ckpt reshard DIR --world-size M --out DIR2
//                                             the checkpoint rewritten as M ranks would save it
//   zero-ckpt import SRC --like DIR --out DIR2 [--world-size M] [--rename FROM=TO ...]
//                    [--allow-unused]
//                                             pretrained weights (a .safetensors file, a sharded
//                                             set's index or its directory) as a step-0
//                                             checkpoint of DIR's model and config: fresh
//                                             optimizer state, M ranks (default: DIR's); a run
//                                             starts from it with zero::ckpt::load
//                                             (weights_only for another optimizer). --rename:
//                                             prefix rules, parameter-name prefix FROM read
//                                             from tensors named with TO instead
// DIR is a checkpoint (step-<n>) or a root holding `latest`. (A resumed run does not need
// reshard: zero::ckpt::load reads any world size online; reshard is for tools that want the
// files of M ranks.)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "zero/ckpt/ckpt.hpp"
#include "zero/core/error.hpp"

int main(int argc, char** argv) try {
  CLI::App app{"zero-ckpt: inspect, export, reshard and import zero training checkpoints"};
  app.require_subcommand(1);
  std::string dir, out, dtype = "f32";
  int world_size = 0;
  std::vector<std::string> renames;
  bool allow_unused = false;
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
  CLI::App* import = app.add_subcommand(
      "import", "pretrained weights (safetensors) as a step-0 checkpoint of a model's config");
  import->add_option("src", dir, "a .safetensors file, a model.safetensors.index.json or its dir")
      ->required();
  std::string like;
  import->add_option("--like", like, "a checkpoint of the target model (units, shapes, config)")
      ->required();
  import->add_option("--out", out, "root directory of the new checkpoint")->required();
  import->add_option("--world-size", world_size, "ranks of the new checkpoint (default: --like's)")
      ->check(CLI::PositiveNumber);
  import->add_option("--rename", renames,
                     "FROM=TO: parameters whose name starts with FROM read the tensor named with "
                     "TO instead (first match wins; repeatable)");
  import->add_flag("--allow-unused", allow_unused, "skip tensors no parameter takes");
  CLI11_PARSE(app, argc, argv);
  if (*inspect) {
    for (const std::string& line : zero::ckpt::inspect(dir)) std::printf("%s\n", line.c_str());
  } else if (*consolidate) {
    const std::size_t bytes = zero::ckpt::consolidate(dir, out, zero::parse_dtype(dtype));
    std::printf("wrote %s: %zu bytes (%s)\n", out.c_str(), bytes, dtype.c_str());
  } else if (*import) {
    zero::ckpt::ImportOptions o;
    o.allow_unused = allow_unused;
    for (const std::string& r : renames) {
      const std::size_t eq = r.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "zero-ckpt: --rename '%s' is not FROM=TO\n", r.c_str());
        return 2;
      }
      o.rename_prefixes.emplace_back(r.substr(0, eq), r.substr(eq + 1));
    }
    const std::string path = zero::ckpt::import_checkpoint(dir, like, world_size, out, o);
    std::printf("wrote %s (step 0, fresh optimizer state)\n", path.c_str());
  } else if (*reshard) {
    const std::string path = zero::ckpt::reshard(dir, world_size, out);
    std::printf("wrote %s for %d ranks\n", path.c_str(), world_size);
  }
  return 0;
} catch (...) {
  return zero::report_exception("zero-ckpt");
}
