#pragma once
// A pickle stack machine for torch.save's data.pkl that executes nothing. It models just enough
// of the pickle virtual machine (stack, mark stack, memo, containers) to recover, for every
// storage named by a persistent id ('storage', torch.XStorage, key, location, numel), its type,
// element count, and the dict key paths of the tensors that view it. Every opcode of protocols
// 0-5 (CPython Lib/pickletools.py) is given its exact argument length and stack effect; calls
// (REDUCE, NEWOBJ, BUILD, ...) build inert "object" nodes. Work and memory are linear in the
// input and capped by pickle_limits; anything malformed or over a limit throws corrupt_error.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::format {

struct pickle_limits {
  std::size_t max_bytes = 64u << 20;  // data.pkl larger than this is not scanned
  std::size_t max_nodes = 1u << 20;   // values created
  std::size_t max_stack = 1u << 16;   // stack depth plus marks
  std::size_t max_path_depth = 64;    // deeper tensors are named by their storage key only
  std::size_t max_storages = 1u << 20;
  std::size_t max_items = 1u << 22;        // container children, in total
  std::size_t max_name_bytes = 16u << 20;  // tensor names, in total
};

struct pickle_storage {
  std::string key;        // "0", "1", ...: the record is <prefix>/data/<key>
  std::string type_name;  // "FloatStorage", "HalfStorage", "LongStorage", ...
  std::string location;   // "cpu", "cuda:0"
  std::uint64_t numel = 0;
  std::vector<std::string> names;    // tensors viewing this storage, in pickle order
  std::vector<std::uint64_t> shape;  // of the first tensor covering it whole and contiguous
};

struct pickle_scan {
  int protocol = 0;
  std::vector<pickle_storage> storages;  // in order of first appearance
};

pickle_scan scan_torch_pickle(std::span<const std::byte> pickle, const pickle_limits& limits = {});

// The inert value graph the same machine builds, for pickles other than torch's data.pkl (DCP's
// .metadata, dcp_metadata.hpp). Containers hold indices into `nodes`, so shared and
// self-referencing values stay one node. An object (REDUCE, NEWOBJ, INST, OBJ) keeps the node it
// was made from in `cls` (class_name: "module\nname" when that was a global), then its
// arguments and each BUILD's state in `items`, in that order. Same limits and errors as
// scan_torch_pickle.
struct pickle_graph {
  enum class kind : std::uint8_t {
    none,
    boolean,
    integer,
    floating,
    string,
    bytes,
    global,
    tuple,
    list,
    dict,
    set,
    object,
    storage,
    tensor,
    opaque
  };
  static constexpr std::uint32_t no_class = 0xffffffffu;
  struct node {
    kind k = kind::opaque;
    bool big = false;                  // an integer that does not fit in int64
    std::int64_t i = 0;                // integer, boolean; storage index for storage and tensor
    std::int64_t offset = 0;           // tensor: storage offset in elements
    std::string s;                     // string; global: module + '\n' + name
    std::uint32_t cls = no_class;      // object: the node of its class or callable
    std::vector<std::uint32_t> items;  // tuple/list/set/object children; dict: key, value, ...
    std::vector<std::int64_t> dims;    // tensor: size
    bool contiguous = false;           // tensor: C-contiguous strides
  };
  std::vector<node> nodes;
  std::uint32_t root = 0;

  // An object's class as "module\nname"; empty when it was not made from a global.
  std::string_view class_name(const node& obj) const {
    return obj.cls < nodes.size() && nodes[obj.cls].k == kind::global
               ? std::string_view(nodes[obj.cls].s)
               : std::string_view();
  }
  const node& at(std::uint32_t n) const { return nodes.at(n); }
  // The value under string key `key` of dict node `dict`; null if it is not a dict or lacks it.
  const node* get(std::uint32_t dict, std::string_view key) const;
};

pickle_graph load_pickle_graph(std::span<const std::byte> pickle, const pickle_limits& limits = {});

}  // namespace ckpt::format
