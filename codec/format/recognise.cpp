#include "codec/format/recognise.hpp"

#include <array>
#include <cstring>
#include <new>

#include "codec/error.hpp"

namespace ckpt::format {

bool is_candidate(element_type t, std::uint64_t bytes, const recognise_options& opt) noexcept {
  return codec_dtype(t).has_value() && bytes > 0 && bytes >= opt.min_compress_bytes;
}

layout recognise(const source& src, const recognise_options& opt) {
  const auto size = src.size();
  std::array<std::byte, 9> head{};
  if (size >= head.size()) src.read(0, head);
  const auto* h = reinterpret_cast<const char*>(head.data());
  try {
    if (size >= 4 && looks_like_zip(src)) {
      // A DCP shard whose first item is a tensor also starts with a torch archive.
      if (auto l = recognise_archive_sequence(src, opt)) return std::move(*l);
      return recognise_zip(src, opt);
    }
    if (size >= 10 && std::memcmp(h, "\x93NUMPY", 6) == 0) return recognise_npy(src, opt);
    if (size >= 10 && h[8] == '{') {
      try {
        return recognise_safetensors(src, opt);
      } catch (const corrupt_error&) {
        // Not safetensors after all: maybe a DCP shard whose byte items begin that way.
      }
    }
    if (auto l = recognise_archive_sequence(src, opt)) return std::move(*l);
    return opaque_layout(size, "not a recognised checkpoint format");
  } catch (const corrupt_error& e) {
    return opaque_layout(size, e.what());
  } catch (const std::bad_alloc&) {
    return opaque_layout(size, "out of memory while recognising");
  } catch (const std::length_error& e) {
    return opaque_layout(size, e.what());
  }
}

}  // namespace ckpt::format
