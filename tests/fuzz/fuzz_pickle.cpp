// libFuzzer target: the data.pkl scanner on arbitrary bytes (tests/fuzz/build_and_run.sh).
#include "codec/error.hpp"
#include "codec/format/pickle_scan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  ckpt::format::pickle_limits lim;
  lim.max_nodes = 1u << 16;
  try {
    const auto r = ckpt::format::scan_torch_pickle(bytes, lim);
    for (const auto& s : r.storages)
      if (s.key.empty() && s.names.size() > 64) __builtin_trap();
  } catch (const ckpt::corrupt_error&) {
  }
  return 0;
}
