#include "comm/fingerprint.hpp"

namespace zero::detail {

namespace {
bool is_reduction(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}
}  // namespace

Fingerprint fingerprint_of(const CollectiveArgs& a) {
  Fingerprint f;
  f.seq = a.seq;
  f.count = a.count;
  f.tag = a.tag;
  f.tag_elements = a.tag_layout.elements;
  f.tag_digest = a.tag_layout.digest;
  f.root = a.kind == Collective::kBroadcast ? a.root : 0;
  f.kind = static_cast<std::uint8_t>(a.kind);
  f.dtype = static_cast<std::uint8_t>(a.dtype);
  f.op = is_reduction(a.kind) ? static_cast<std::uint8_t>(a.op) : 0;
  f.valid = 1;
  return f;
}

namespace {
bool same_layout(const Fingerprint& a, const Fingerprint& b) {
  return a.tag_elements == b.tag_elements && a.tag_digest == b.tag_digest;
}
// Everything but the tagged units' layout.
bool same_operation(const Fingerprint& a, const Fingerprint& b) {
  const auto kind = static_cast<Collective>(a.kind);
  return a.valid == b.valid && a.seq == b.seq && a.kind == b.kind && a.count == b.count &&
         a.dtype == b.dtype && a.tag == b.tag && (!is_reduction(kind) || a.op == b.op) &&
         (kind != Collective::kBroadcast || a.root == b.root);
}
}  // namespace

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return same_operation(a, b) && same_layout(a, b);
}

std::string to_string(const Fingerprint& f) {
  if (!f.valid) return "nothing";
  const auto kind = static_cast<Collective>(f.kind);
  std::string s = "seq ";
  s += std::to_string(f.seq);
  s += ' ';
  s += to_string(kind);
  if (kind != Collective::kBarrier) {
    s += '(';
    s += std::to_string(f.count);
    s += " x ";
    s += to_string(static_cast<DType>(f.dtype));
    if (is_reduction(kind)) {
      s += ", ";
      s += to_string(static_cast<ReduceOp>(f.op));
    }
    if (kind == Collective::kBroadcast) {
      s += ", root ";
      s += std::to_string(f.root);
    }
    s += ')';
  }
  if (f.tag >= 0) {
    s += " unit ";
    s += std::to_string(f.tag);
  } else {
    s += " no unit";
  }
  return s;
}

void check_same_call(const std::vector<Fingerprint>& all, const std::vector<int>& world_ranks,
                     const std::string& what) {
  for (std::size_t q = 1; q < all.size(); ++q) {
    ZERO_CHECK(same_operation(all[0], all[q]), kInvalidArgument, what,
               ": ranks disagree on the collective: rank ", world_ranks[0], " issued ",
               to_string(all[0]), ", rank ", world_ranks[q], " issued ", to_string(all[q]));
    ZERO_CHECK(same_layout(all[0], all[q]), kInvalidArgument, what,
               ": the ranks' models differ: at ", to_string(all[0]), ": rank ", world_ranks[0],
               " moves ", all[0].tag_elements, " parameter elements (before padding), rank ",
               world_ranks[q], " moves ", all[q].tag_elements,
               all[0].tag_elements == all[q].tag_elements
                   ? " in other parameter shapes, groups or frozen flags"
                   : "",
               "; every rank must declare the same units with the same parameters");
  }
}

}  // namespace zero::detail
