// How config input may appear in messages (printable: every echo bounded and escaped) and the
// UTF-8 check every source passes (detail::utf8_error): shared by the reader
// (config/config.cpp) and the sources (config/config_builder.cpp).
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "config/config_reader.hpp"

namespace zero::detail {

std::string printable(std::string_view s, std::size_t max) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(s.size(), max) + 24);
  std::size_t i = 0;
  for (; i < s.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::optional<std::size_t> utf8_error(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // RFC 3629, table 3-7 of the Unicode standard: the lead byte fixes the length and the
    // range of the second byte (which excludes overlong forms, surrogates, > U+10FFFF).
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + len > n || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (b[i + k] < 0x80 || b[i + k] > 0xbf) return i;
    }
    i += len;
  }
  return std::nullopt;
}

}  // namespace zero::detail
