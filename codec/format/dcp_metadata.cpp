#include "codec/format/dcp_metadata.hpp"

#include <string_view>
#include <unordered_map>
#include <unordered_set>

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

const std::string& text(const pickle_graph::node* n, const char* what) {
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
  // Nothing is copied out of the graph but the items kept, whose bytes (strings and the items
  // themselves) stay under max_name_bytes: what a pickle of a few MB cannot multiply past. A key
  // object named twice is one entry, as in the dict the pickle builds.
  std::unordered_map<std::uint32_t, std::uint32_t> state_by_object;
  const auto state_index = [&](std::uint32_t n) {
    auto [it, fresh] = state_by_object.try_emplace(n);
    if (fresh && !state_of(g, g.at(n), it->second))
      throw corrupt_error("dcp metadata: storage_data is not MetadataIndex -> _StorageInfo");
    return it->second;
  };
  struct info {
    const std::string* path = nullptr;  // null: stream transforms, not an archive
    std::uint64_t offset = 0, length = 0;
  };
  std::unordered_map<std::uint32_t, const std::string*> fqns;  // by state
  std::unordered_map<std::uint32_t, info> infos;               // by state
  const auto fqn_of = [&](std::uint32_t n) {
    const std::uint32_t st = state_index(n);
    auto [it, fresh] = fqns.try_emplace(st);
    if (fresh) it->second = &text(g.get(st, "fqn"), "fqn");
    return it->second;
  };
  const auto info_of = [&](std::uint32_t n) {
    const std::uint32_t st = state_index(n);
    auto [it, fresh] = infos.try_emplace(st);
    if (!fresh) return it->second;
    if (const auto* t = g.get(st, "transform_descriptors");
        t && (t->k == kind::list || t->k == kind::tuple) && !t->items.empty())
      return it->second;
    info i;
    i.path = &text(g.get(st, "relative_path"), "relative_path");
    i.offset = count(g.get(st, "offset"), "offset");
    i.length = count(g.get(st, "length"), "length");
    if (i.offset + i.length < i.offset) throw corrupt_error("dcp metadata: bad range");
    it->second = i;
    return i;
  };
  std::vector<dcp_storage_item> out;
  std::unordered_set<std::uint32_t> keys;
  std::size_t bytes = 0;
  for (std::size_t k = 0; k + 1 < storage->items.size(); k += 2) {
    if (!keys.insert(storage->items[k]).second) continue;
    const info i = info_of(storage->items[k + 1]);
    if (!i.path) continue;
    const std::string* fqn = fqn_of(storage->items[k]);
    bytes += sizeof(dcp_storage_item) + fqn->size() + i.path->size();
    if (bytes > limits.max_name_bytes) throw corrupt_error("dcp metadata: too many items");
    out.push_back({*fqn, *i.path, i.offset, i.length});
  }
  return out;
}

}  // namespace ckpt::format
