// libFuzzer target: recognise_archive_sequence() (DCP shards) on arbitrary bytes
// (tests/fuzz/build_and_run.sh).
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return ckpt::format::fuzz::run(data, size, [](const auto& src, const auto& opt) {
    auto l = ckpt::format::recognise_archive_sequence(src, opt);
    return l ? std::move(*l) : ckpt::format::opaque_layout(src.size(), "no archives");
  });
}
