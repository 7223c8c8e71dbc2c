#include "codec/format/dcp_metadata.hpp"

#include <string_view>

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
  if (root.k != kind::object || !root.s.ends_with("\nMetadata")) return std::nullopt;
  std::uint32_t state = 0;
  if (!state_of(g, root, state)) throw corrupt_error("dcp metadata: a Metadata without state");
  const auto* storage = g.get(state, "storage_data");
  if (!storage || storage->k != kind::dict)
    throw corrupt_error("dcp metadata: no storage_data dict");
  std::vector<dcp_storage_item> out;
  for (std::size_t k = 0; k + 1 < storage->items.size(); k += 2) {
    std::uint32_t key_state = 0, value_state = 0;
    if (!state_of(g, g.at(storage->items[k]), key_state) ||
        !state_of(g, g.at(storage->items[k + 1]), value_state))
      throw corrupt_error("dcp metadata: storage_data is not MetadataIndex -> _StorageInfo");
    if (const auto* t = g.get(value_state, "transform_descriptors");
        t && (t->k == kind::list || t->k == kind::tuple) && !t->items.empty())
      continue;
    dcp_storage_item item;
    item.fqn = text(g.get(key_state, "fqn"), "fqn");
    item.relative_path = text(g.get(value_state, "relative_path"), "relative_path");
    item.offset = count(g.get(value_state, "offset"), "offset");
    item.length = count(g.get(value_state, "length"), "length");
    if (item.offset + item.length < item.offset) throw corrupt_error("dcp metadata: bad range");
    out.push_back(std::move(item));
  }
  return out;
}

}  // namespace ckpt::format
