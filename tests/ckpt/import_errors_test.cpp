// Bad input to import_safetensors: every case a zero::Error naming the tensor (or the file / the
// index), thrown on every rank, the engine untouched; never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/ckpt_runs.hpp"
#include "ckpt/import_files.hpp"
#include "common/expect_error.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::RawTensor;
using Named = std::vector<std::pair<std::string, RawTensor>>;

// The model's tensors, correct, in F32 (values 0.25 * k).
Named good_tensors() {
  Named out;
  int k = 0;
  for (const UnitSpec& u : testing::import_model()) {
    for (const ParamSpec& p : u.params) {
      out.push_back({u.name + "." + p.name,
                     testing::encode(std::vector<float>(p.numel(), 0.25f * static_cast<float>(++k)),
                                     p.shape, DType::kF32)});
    }
  }
  return out;
}

// Imports `src` on 2 ranks (stage 3, bf16): each rank must throw `code` with every needle in the
// message, and keep its parameters (all 7.0).
void expect_import_error(const std::string& src, ErrorCode code,
                         const std::vector<std::string>& needles,
                         const ckpt::ImportOptions& o = {}) {
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::import_config(3, DType::kBF16));
    testing::add_units(e, testing::import_model(), 7.0f);
    for (const std::string& needle : needles) {
      testing::expect_error([&] { ckpt::import_safetensors(e, src, o); }, code, needle);
    }
    for (const auto& v : testing::read_params(e)) {
      for (float x : v) ASSERT_EQ(x, 7.0f) << "a failed import changed the engine";
    }
  });
}

class ImportErrors : public ::testing::Test {
 protected:
  testing::TempDir dir_{"import-errors"};
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }
};

TEST_F(ImportErrors, MissingTensorNamesTheParameter) {
  Named ts = good_tensors();
  ts.erase(ts.begin() + 3);  // block0.norm
  testing::write_st(path("m.safetensors"), ts);
  expect_import_error(path("m.safetensors"), ErrorCode::kConfig,
                      {"parameter 'block0.norm'", "no such tensor"});
  // Renamed: the message names both names.
  ckpt::ImportOptions o;
  o.rename_prefixes = {{"block0.", "model.block0."}};
  testing::write_st(path("r.safetensors"), good_tensors());
  expect_import_error(path("r.safetensors"), ErrorCode::kConfig,
                      {"parameter 'block0.w' (as 'model.block0.w')"}, o);
}

TEST_F(ImportErrors, ExtraTensorIsAnErrorUnlessAllowed) {
  Named ts = good_tensors();
  ts.push_back({"lm_head.bias", testing::encode({1, 2, 3}, {3}, DType::kF32)});
  testing::write_st(path("x.safetensors"), ts);
  expect_import_error(path("x.safetensors"), ErrorCode::kConfig,
                      {"tensor 'lm_head.bias'", "used by no parameter", "allow_unused"});
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::import_config(1, DType::kF32));
    testing::add_units(e);
    ckpt::ImportOptions o;
    o.allow_unused = true;
    EXPECT_EQ(ckpt::import_safetensors(e, path("x.safetensors"), o).unused, 1u);
  });
}

TEST_F(ImportErrors, ShapeMismatchNamesBothShapes) {
  Named ts = good_tensors();
  ts[1].second.shape = {11, 6};  // block0.w is [6, 11]: same element count, other shape
  testing::write_st(path("s.safetensors"), ts);
  expect_import_error(path("s.safetensors"), ErrorCode::kConfig,
                      {"tensor 'block0.w'", "has shape [11, 6], parameter 'block0.w' [6, 11]"});
}

TEST_F(ImportErrors, UnsupportedDtypeNamesTheTensor) {
  Named ts = good_tensors();
  ts[2].second.dtype = "F64";  // block0.b: 11 elements of 8 bytes
  ts[2].second.bytes.assign(11 * 8, '\0');
  testing::write_st(path("d.safetensors"), ts);
  expect_import_error(path("d.safetensors"), ErrorCode::kConfig,
                      {"tensor 'block0.b'", "is F64: only F32, BF16 and F16"});
}

TEST_F(ImportErrors, TruncatedFileAndBadHeaderNameTheTensorOrFile) {
  testing::write_st(path("t.safetensors"), good_tensors());
  fs::resize_file(path("t.safetensors"), fs::file_size(path("t.safetensors")) - 10);
  expect_import_error(path("t.safetensors"), ErrorCode::kCorruption,
                      {"tensor 'head.weight'", "(truncated)"});
  // A header length past the file's end.
  {
    std::ofstream out(path("h.safetensors"), std::ios::binary);
    out.write("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
  }
  expect_import_error(path("h.safetensors"), ErrorCode::kCorruption,
                      {"h.safetensors", "header length 65535 is out of range"});
  // Shorter than the length field.
  { std::ofstream(path("short.safetensors"), std::ios::binary) << "abc"; }
  expect_import_error(path("short.safetensors"), ErrorCode::kCorruption,
                      {"short.safetensors", "truncated"});
  // A header that is not JSON.
  {
    std::ofstream out(path("j.safetensors"), std::ios::binary);
    out.write("\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":   ", 16);
  }
  expect_import_error(path("j.safetensors"), ErrorCode::kCorruption,
                      {"j.safetensors", "the header is not JSON"});
  // Offsets that disagree with the dtype and shape.
  testing::write_st(path("o.safetensors"), good_tensors(), [](nlohmann::json& h) {
    h["block0.b"]["data_offsets"][1] = h["block0.b"]["data_offsets"][1].get<std::size_t>() - 4;
  });
  expect_import_error(path("o.safetensors"), ErrorCode::kCorruption, {"tensor 'block0.b'"});
}

TEST_F(ImportErrors, BadIndexNamesTheIndexFile) {
  const Named ts = good_tensors();
  fs::create_directories(path("set"));
  testing::write_st(path("set/model-00001-of-00002.safetensors"),
                    Named(ts.begin(), ts.begin() + 4));
  testing::write_st(path("set/model-00002-of-00002.safetensors"), Named(ts.begin() + 4, ts.end()));
  const std::string index = path("set/model.safetensors.index.json");
  auto write_index = [&](const std::string& text) { std::ofstream(index) << text; };
  write_index("{\"weight_map\": {\"embed.weight\": ");
  expect_import_error(path("set"), ErrorCode::kCorruption, {index, "is not JSON"});
  write_index("{\"metadata\": {}}");
  expect_import_error(index, ErrorCode::kCorruption, {index, "no \"weight_map\""});
  // head.weight is in file 2, the index says file 1.
  nlohmann::json j;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    j["weight_map"][ts[i].first] = i < 4 || ts[i].first == "head.weight"
                                       ? "model-00001-of-00002.safetensors"
                                       : "model-00002-of-00002.safetensors";
  }
  write_index(j.dump());
  expect_import_error(index, ErrorCode::kCorruption,
                      {index, "tensor 'head.weight' maps to 'model-00001-of-00002.safetensors'"});
  j["weight_map"]["head.weight"] = "model-00003-of-00003.safetensors";
  write_index(j.dump());
  expect_import_error(index, ErrorCode::kIO, {"model-00003-of-00003.safetensors"});
  j["weight_map"]["head.weight"] = "../elsewhere.safetensors";
  write_index(j.dump());
  expect_import_error(index, ErrorCode::kCorruption, {index, "tensor 'head.weight'"});
}

}  // namespace
}  // namespace zero
