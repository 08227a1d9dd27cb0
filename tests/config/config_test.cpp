// Config: DeepSpeed files load with DeepSpeed's defaults; every bad input is a kConfig error that
// names the full key path; environment and command line override the file, in that order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/scoped_env.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

#ifndef ZERO_TEST_FIXTURES
#error "ZERO_TEST_FIXTURES must name tests/config/fixtures"
#endif

namespace zero {
namespace {

const std::string kFixtures = ZERO_TEST_FIXTURES;

using testing::ScopedEnv;

TEST(Config, DefaultsAreDeepSpeedsButTheBucketSizes) {
  const Config c = parse_config("{}");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 0);  // unset: one collective per unit
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 0);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_count, 5);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.aio.block_size, 1'048'576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.comm_timeout_s, 600.0);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  EXPECT_TRUE(parse_config(R"({"zero_optimization":{"stage":3}})").zero_optimization.overlap_comm);
}

TEST(Config, DeepSpeedStage3CpuOffloadExampleLoads) {
  const Config c = load_config(kFixtures + "/ds_zero3_cpu_offload.json");
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 940'000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1'000'000'000);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-5);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.scheduler.warmup_num_steps, 500);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_NO_THROW(c.validate_for_world_size(4));  // 16 = 4 x 1 x 4
  try {
    c.validate_for_world_size(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    EXPECT_NE(std::string(e.what()).find("train_batch_size"), std::string::npos) << e.what();
  }
}

TEST(Config, DeepSpeedStage2NvmeExampleLoads) {
  const Config c = load_config(kFixtures + "/ds_zero2_nvme.json");
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
}

struct BadCase {
  const char* json;
  const char* key;  // the full key path the message must name
};

// Each must fail with kConfig and name the key.
const BadCase kBad[] = {
    {R"({"zero_optimization":{"stage":4}})", "zero_optimization.stage"},
    {R"({"zero_optimization":{"stage":-1}})", "zero_optimization.stage"},
    {R"({"zero_optimization":{"stage":"2"}})", "zero_optimization.stage"},
    {R"({"zero_optimization":{"stage":2.5}})", "zero_optimization.stage"},
    {R"({"zero_optimization":{"stagee":2}})", "zero_optimization.stagee"},
    {R"({"zero_optimizaton":{"stage":2}})", "zero_optimizaton"},
    {R"({"zero_optimization":{"reduce_bucket_size":-1}})", "zero_optimization.reduce_bucket_size"},
    {R"({"zero_optimization":{"allgather_bucket_size":-5}})",
     "zero_optimization.allgather_bucket_size"},
    {R"({"zero_optimization":{"overlap_comm":"yes"}})", "zero_optimization.overlap_comm"},
    {R"({"zero_optimization":{"stage":2,"offload_param":{"device":"cpu"}}})",
     "zero_optimization.offload_param.device"},
    {R"({"zero_optimization":{"stage":0,"offload_optimizer":{"device":"cpu"}}})",
     "zero_optimization.offload_optimizer.device"},
    {R"({"zero_optimization":{"stage":2,"offload_optimizer":{"device":"gpu"}}})",
     "zero_optimization.offload_optimizer.device"},
    {R"({"zero_optimization":{"stage":2,"offload_optimizer":{"device":"nvme"}}})",
     "zero_optimization.offload_optimizer.nvme_path"},
    {R"({"zero_optimization":{"stage":2,"offload_optimizer":{"device":"cpu","buffer_count":0}}})",
     "zero_optimization.offload_optimizer.buffer_count"},
    {R"({"zero_optimization":{"stage":2,"offload_optimizer":{"device":"cpu","ratio":1.5}}})",
     "zero_optimization.offload_optimizer.ratio"},
    {R"({"zero_optimization":{"stage":2,"offload_optimizer":{"device":"cpu","ratio":-0.25}}})",
     "zero_optimization.offload_optimizer.ratio"},
    {R"({"zero_optimization":{"stage":2,"offload_optimizer":{"device":"cpu","ratio":"half"}}})",
     "zero_optimization.offload_optimizer.ratio"},
    {R"({"zero_optimization":{"stage":3,"stage3_max_live_parameters":0}})",
     "zero_optimization.stage3_max_live_parameters"},
    {R"({"zero_optimization":{"cpu_offload":true}})", "zero_optimization.cpu_offload"},
    {R"({"zero_optimization":[1,2]})", "zero_optimization"},
    {R"({"fp16":{"enabled":true},"bf16":{"enabled":true}})", "bf16.enabled"},
    {R"({"fp16":{"initial_scale_power":64}})", "fp16.initial_scale_power"},
    {R"({"fp16":{"loss_scale_window":0}})", "fp16.loss_scale_window"},
    {R"({"fp16":{"hysteresis":0}})", "fp16.hysteresis"},
    {R"({"fp16":{"min_loss_scale":0}})", "fp16.min_loss_scale"},
    {R"({"fp16":{"loss_scale":-1}})", "fp16.loss_scale"},
    {R"({"fp16":{"enabled":1}})", "fp16.enabled"},
    {R"({"fp16":{"fp16_master_weights_and_grads":true}})", "fp16.fp16_master_weights_and_grads"},
    {R"({"optimizer":{"type":"Adamax"}})", "optimizer.type"},
    {R"({"optimizer":{"type":"AdamW","params":{"lr":-0.1}}})", "optimizer.params.lr"},
    {R"({"optimizer":{"type":"AdamW","params":{"betas":[0.9]}}})", "optimizer.params.betas"},
    {R"({"optimizer":{"type":"AdamW","params":{"betas":[0.9, 1.0]}}})", "optimizer.params.betas"},
    {R"({"optimizer":{"type":"AdamW","params":{"eps":0}}})", "optimizer.params.eps"},
    {R"({"optimizer":{"type":"AdamW","params":{"momentum":0.9}}})", "optimizer.params.momentum"},
    {R"({"optimizer":{"type":"AdamW","params":{"amsgrad":true}}})", "optimizer.params.amsgrad"},
    {R"({"optimizer":{"type":"AdamW","params":{"adam_w_mode":false}}})",
     "optimizer.params.adam_w_mode"},
    {R"({"optimizer":{"type":"SGD","params":{"nesterov":true}}})", "optimizer.params.nesterov"},
    {R"({"optimizer":{"type":"SGD","params":{"momentum":1.5}}})", "optimizer.params.momentum"},
    {R"({"optimizer":{"type":"Adam","params":{"weight_decay":-1}}})",
     "optimizer.params.weight_decay"},
    {R"({"scheduler":{"type":"Cosine"}})", "scheduler.type"},
    {R"({"scheduler":{"type":"WarmupDecayLR","params":{"warmup_num_steps":10}}})",
     "scheduler.params.total_num_steps"},
    {R"({"scheduler":{"type":"WarmupDecayLR","params":{"warmup_num_steps":10,"total_num_steps":10}}})",
     "scheduler.params.total_num_steps"},
    {R"({"scheduler":{"type":"WarmupLR","params":{"warmup_type":"cubic"}}})",
     "scheduler.params.warmup_type"},
    {R"({"scheduler":{"type":"WarmupLR","params":{"warmup_min_lr":1,"warmup_max_lr":0.1}}})",
     "scheduler.params.warmup_max_lr"},
    {R"({"scheduler":{"type":"OneCycle","params":{"cycle_min_lr":0.1}}})",
     "scheduler.params.cycle_max_lr"},
    {R"({"scheduler":{"type":"WarmupLR","params":{"total_num_steps":5}}})",
     "scheduler.params.total_num_steps"},
    {R"({"gradient_accumulation_steps":0})", "gradient_accumulation_steps"},
    {R"({"train_micro_batch_size_per_gpu":0})", "train_micro_batch_size_per_gpu"},
    {R"({"gradient_clipping":-1})", "gradient_clipping"},
    {R"({"gradient_clipping":"auto"})", "gradient_clipping"},
    {R"({"aio":{"block_size":1000}})", "aio.block_size"},
    {R"({"aio":{"block_size":6144}})", "aio.block_size"},
    {R"({"aio":{"queue_depth":0}})", "aio.queue_depth"},
    {R"({"activation_checkpointing":{"number_checkpoints":-2}})",
     "activation_checkpointing.number_checkpoints"},
    {R"({"activation_checkpointing":{"cpu_checkpoint":true}})",
     "activation_checkpointing.cpu_checkpoint"},
    {R"({"comm_timeout_s":0})", "comm_timeout_s"},
    {R"({"comm_backend":"gloo"})", "comm_backend"},
    {R"({"communication_data_type":"fp8"})", "communication_data_type"},
    {R"({"bf16":{"enabled":true},"communication_data_type":"fp16"})", "communication_data_type"},
};

TEST(Config, EveryInvalidConfigIsAnErrorNamingTheKey) {
  ASSERT_GE(std::size(kBad), 30u);
  for (const BadCase& bad : kBad) {
    try {
      parse_config(bad.json);
      ADD_FAILURE() << "accepted: " << bad.json;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig) << bad.json;
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad.key), std::string::npos)
          << "message does not name '" << bad.key << "': " << e.what();
    }
  }
}

TEST(Config, MessagesShowTheValueAndSuggestNearKeys) {
  try {
    parse_config(R"({"zero_optimization":{"stage":7}})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("= 7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[0, 3]"), std::string::npos) << e.what();
  }
  try {
    parse_config(R"({"zero_optimization":{"reduce_bucket_sise":5}})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'zero_optimization.reduce_bucket_size'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, MalformedJsonAndMissingFilesAreClearErrors) {
  try {
    parse_config(R"({"zero_optimization": {"stage": 2,}})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config("[1,2]"), Error);
  try {
    load_config("/nonexistent/ds.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/ds.json"), std::string::npos);
  }
}

TEST(Config, EnvironmentBeatsFileAndCommandLineBeatsBoth) {
  const std::string file = kFixtures + "/ds_zero3_cpu_offload.json";
  {
    ScopedEnv env(
        {{"ZERO_STAGE", "2"}, {"ZERO_SET", "gradient_clipping=0.5;optimizer.params.lr=0.01"}});
    // Stage 2 with offload_param on is a contradiction: the env override must be validated too.
    std::vector<std::string> rest;
    const char* argv1[] = {"prog", "--config", file.c_str()};
    EXPECT_THROW(config_from_command_line(3, argv1, &rest), Error);
    const char* argv2[] = {
        "prog",    "--config", file.c_str(), "--set", "zero_optimization.offload_param.device=none",
        "--steps", "5"};
    const Config c = config_from_command_line(7, argv2, &rest);
    EXPECT_EQ(c.zero_optimization.stage, 2);  // env beat the file
    EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.5);
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
    EXPECT_EQ(rest, (std::vector<std::string>{"--steps", "5"}));  // not ours: handed back
    const char* argv3[] = {"prog",
                           "--zero-stage=1",
                           "--config",
                           file.c_str(),
                           "--set",
                           "zero_optimization.offload_param.device=none",
                           "--set=gradient_clipping=2"};
    const Config d = config_from_command_line(7, argv3, &rest);
    EXPECT_EQ(d.zero_optimization.stage, 1);  // command line beat env and file
    EXPECT_DOUBLE_EQ(d.gradient_clipping, 2.0);
    EXPECT_TRUE(rest.empty());
  }
  {
    ScopedEnv env({{"ZERO_COMM_TIMEOUT_S", "2.5"}});
    ConfigBuilder b;
    b.merge_json(R"({"comm_timeout_s": 30})").apply_env();
    EXPECT_DOUBLE_EQ(b.build().comm_timeout_s, 2.5);
  }
  {
    ScopedEnv env({{"ZERO_STAGE", "five"}});
    ConfigBuilder b;
    try {
      b.apply_env().build();
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("zero_optimization.stage"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Config, SetParsesJsonValuesAndRejectsMalformedAssignments) {
  ConfigBuilder b;
  b.set("optimizer.params.betas=[0.5,0.6]").set("optimizer.type=SGD").set("optimizer.type=Lion");
  const Config c = b.build();
  EXPECT_EQ(c.optimizer.type, "Lion");
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.6);
  EXPECT_THROW(ConfigBuilder().set("no_equals_sign"), Error);
  EXPECT_THROW(ConfigBuilder().set("a..b=1"), Error);
  ConfigBuilder bad;
  bad.set("gradient_clipping=1");
  EXPECT_THROW(bad.set("gradient_clipping.x=2"), Error);  // a number is not an object
  std::vector<std::string> rest;
  const char* argv[] = {"prog", "--zero-stage"};
  EXPECT_THROW(config_from_command_line(2, argv, &rest), Error);
}

// to_json() is complete: parsing it gives the same configuration (a checkpoint's manifest
// records the config this way, and reshard trains from it), for every optimizer and scheduler.
TEST(Config, ToJsonRoundTripsEveryKey) {
  const char* cases[] = {
      R"({"zero_optimization": {"stage": 3, "overlap_comm": false, "reduce_bucket_size": 77,
          "stage3_param_persistence_threshold": 9, "stage3_max_live_parameters": 5,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/x", "buffer_count": 3,
                                "pipeline_read": true},
          "offload_param": {"device": "cpu", "max_in_cpu": 1234}},
          "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.8, 0.95],
                        "eps": 1e-6, "weight_decay": 0.1, "adam_w_mode": false,
                        "bias_correction": false, "moment_dtype": "bf16"}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.001,
                        "warmup_max_lr": 0.01, "warmup_num_steps": 5, "total_num_steps": 40,
                        "warmup_type": "linear"}},
          "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4,
                   "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 2},
          "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
          "communication_data_type": "bf16", "train_batch_size": 48,
          "train_micro_batch_size_per_gpu": 4, "comm_timeout_s": 33,
          "aio": {"block_size": 8192, "queue_depth": 4, "engine": "threads"},
          "activation_checkpointing": {"number_checkpoints": 3, "profile": true}})",
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9,
          "nesterov": true}}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01,
          "cycle_max_lr": 0.1, "cycle_first_step_size": 7, "decay_lr_rate": 0.5}},
          "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}})",
      R"({"optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}},
          "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
          "warmup_num_steps": 10, "cos_min_ratio": 0.1, "warmup_min_ratio": 0.2}},
          "zero_optimization": {"stage": 2, "allgather_bucket_size": 64}})",
      R"({"optimizer": {"type": "Adagrad", "params": {"lr": 0.05, "eps": 1e-9}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}})",
  };
  for (const char* text : cases) {
    const Config c = parse_config(text);
    const std::string once = c.to_json();
    const Config again = parse_config(once);
    EXPECT_EQ(again.to_json(), once) << text;
  }
  // Spot checks that the values themselves survive.
  const Config c = parse_config(parse_config(cases[0]).to_json());
  EXPECT_EQ(c.scheduler.total_num_steps, 40);
  EXPECT_EQ(c.scheduler.warmup_type, "linear");
  EXPECT_EQ(c.optimizer.moment_dtype, "bf16");
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_EQ(c.zero_optimization.offload_param.max_in_cpu, 1234);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 5);
  EXPECT_EQ(c.communication_data_type, "bf16");
  EXPECT_EQ(c.aio.engine, "threads");
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 3);
  const Config sgd = parse_config(parse_config(cases[1]).to_json());
  EXPECT_TRUE(sgd.optimizer.nesterov);
  EXPECT_EQ(sgd.scheduler.cycle_first_step_size, 7);
}

}  // namespace
}  // namespace zero
