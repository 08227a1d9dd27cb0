// The machine profile's JSON and its look-ups (zero/plan/profile.hpp).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "zero/core/error.hpp"
#include "zero/plan/profile.hpp"

namespace zero {

using json = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "zero-machine-profile/1";
const std::set<std::string> kOps = {"all_reduce", "reduce_scatter", "all_gather"};
const std::set<std::string> kMomentDtypes = {"f32", "bf16", "int8"};

// ---- reading: every key checked, every error names the key path, the value and the file

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const json& value, const std::string& why) const {
    ZERO_THROW(kConfig, "machine profile ", file_, ": ", key, " = ", value.dump(), ": ", why);
  }

  // The object at `key`, with no keys but `allowed`.
  const json& object(const json& j, const std::string& key,
                     const std::set<std::string>& allowed) const {
    if (!j.is_object()) fail(key, j, "expected an object");
    for (const auto& [k, v] : j.items()) {
      if (allowed.count(k) == 0) fail(join(key, k), v, "unknown key");
    }
    return j;
  }
  const json& member(const json& obj, const std::string& key, const std::string& name) const {
    if (!obj.contains(name)) fail(join(key, name), nullptr, "missing");
    return obj.at(name);
  }
  double number(const json& obj, const std::string& key, const std::string& name, double lo,
                bool lo_open = false) const {
    const json& v = member(obj, key, name);
    if (!v.is_number()) fail(join(key, name), v, "expected a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || (lo_open && x == lo)) {
      fail(
          join(key, name), v,
          std::string("expected a finite number ") + (lo_open ? "> " : ">= ") + std::to_string(lo));
    }
    return x;
  }
  std::size_t count(const json& obj, const std::string& key, const std::string& name,
                    std::size_t lo) const {
    const json& v = member(obj, key, name);
    if (!v.is_number_unsigned() || v.get<std::size_t>() < lo) {
      fail(join(key, name), v, "expected an integer >= " + std::to_string(lo));
    }
    return v.get<std::size_t>();
  }
  std::string text(const json& obj, const std::string& key, const std::string& name) const {
    const json& v = member(obj, key, name);
    if (!v.is_string()) fail(join(key, name), v, "expected a string");
    return v.get<std::string>();
  }
  static std::string join(const std::string& a, const std::string& b) {
    return a.empty() ? b : a + "." + b;
  }

 private:
  std::string file_;
};

}  // namespace

// ---- look-ups

double MachineProfile::optimizer_per_s(const std::string& moment_dtype,
                                       std::size_t elements) const {
  ZERO_CHECK(moment_dtype == "f32" || moment_dtype == "bf16" || moment_dtype == "int8",
             kInvalidArgument, "no optimizer figure for moment dtype '", moment_dtype,
             "' (f32, bf16, int8)");
  const double large = moment_dtype == "bf16"   ? optimizer_bf16_per_s
                       : moment_dtype == "int8" ? optimizer_int8_per_s
                                                : optimizer_f32_per_s;
  std::vector<const OptimizerPoint*> pts;
  for (const OptimizerPoint& o : optimizer_points) {
    if (o.moment_dtype == moment_dtype) pts.push_back(&o);
  }
  if (elements == 0 || pts.empty()) return large;
  std::sort(pts.begin(), pts.end(), [](auto* a, auto* b) { return a->elements < b->elements; });
  if (elements <= pts.front()->elements) return pts.front()->per_s;
  if (elements >= pts.back()->elements) return pts.back()->per_s;
  std::size_t k = 1;
  while (pts[k]->elements < elements) ++k;
  // Seconds per element, linear in log(elements): the cache's share of the state falls
  // geometrically with the size.
  const double f = std::log(static_cast<double>(elements) / pts[k - 1]->elements) /
                   std::log(static_cast<double>(pts[k]->elements) / pts[k - 1]->elements);
  const double spe = (1 - f) / pts[k - 1]->per_s + f / pts[k]->per_s;
  return 1 / spe;
}

double MachineProfile::collective_seconds(const std::string& op, int ranks, std::size_t bytes,
                                          bool across_nodes, bool on_device) const {
  if (ranks <= 1 || bytes == 0) return 0;
  auto has = [&](const std::vector<CollectivePoint>& v) {
    return std::any_of(v.begin(), v.end(), [&](const CollectivePoint& c) { return c.op == op; });
  };
  const std::vector<CollectivePoint>& collectives =
      across_nodes && has(network_collectives) ? network_collectives
      : on_device && has(cuda.nccl)            ? cuda.nccl
                                               : this->collectives;
  // The nearest measured rank count (ties: the larger, the pessimistic side).
  int best = -1;
  for (const CollectivePoint& c : collectives) {
    if (c.op != op) continue;
    if (best < 0 || std::abs(c.ranks - ranks) < std::abs(best - ranks) ||
        (std::abs(c.ranks - ranks) == std::abs(best - ranks) && c.ranks > best)) {
      best = c.ranks;
    }
  }
  ZERO_CHECK(best > 0, kConfig, "machine profile: no collective point for '", op,
             "' (calibrate with zero-env --calibrate, or add one under \"collectives\")");
  std::vector<const CollectivePoint*> pts;
  for (const CollectivePoint& c : collectives) {
    if (c.op == op && c.ranks == best) pts.push_back(&c);
  }
  std::sort(pts.begin(), pts.end(), [](auto* a, auto* b) { return a->bytes < b->bytes; });
  if (bytes <= pts.front()->bytes) return pts.front()->seconds;
  if (bytes >= pts.back()->bytes) {
    return pts.back()->seconds * static_cast<double>(bytes) /
           static_cast<double>(pts.back()->bytes);
  }
  for (std::size_t k = 1; k < pts.size(); ++k) {
    if (bytes <= pts[k]->bytes) {
      const double f = static_cast<double>(bytes - pts[k - 1]->bytes) /
                       static_cast<double>(pts[k]->bytes - pts[k - 1]->bytes);
      return pts[k - 1]->seconds + f * (pts[k]->seconds - pts[k - 1]->seconds);
    }
  }
  return pts.back()->seconds;
}

void MachineProfile::validate() const { (void)profile_from_json(to_json(*this), "<profile>"); }

// ---- JSON

std::string to_json(const MachineProfile& p) {
  json opt_points = json::array();
  for (const OptimizerPoint& o : p.optimizer_points) {
    opt_points.push_back(
        {{"moment_dtype", o.moment_dtype}, {"elements", o.elements}, {"elements_per_s", o.per_s}});
  }
  auto points = [](const std::vector<CollectivePoint>& v) {
    json cols = json::array();
    for (const CollectivePoint& c : v) {
      cols.push_back(
          {{"op", c.op}, {"ranks", c.ranks}, {"bytes", c.bytes}, {"seconds", c.seconds}});
    }
    return cols;
  };
  json j = {
      {"format", kFormat},
      {"source", p.source},
      {"threads", p.threads},
      {"memory", {{"copy_bytes_per_s", p.copy_bytes_per_s}}},
      {"optimizer",
       {{"f32_elements_per_s", p.optimizer_f32_per_s},
        {"bf16_elements_per_s", p.optimizer_bf16_per_s},
        {"int8_elements_per_s", p.optimizer_int8_per_s},
        {"points", opt_points}}},
      {"nvme",
       {{"path", p.nvme_path},
        {"request_bytes", p.nvme_request_bytes},
        {"read_bytes_per_s", p.nvme_read_bytes_per_s},
        {"write_bytes_per_s", p.nvme_write_bytes_per_s}}},
      {"collectives", points(p.collectives)},
      {"trainer", {{"what", p.trainer}, {"flops_per_s", p.trainer_flops_per_s}}},
  };
  if (!p.network_collectives.empty()) j["network_collectives"] = points(p.network_collectives);
  if (p.cuda.measured()) {
    j["cuda"] = {{"device", p.cuda.device},
                 {"devices", p.cuda.devices},
                 {"hbm_copy_bytes_per_s", p.cuda.hbm_copy_bytes_per_s},
                 {"host_to_device_bytes_per_s", p.cuda.host_to_device_bytes_per_s},
                 {"device_to_host_bytes_per_s", p.cuda.device_to_host_bytes_per_s},
                 {"nccl", points(p.cuda.nccl)}};
  }
  return j.dump(2) + "\n";
}

namespace {

// The collective points at `at`.`name` of `in`, appended to `into`.
void read_points(const Reader& r, const json& in, const std::string& at, const std::string& name,
                 std::vector<CollectivePoint>& into) {
  const std::string path = Reader::join(at, name);
  const json& cols = r.member(in, at, name);
  if (!cols.is_array()) r.fail(path, cols, "expected an array");
  for (std::size_t k = 0; k < cols.size(); ++k) {
    const std::string key = path + "[" + std::to_string(k) + "]";
    const json& c = r.object(cols[k], key, {"op", "ranks", "bytes", "seconds"});
    CollectivePoint pt;
    pt.op = r.text(c, key, "op");
    if (kOps.count(pt.op) == 0) {
      r.fail(key + ".op", c.at("op"), "expected all_reduce, reduce_scatter or all_gather");
    }
    pt.ranks = static_cast<int>(r.count(c, key, "ranks", 2));
    pt.bytes = r.count(c, key, "bytes", 1);
    pt.seconds = r.number(c, key, "seconds", 0, true);
    into.push_back(pt);
  }
}

// "optimizer": the rates per moment dtype and the measured points.
void read_optimizer(const Reader& r, const json& j, MachineProfile& p) {
  const json& opt =
      r.object(r.member(j, "", "optimizer"), "optimizer",
               {"f32_elements_per_s", "bf16_elements_per_s", "int8_elements_per_s", "points"});
  p.optimizer_f32_per_s = r.number(opt, "optimizer", "f32_elements_per_s", 0, true);
  p.optimizer_bf16_per_s = r.number(opt, "optimizer", "bf16_elements_per_s", 0, true);
  p.optimizer_int8_per_s = r.number(opt, "optimizer", "int8_elements_per_s", 0, true);
  // "points" is optional: a hand-written profile may give the rates alone.
  if (!opt.contains("points")) return;
  const json& pts = opt.at("points");
  if (!pts.is_array()) r.fail("optimizer.points", pts, "expected an array");
  for (std::size_t k = 0; k < pts.size(); ++k) {
    const std::string key = "optimizer.points[" + std::to_string(k) + "]";
    const json& o = r.object(pts[k], key, {"moment_dtype", "elements", "elements_per_s"});
    OptimizerPoint pt;
    pt.moment_dtype = r.text(o, key, "moment_dtype");
    if (kMomentDtypes.count(pt.moment_dtype) == 0) {
      r.fail(key + ".moment_dtype", o.at("moment_dtype"), "expected f32, bf16 or int8");
    }
    pt.elements = r.count(o, key, "elements", 1);
    pt.per_s = r.number(o, key, "elements_per_s", 0, true);
    p.optimizer_points.push_back(pt);
  }
}

// "nvme": the swap directory's request size and rates (both measured, or neither).
void read_nvme(const Reader& r, const json& j, MachineProfile& p) {
  const json& nv = r.object(r.member(j, "", "nvme"), "nvme",
                            {"path", "request_bytes", "read_bytes_per_s", "write_bytes_per_s"});
  p.nvme_path = r.text(nv, "nvme", "path");
  p.nvme_request_bytes = r.count(nv, "nvme", "request_bytes", 0);
  p.nvme_read_bytes_per_s = r.number(nv, "nvme", "read_bytes_per_s", 0);
  p.nvme_write_bytes_per_s = r.number(nv, "nvme", "write_bytes_per_s", 0);
  if ((p.nvme_read_bytes_per_s > 0) != (p.nvme_write_bytes_per_s > 0)) {
    r.fail("nvme.read_bytes_per_s", nv.at("read_bytes_per_s"),
           "read and write are measured together: both > 0, or both 0 (not measured)");
  }
}

// "cuda" (optional: a machine without a CUDA device has none): the device's copy rates and its
// NCCL points, each on at most cuda.devices ranks.
void read_cuda(const Reader& r, const json& j, MachineProfile& p) {
  if (!j.contains("cuda")) return;
  const json& cu = r.object(j.at("cuda"), "cuda",
                            {"device", "devices", "hbm_copy_bytes_per_s",
                             "host_to_device_bytes_per_s", "device_to_host_bytes_per_s", "nccl"});
  p.cuda.device = r.text(cu, "cuda", "device");
  p.cuda.devices = static_cast<int>(r.count(cu, "cuda", "devices", 1));
  p.cuda.hbm_copy_bytes_per_s = r.number(cu, "cuda", "hbm_copy_bytes_per_s", 0, true);
  p.cuda.host_to_device_bytes_per_s = r.number(cu, "cuda", "host_to_device_bytes_per_s", 0, true);
  p.cuda.device_to_host_bytes_per_s = r.number(cu, "cuda", "device_to_host_bytes_per_s", 0, true);
  std::vector<CollectivePoint> nccl;
  read_points(r, cu, "cuda", "nccl", nccl);
  for (std::size_t k = 0; k < nccl.size(); ++k) {
    if (nccl[k].ranks > p.cuda.devices) {
      r.fail("cuda.nccl[" + std::to_string(k) + "].ranks", cu.at("nccl")[k].at("ranks"),
             "more ranks than cuda.devices = " + std::to_string(p.cuda.devices) +
                 " (one GPU per rank)");
    }
  }
  p.cuda.nccl = std::move(nccl);
}

}  // namespace

MachineProfile profile_from_json(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ZERO_THROW(kConfig, "machine profile ", file, ": not JSON: ", e.what());
  }
  const Reader r(file);
  r.object(j, "",
           {"format", "source", "threads", "memory", "optimizer", "nvme", "collectives",
            "network_collectives", "trainer", "cuda"});
  if (r.text(j, "", "format") != kFormat) {
    r.fail("format", j.at("format"), std::string("expected \"") + kFormat + "\"");
  }
  MachineProfile p;
  p.source = r.text(j, "", "source");
  p.threads = static_cast<int>(r.count(j, "", "threads", 1));
  const json& mem = r.object(r.member(j, "", "memory"), "memory", {"copy_bytes_per_s"});
  p.copy_bytes_per_s = r.number(mem, "memory", "copy_bytes_per_s", 0, true);
  read_optimizer(r, j, p);
  read_nvme(r, j, p);
  read_points(r, j, "", "collectives", p.collectives);
  // optional: a cluster's figures across nodes
  if (j.contains("network_collectives")) {
    read_points(r, j, "", "network_collectives", p.network_collectives);
  }
  read_cuda(r, j, p);
  const json& tr = r.object(r.member(j, "", "trainer"), "trainer", {"what", "flops_per_s"});
  p.trainer = r.text(tr, "trainer", "what");
  p.trainer_flops_per_s = r.number(tr, "trainer", "flops_per_s", 0);
  return p;
}

MachineProfile read_profile(const std::string& path) {
  std::ifstream in(path);
  ZERO_CHECK(in.good(), kIO, "machine profile: cannot read '", path, "'");
  std::ostringstream s;
  s << in.rdbuf();
  return profile_from_json(s.str(), path);
}

void write_profile(const MachineProfile& p, const std::string& path) {
  p.validate();
  std::ofstream out(path, std::ios::trunc);
  ZERO_CHECK(out.good(), kIO, "machine profile: cannot write '", path, "'");
  out << to_json(p);
  out.flush();
  ZERO_CHECK(out.good(), kIO, "machine profile: short write to '", path, "'");
}

}  // namespace zero
