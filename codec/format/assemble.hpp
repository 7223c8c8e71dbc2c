#pragma once
// Served-file assembly: the bytes a reader sees for a recognised file whose payloads were
// replaced (by the codec's reconstruction). Same size and offsets as the written file; opaque
// bytes come from the original; the zip CRC-32 fields of members whose payloads were replaced are
// rewritten to the CRC of the served member bytes (a field written as 0 stays 0).
// Random access: read() any range, in any order, from any number of threads.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "codec/format/layout.hpp"
#include "codec/format/source.hpp"

namespace ckpt::format {

// Fills `out` with bytes [offset, offset + out.size()) of tensor `tensor`'s served payload.
// Called only for replaced tensors and only with ranges inside the payload.
using payload_reader =
    std::function<void(std::size_t tensor, std::uint64_t offset, std::span<std::byte> out)>;

class served_file {
 public:
  // `original` provides every byte not replaced (opaque segments, unreplaced tensors).
  // replaced[i] says whether tensor i (index into l.tensors) is served from `payload`.
  served_file(layout l, source original, std::vector<bool> replaced, payload_reader payload);

  std::uint64_t size() const noexcept { return layout_.file_size; }
  const format::layout& get_layout() const noexcept { return layout_; }

  // Like pread: fills min(out.size(), size() - offset) bytes and returns that count.
  std::size_t read(std::uint64_t offset, std::span<std::byte> out) const;

  // The CRC-32 of member m's served bytes, computed once (reads the member) and cached. The
  // filesystem may call this at encode time and keep the value.
  std::uint32_t member_crc(std::size_t m) const;
  // Supplies a CRC computed elsewhere (e.g. stored with the encoded file).
  void set_member_crc(std::size_t m, std::uint32_t crc);

 private:
  void read_raw(std::uint64_t offset, std::span<std::byte> out) const;  // without CRC fix-ups

  format::layout layout_;
  source original_;
  std::vector<bool> replaced_;
  payload_reader payload_;
  std::vector<bool> member_dirty_;  // member holds a replaced payload
  std::unique_ptr<std::mutex> crc_mu_ = std::make_unique<std::mutex>();
  mutable std::vector<std::optional<std::uint32_t>> crc_cache_;
};

// Convenience for tests and tools: replacement payloads held in memory (empty = not replaced).
served_file make_served_file(layout l, source original,
                             std::vector<std::vector<std::byte>> replacements);

}  // namespace ckpt::format
