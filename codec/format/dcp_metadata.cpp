#include "codec/format/dcp_metadata.hpp"

#include <string_view>
#include <unordered_map>

#include "codec/error.hpp"

namespace ckpt::format {
namespace {

using kind = pickle_graph::kind;
constexpr std::size_t max_string = 4096;

// The state a dataclass was pickled with: the last dict among its object node's items (NEWOBJ
// with no arguments, then BUILD). Null for anything else.
const pickle_graph::node* state_of(const pickle_graph& g, const pickle_graph::node& obj,
                                   std::uint32_t& state_index) {
  if (obj.k != kind::object) return nullptr;
  for (auto it = obj.items.rbegin(); it != obj.items.rend(); ++it)
    if (g.at(*it).k == kind::dict) {
      state_index = *it;
      return &g.at(*it);
    }
  return nullptr;
}

std::string text(const pickle_graph::node* n, const char* what) {
  if (!n || n->k != kind::string) throw corrupt_error(std::string("dcp metadata: no ") + what);
  if (n->s.empty() || n->s.size() > max_string)
    throw corrupt_error(std::string("dcp metadata: bad ") + what);
  return n->s;
}

std::uint64_t count(const pickle_graph::node* n, const char* what) {
  if (!n || n->k != kind::integer || n->big || n->i < 0)
    throw corrupt_error(std::string("dcp metadata: bad ") + what);
  return std::uint64_t(n->i);
}

}  // namespace

std::optional<std::vector<dcp_storage_item>> read_dcp_metadata(std::span<const std::byte> pickle,
                                                               const pickle_limits& limits) {
  const pickle_graph g = load_pickle_graph(pickle, limits);
  const auto& root = g.at(g.root);
  if (root.k != kind::object || !g.class_name(root).ends_with("\nMetadata")) return std::nullopt;
  std::uint32_t state = 0;
  if (!state_of(g, root, state)) throw corrupt_error("dcp metadata: a Metadata without state");
  const auto* storage = g.get(state, "storage_data");
  if (!storage || storage->k != kind::dict)
    throw corrupt_error("dcp metadata: no storage_data dict");
  // Keys and values are read once per distinct object and per distinct state dict: a pickle may
  // name one object, or one state, from many entries (the memo), and reading a state scans it.
  // The items' strings together stay under max_name_bytes, their number under max_items: what
  // a pickle of a few MB cannot multiply past.
  std::unordered_map<std::uint32_t, std::uint32_t> state_by_object;
  const auto state_index = [&](std::uint32_t n) {
    auto [it, fresh] = state_by_object.try_emplace(n);
    if (fresh && !state_of(g, g.at(n), it->second))
      throw corrupt_error("dcp metadata: storage_data is not MetadataIndex -> _StorageInfo");
    return it->second;
  };
  std::unordered_map<std::uint32_t, std::string> fqns;                       // by state
  std::unordered_map<std::uint32_t, std::optional<dcp_storage_item>> infos;  // by state
  const auto fqn_of = [&](std::uint32_t n) -> const std::string& {
    const std::uint32_t st = state_index(n);
    auto [it, fresh] = fqns.try_emplace(st);
    if (fresh) it->second = text(g.get(st, "fqn"), "fqn");
    return it->second;
  };
  const auto info_of = [&](std::uint32_t n) -> const std::optional<dcp_storage_item>& {
    const std::uint32_t st = state_index(n);
    auto [it, fresh] = infos.try_emplace(st);
    if (!fresh) return it->second;
    if (const auto* t = g.get(st, "transform_descriptors");
        t && (t->k == kind::list || t->k == kind::tuple) && !t->items.empty())
      return it->second;  // stream transforms: not an archive
    dcp_storage_item item;
    item.relative_path = text(g.get(st, "relative_path"), "relative_path");
    item.offset = count(g.get(st, "offset"), "offset");
    item.length = count(g.get(st, "length"), "length");
    if (item.offset + item.length < item.offset) throw corrupt_error("dcp metadata: bad range");
    it->second = std::move(item);
    return it->second;
  };
  std::vector<dcp_storage_item> out;
  std::size_t string_bytes = 0;
  for (std::size_t k = 0; k + 1 < storage->items.size(); k += 2) {
    const auto& info = info_of(storage->items[k + 1]);
    const std::string& fqn = fqn_of(storage->items[k]);
    if (!info) continue;
    string_bytes += fqn.size() + info->relative_path.size();
    if (out.size() >= limits.max_items || string_bytes > limits.max_name_bytes)
      throw corrupt_error("dcp metadata: too many items");
    out.push_back(*info);
    out.back().fqn = fqn;
  }
  return out;
}

}  // namespace ckpt::format
