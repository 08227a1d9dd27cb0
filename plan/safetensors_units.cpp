// units_from_safetensors(): a model's units read off a safetensors header (zero/plan/choose.hpp).
// The headers are read through the checkpoint layer's reader (ckpt/safetensors.hpp), which checks
// every number and never reads the data.
#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "ckpt/safetensors.hpp"
#include "zero/core/error.hpp"
#include "zero/plan/choose.hpp"

namespace zero {

namespace {

// Natural order: digit runs compare as numbers ("layers.2" before "layers.10").
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      const std::size_t xz = x.find_first_not_of('0'), yz = y.find_first_not_of('0');
      const std::string xs = xz == std::string::npos ? "" : x.substr(xz);
      const std::string ys = yz == std::string::npos ? "" : y.substr(yz);
      if (xs.size() != ys.size()) return xs.size() < ys.size();
      if (xs != ys) return xs < ys;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

bool is_float(const std::string& dtype_name) {
  return dtype_name == "F64" || dtype_name == "F32" || dtype_name == "F16" ||
         dtype_name == "BF16" || dtype_name.rfind("F8_", 0) == 0;
}

}  // namespace

std::string unit_of_tensor(const std::string& tensor, const std::string& unit_pattern) {
  std::regex re;
  try {
    re = std::regex(unit_pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    ZERO_THROW(kConfig, "unit pattern '", unit_pattern, "': not a regular expression: ", e.what());
  }
  std::smatch m;
  if (std::regex_search(tensor, m, re)) {
    const std::string u = m.size() > 1 && m[1].matched ? m[1].str() : m[0].str();
    if (!u.empty()) return u;
  }
  const std::size_t dot = tensor.rfind('.');
  return dot == std::string::npos || dot == 0 ? tensor : tensor.substr(0, dot);
}

std::vector<UnitSpec> units_from_safetensors(const std::string& path,
                                             const std::string& unit_pattern) {
  (void)unit_of_tensor("", unit_pattern);  // a bad pattern is named before any file is read
  const ckpt::detail::SafetensorsSet set = ckpt::detail::open_safetensors(path);
  std::map<std::string, UnitSpec> units;
  for (const ckpt::detail::SafetensorsTensor& t : set.tensors) {
    if (!is_float(t.dtype_name) || t.numel == 0) continue;  // buffers and empty tensors
    ParamSpec p;
    p.name = t.name;
    p.shape = t.shape.empty() ? std::vector<std::int64_t>{1} : t.shape;  // a scalar: [1]
    const std::string u = unit_of_tensor(t.name, unit_pattern);
    UnitSpec& spec = units[u];
    spec.name = u;
    spec.params.push_back(std::move(p));
  }
  ZERO_CHECK(!units.empty(), kConfig, "safetensors '", path,
             "': no floating-point tensor to plan (", set.tensors.size(), " tensors)");
  std::vector<UnitSpec> out;
  for (auto& [name, spec] : units) {
    std::sort(spec.params.begin(), spec.params.end(),
              [](const ParamSpec& a, const ParamSpec& b) { return natural_less(a.name, b.name); });
    out.push_back(std::move(spec));
  }
  std::sort(out.begin(), out.end(),
            [](const UnitSpec& a, const UnitSpec& b) { return natural_less(a.name, b.name); });
  return out;
}

}  // namespace zero
