#pragma once
// Little-endian serialisation. The reader checks every length against what is left, so a lying
// header becomes a corrupt_error, never an out-of-bounds read.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "codec/error.hpp"

namespace ckpt::codec {

class byte_writer {
 public:
  explicit byte_writer(std::vector<std::byte>& out) : out_(out) {}

  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));  // x86-64 is little-endian
  }
  void put_bytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  // Reserves n bytes and returns their offset, for sizes that are known only later.
  std::size_t skip(std::size_t n) {
    const auto at = out_.size();
    out_.resize(at + n);
    return at;
  }
  template <class T>
  void put_at(std::size_t at, T v) {
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  std::size_t size() const { return out_.size(); }

 private:
  std::vector<std::byte>& out_;
};

class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> in) : in_(in) {}

  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::span<const std::byte> get_bytes(std::size_t n) {
    need(n);
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::size_t remaining() const { return in_.size() - pos_; }
  std::size_t position() const { return pos_; }

 private:
  void need(std::size_t n) const {
    if (n > in_.size() - pos_)
      throw corrupt_error("truncated: need " + std::to_string(n) + " bytes, have " +
                          std::to_string(in_.size() - pos_));
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

}  // namespace ckpt::codec
