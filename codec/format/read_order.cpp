#include "codec/format/read_order.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <utility>

namespace ckpt::format {

std::optional<std::uint64_t> storage_key(std::string_view name) noexcept {
  const auto slash = name.rfind('/');
  const std::string_view last = slash == std::string_view::npos ? name : name.substr(slash + 1);
  if (last.empty() || last.size() > 18) return std::nullopt;  // 18 digits cannot overflow
  std::uint64_t v = 0;
  for (char c : last) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + std::uint64_t(c - '0');
  }
  return v;
}

std::vector<std::size_t> read_order(const layout& l) {
  std::vector<std::size_t> order(l.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return l.tensors[a].offset < l.tensors[b].offset;
  });
  if (l.format != file_format::torch_zip) return order;
  // A torch tensor's payload is exactly its record's data: find the record by offset.
  std::unordered_map<std::uint64_t, std::string_view> record_at;
  for (const auto& m : l.members) record_at.emplace(m.data_offset, m.name);
  std::vector<std::pair<bool, std::uint64_t>> key(l.tensors.size(), {true, 0});  // unkeyed last
  for (std::size_t t = 0; t < l.tensors.size(); ++t) {
    const auto it = record_at.find(l.tensors[t].offset);
    if (it == record_at.end()) continue;
    if (const auto k = storage_key(it->second)) key[t] = {false, *k};
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  return order;
}

}  // namespace ckpt::format
