#pragma once
// Random access to the bytes of a finished file. Recognisers read headers through this interface
// and never load payloads, so a 100 GB checkpoint is recognised from a few kilobytes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ckpt::format {

// A read-only view of `size` bytes. read(offset, out) fills all of `out` or throws ckpt::error
// (errc::io for an operating-system failure). Callers never ask beyond size(); helpers below check.
class source {
 public:
  using read_fn = std::function<void(std::uint64_t offset, std::span<std::byte> out)>;

  source(std::uint64_t size, read_fn read) : size_(size), read_(std::move(read)) {}

  std::uint64_t size() const noexcept { return size_; }

  // Throws corrupt_error if [offset, offset + out.size()) is not inside the file: a parse problem.
  void read(std::uint64_t offset, std::span<std::byte> out) const;
  std::vector<std::byte> read(std::uint64_t offset, std::uint64_t length) const;

  // A source over [offset, offset + length) of this one (shares the reader).
  source slice(std::uint64_t offset, std::uint64_t length) const;

 private:
  std::uint64_t size_;
  read_fn read_;
};

// The bytes must outlive the source.
source memory_source(std::span<const std::byte> bytes);

// Opens `path` read-only; the descriptor is closed when the last copy of the source goes away.
source file_source(const std::string& path);

}  // namespace ckpt::format
