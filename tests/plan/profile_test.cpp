// The machine profile: written and read back the same; every field validated, each error naming
// the key, the value and the file; a (small) calibration gives a valid profile.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/plan/profile.hpp"

namespace zero {
namespace {

using testing::expect_error;
using json = nlohmann::ordered_json;

MachineProfile sample() {
  MachineProfile p;
  p.source = "by hand";
  p.threads = 2;
  p.copy_bytes_per_s = 10e9;
  p.optimizer_f32_per_s = 8e8;
  p.optimizer_bf16_per_s = 6e8;
  p.optimizer_int8_per_s = 5e8;
  p.nvme_path = "/tmp";
  p.nvme_request_bytes = 8 << 20;
  p.nvme_read_bytes_per_s = 1.5e9;
  p.nvme_write_bytes_per_s = 1.2e9;
  p.collectives = {{"all_reduce", 2, 1 << 20, 1e-3},
                   {"all_reduce", 2, 16 << 20, 1e-2},
                   {"all_reduce", 4, 1 << 20, 2e-3},
                   {"reduce_scatter", 2, 1 << 20, 5e-4},
                   {"all_gather", 2, 1 << 20, 4e-4}};
  p.network_collectives = {{"all_gather", 4, 1 << 20, 4e-3}};
  p.optimizer_points = {
      {"f32", 1 << 18, 2e9}, {"f32", 1 << 22, 1e9}, {"f32", 1 << 24, 8e8}, {"int8", 1 << 20, 6e8}};
  p.trainer_flops_per_s = 1e10;
  p.trainer = "gpt --layers 4";
  return p;
}

TEST(Profile, RoundTripThroughAFile) {
  const MachineProfile p = sample();
  const testing::TempDir tmp;
  const std::string path = tmp.file("profile_roundtrip.json");
  write_profile(p, path);
  const MachineProfile q = read_profile(path);
  EXPECT_EQ(to_json(q), to_json(p));
  EXPECT_EQ(q.collectives.size(), 5u);
  EXPECT_EQ(q.network_collectives.size(), 1u);
  EXPECT_EQ(q.nvme_request_bytes, std::size_t{8} << 20);
  EXPECT_EQ(q.trainer, "gpt --layers 4");
}

// One edit of the sample's JSON, read back: the error names `needle`s (key, value, file).
void expect_bad(const std::function<void(json&)>& edit, const std::string& key,
                const std::string& value) {
  json j = json::parse(to_json(sample()));
  edit(j);
  try {
    (void)profile_from_json(j.dump(), "machine.json");
    ADD_FAILURE() << "accepted an edit of " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    const std::string m = e.message();
    EXPECT_NE(m.find(key), std::string::npos) << m;
    EXPECT_NE(m.find(value), std::string::npos) << m;
    EXPECT_NE(m.find("machine.json"), std::string::npos) << m;
  }
}

TEST(Profile, EveryFieldIsValidatedAndNamed) {
  expect_bad([](json& j) { j["memory"]["copy_bytes_per_s"] = -1; }, "memory.copy_bytes_per_s",
             "-1");
  expect_bad([](json& j) { j["memory"]["copy_bytes_per_s"] = 0; }, "memory.copy_bytes_per_s", "0");
  expect_bad([](json& j) { j["optimizer"]["int8_elements_per_s"] = "fast"; },
             "optimizer.int8_elements_per_s", "\"fast\"");
  expect_bad([](json& j) { j["optimizer"].erase("bf16_elements_per_s"); },
             "optimizer.bf16_elements_per_s", "missing");
  expect_bad([](json& j) { j["optimizer"]["fp8_elements_per_s"] = 1; },
             "optimizer.fp8_elements_per_s", "unknown key");
  expect_bad([](json& j) { j["extra"] = true; }, "extra", "unknown key");
  expect_bad([](json& j) { j["optimizer"]["points"][1]["moment_dtype"] = "f16"; },
             "optimizer.points[1].moment_dtype", "\"f16\"");
  expect_bad([](json& j) { j["optimizer"]["points"][2]["elements"] = 0; },
             "optimizer.points[2].elements", "0");
  expect_bad([](json& j) { j["optimizer"]["points"][0]["elements_per_s"] = -5; },
             "optimizer.points[0].elements_per_s", "-5");
  expect_bad([](json& j) { j["optimizer"]["points"] = 3; }, "optimizer.points", "array");
  expect_bad([](json& j) { j["threads"] = 0; }, "threads", "0");
  expect_bad([](json& j) { j["format"] = "v2"; }, "format", "\"v2\"");
  expect_bad([](json& j) { j["nvme"]["read_bytes_per_s"] = 0; }, "nvme.read_bytes_per_s", "0");
  expect_bad([](json& j) { j["nvme"]["request_bytes"] = -4096; }, "nvme.request_bytes", "-4096");
  expect_bad([](json& j) { j["collectives"][1]["op"] = "broadcast"; }, "collectives[1].op",
             "\"broadcast\"");
  expect_bad([](json& j) { j["collectives"][2]["ranks"] = 1; }, "collectives[2].ranks", "1");
  expect_bad([](json& j) { j["collectives"][0]["seconds"] = 0; }, "collectives[0].seconds", "0");
  expect_bad([](json& j) { j["collectives"] = json::object(); }, "collectives", "array");
  expect_bad([](json& j) { j["network_collectives"][0]["bytes"] = 0; },
             "network_collectives[0].bytes", "0");
  expect_bad([](json& j) { j["network_collectives"][0]["op"] = "gather"; },
             "network_collectives[0].op", "gather");
  expect_bad([](json& j) { j["trainer"]["flops_per_s"] = -2; }, "trainer.flops_per_s", "-2");
  expect_error([] { (void)profile_from_json("{", "broken.json"); }, ErrorCode::kConfig,
               "broken.json");
  expect_error([] { (void)read_profile("/nonexistent/machine.json"); }, ErrorCode::kIO,
               "/nonexistent/machine.json");
}

TEST(Profile, CollectiveLookUpInterpolatesAndExtrapolates) {
  const MachineProfile p = sample();
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 2, 1 << 20), 1e-3);
  // Half-way in bytes between 1 MiB and 16 MiB: half-way in time.
  EXPECT_NEAR(p.collective_seconds("all_reduce", 2, (17 << 20) / 2), 5.5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 2, 32 << 20), 2e-2);  // at 16 MiB's rate
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 2, 1024), 1e-3);      // latency floor
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 8, 1 << 20), 2e-3);   // nearest N: 4
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 1, 1 << 20), 0.0);
  // Across nodes: the network's points where it has the op, the node's otherwise.
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_gather", 4, 1 << 20, true), 4e-3);
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_gather", 4, 1 << 20, false), 4e-4);
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 4, 1 << 20, true), 2e-3);
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("int8"), 5e8);
  MachineProfile q = p;
  q.collectives.clear();
  expect_error([&] { (void)q.collective_seconds("all_gather", 2, 1); }, ErrorCode::kConfig,
               "all_gather");
}

// The optimizer's rate at a size: the points' seconds per element interpolated in log(size), the
// nearest point's outside them, the large-state rate for a dtype without points (and size 0).
TEST(Profile, OptimizerRateIsReadAtTheStepsSize) {
  const MachineProfile p = sample();
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("f32", 1 << 18), 2e9);
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("f32", 1 << 10), 2e9);  // below the smallest
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("f32", 1 << 26), 8e8);  // above the largest
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("f32", 0), 8e8);        // the large-state rate
  // 2^20 is half-way between 2^18 and 2^22 in log: half-way in seconds per element.
  EXPECT_NEAR(p.optimizer_per_s("f32", 1 << 20), 1 / (0.5 / 2e9 + 0.5 / 1e9), 1e-3);
  // A quarter of the way from 2^22 to 2^24 (2^22.5).
  const auto at = static_cast<std::size_t>(std::ldexp(1.0, 22) * std::sqrt(2.0));
  EXPECT_NEAR(p.optimizer_per_s("f32", at), 1 / (0.75 / 1e9 + 0.25 / 8e8), 1e3);
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("int8", 1 << 10), 6e8);  // its only point
  EXPECT_DOUBLE_EQ(p.optimizer_per_s("bf16", 1 << 20), 6e8);  // no points: the large rate
  expect_error([&] { (void)p.optimizer_per_s("f16", 1); }, ErrorCode::kInvalidArgument, "f16");
}

// A GPU machine's figures written by hand (the JSON a person types): read as written, used where
// they apply (NCCL's points on the device, the node's otherwise), written back the same, every
// field checked.
TEST(Profile, CudaFiguresWrittenByHandAreReadAndChecked) {
  json j = json::parse(to_json(sample()));
  j["cuda"] = json::parse(R"({
    "device": "NVIDIA H100 80GB HBM3", "devices": 8,
    "hbm_copy_bytes_per_s": 1.5e12,
    "host_to_device_bytes_per_s": 2.5e10, "device_to_host_bytes_per_s": 2.2e10,
    "nccl": [{"op": "all_reduce", "ranks": 8, "bytes": 1048576, "seconds": 6e-5},
             {"op": "all_reduce", "ranks": 8, "bytes": 268435456, "seconds": 2.5e-3}]})");
  const MachineProfile p = profile_from_json(j.dump(), "h100.json");
  EXPECT_TRUE(p.cuda.measured());
  EXPECT_EQ(p.cuda.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(p.cuda.devices, 8);
  EXPECT_EQ(p.cuda.hbm_copy_bytes_per_s, 1.5e12);
  EXPECT_EQ(p.cuda.host_to_device_bytes_per_s, 2.5e10);
  EXPECT_EQ(p.cuda.device_to_host_bytes_per_s, 2.2e10);
  ASSERT_EQ(p.cuda.nccl.size(), 2u);
  EXPECT_EQ(p.cuda.nccl[1].bytes, std::size_t{256} << 20);
  // On the device: NCCL's all_reduce; its missing ops fall back to the node's points.
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 8, 1 << 20, false, true), 6e-5);
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_reduce", 8, 1 << 20, false, false), 2e-3);
  EXPECT_DOUBLE_EQ(p.collective_seconds("all_gather", 2, 1 << 20, false, true), 4e-4);
  EXPECT_EQ(to_json(profile_from_json(to_json(p), "again")), to_json(p));
  // Without the section: not measured, and not written.
  EXPECT_FALSE(sample().cuda.measured());
  EXPECT_FALSE(json::parse(to_json(sample())).contains("cuda"));

  auto bad = [&](const std::function<void(json&)>& edit, const std::string& key,
                 const std::string& value) {
    expect_bad(
        [&](json& k) {
          k["cuda"] = j["cuda"];
          edit(k["cuda"]);
        },
        key, value);
  };
  bad([](json& c) { c["hbm_copy_bytes_per_s"] = 0; }, "cuda.hbm_copy_bytes_per_s", "0");
  bad([](json& c) { c["host_to_device_bytes_per_s"] = "fast"; }, "cuda.host_to_device_bytes_per_s",
      "\"fast\"");
  bad([](json& c) { c.erase("device_to_host_bytes_per_s"); }, "cuda.device_to_host_bytes_per_s",
      "null");
  bad([](json& c) { c["devices"] = 0; }, "cuda.devices", "0");
  bad([](json& c) { c["pcie_gen"] = 5; }, "cuda.pcie_gen", "5");
  bad([](json& c) { c["nccl"][0]["ranks"] = 16; }, "cuda.nccl[0].ranks", "16");
  bad([](json& c) { c["nccl"][1]["op"] = "send"; }, "cuda.nccl[1].op", "send");
  bad([](json& c) { c["nccl"] = 1; }, "cuda.nccl", "1");
}

TEST(Profile, CalibrationGivesAValidProfile) {
  CalibrateOptions o;
  o.copy_bytes = 4 << 20;
  o.optimizer_sizes = {1 << 12, 1 << 16};
  o.ranks = {2};
  o.sizes = {4096, 1 << 16};
  o.repeats = 1;
  const testing::TempDir tmp;
  o.nvme_path = tmp.path();
  o.nvme_bytes = 4 << 20;
  o.nvme_request_bytes = 1 << 20;
  o.cuda_copy_bytes = 16 << 20;
  o.cuda_ranks = {2};
  const MachineProfile p = calibrate(o);
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.collectives.size(), 6u);       // 3 ops x 1 rank count x 2 sizes
  EXPECT_EQ(p.optimizer_points.size(), 6u);  // 3 dtypes x 2 sizes
  for (const OptimizerPoint& o : p.optimizer_points) {
    if (o.elements == 1 << 16) {
      EXPECT_EQ(o.per_s, p.optimizer_per_s(o.moment_dtype));
    }
  }
  EXPECT_GT(p.nvme_read_bytes_per_s, 0);
  EXPECT_EQ(p.trainer_flops_per_s, 0);  // the trainer measures itself
  // The CUDA figures where a device exists (its copies; NCCL only with two or more), none here.
  const int devices = detail::cuda::device_count();
  EXPECT_EQ(p.cuda.measured(), devices > 0);
  EXPECT_EQ(p.cuda.devices, devices);
  if (devices > 0) {
    EXPECT_GT(p.cuda.hbm_copy_bytes_per_s, 0);
    EXPECT_GT(p.cuda.host_to_device_bytes_per_s, 0);
    EXPECT_GT(p.cuda.device_to_host_bytes_per_s, 0);
    EXPECT_EQ(p.cuda.nccl.size(), devices >= 2 ? 6u : 0u);  // 3 ops x rank count 2 x 2 sizes
  }
  EXPECT_NO_THROW((void)profile_from_json(to_json(p), "calibrated"));
}

}  // namespace
}  // namespace zero
