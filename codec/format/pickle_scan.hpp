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

}  // namespace ckpt::format
