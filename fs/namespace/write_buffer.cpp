#include "fs/namespace/write_buffer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "codec/error.hpp"

namespace ckpt::fs {
namespace {

[[noreturn]] void throw_errno(int err, const std::string& what) {
  throw io_error(err, what + ": " + std::strerror(err));
}

void pwrite_all(int fd, const std::byte* p, std::size_t n, std::uint64_t off) {
  while (n) {
    ssize_t w = ::pwrite(fd, p, n, off_t(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "staging file write");
    }
    p += w;
    n -= std::size_t(w);
    off += std::uint64_t(w);
  }
}

}  // namespace

write_buffer::write_buffer(memory_budget& budget, std::string staging_dir)
    : budget_(budget), staging_dir_(std::move(staging_dir)) {}

write_buffer::~write_buffer() {
  for (auto& c : chunks_) budget_.recycle(std::move(c.mem));
  budget_.give(taken_);
  if (fd_ >= 0) ::close(fd_);
}

void write_buffer::spill() {
  int fd = ::open(staging_dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {  // filesystems without O_TMPFILE: create and unlink at once
    std::string tmpl = staging_dir_ + "/buf.XXXXXX";
    fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) throw_errno(errno, "cannot create a staging file in " + staging_dir_);
    ::unlink(tmpl.c_str());
  }
  fd_ = fd;
  try {
    if (::ftruncate(fd_, off_t(size_)) != 0) throw_errno(errno, "staging file truncate");
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      if (!chunks_[i].mem) continue;
      std::uint64_t off = std::uint64_t(i) * chunk_bytes;
      std::size_t n =
          std::size_t(std::min<std::uint64_t>(chunks_[i].filled, size_ > off ? size_ - off : 0));
      pwrite_all(fd_, chunks_[i].mem.data(), n, off);  // the rest of the file is sparse zeros
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  for (auto& c : chunks_) budget_.recycle(std::move(c.mem));
  chunks_.clear();
  chunks_.shrink_to_fit();
  budget_.give(taken_);
  taken_ = 0;
}

void write_buffer::ensure_chunk(std::size_t index) {
  if (index >= chunks_.size()) chunks_.resize(index + 1);
  if (chunks_[index].mem) return;
  if (!budget_.try_take(chunk_bytes)) {
    spill();
    return;
  }
  try {
    chunks_[index].mem = budget_.take_chunk();
  } catch (...) {
    budget_.give(chunk_bytes);
    throw;
  }
  chunks_[index].filled = 0;
  taken_ += chunk_bytes;
}

void write_buffer::write(std::uint64_t offset, std::span<const std::byte> data) {
  if (data.empty()) return;
  std::uint64_t end = offset + data.size();
  if (fd_ < 0) {
    std::size_t pos = 0;
    while (pos < data.size() && fd_ < 0) {
      std::uint64_t off = offset + pos;
      std::size_t idx = std::size_t(off / chunk_bytes);
      ensure_chunk(idx);
      if (fd_ >= 0) break;
      std::size_t in = std::size_t(off % chunk_bytes);
      std::size_t n = std::min(chunk_bytes - in, data.size() - pos);
      chunk& c = chunks_[idx];
      if (in > c.filled) std::memset(c.mem.data() + c.filled, 0, in - c.filled);  // a gap
      std::memcpy(c.mem.data() + in, data.data() + pos, n);
      c.filled = std::max(c.filled, in + n);
      pos += n;
    }
    if (fd_ < 0) {
      size_ = std::max(size_, end);
      return;
    }
    // Spilled half-way: the rest (and, harmlessly, the part already copied) goes to the file.
  }
  pwrite_all(fd_, data.data(), data.size(), offset);
  size_ = std::max(size_, end);
}

std::size_t write_buffer::read(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset >= size_) return 0;
  std::size_t total = std::size_t(std::min<std::uint64_t>(out.size(), size_ - offset));
  if (fd_ >= 0) {
    std::size_t done = 0;
    while (done < total) {
      ssize_t r = ::pread(fd_, out.data() + done, total - done, off_t(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw_errno(errno, "staging file read");
      }
      if (r == 0) {  // a sparse tail: zeros
        std::memset(out.data() + done, 0, total - done);
        break;
      }
      done += std::size_t(r);
    }
    return total;
  }
  std::size_t pos = 0;
  while (pos < total) {
    std::uint64_t off = offset + pos;
    std::size_t idx = std::size_t(off / chunk_bytes);
    std::size_t in = std::size_t(off % chunk_bytes);
    std::size_t n = std::min(chunk_bytes - in, total - pos);
    std::size_t have = 0;  // bytes of data (the rest of the range reads as zeros)
    if (idx < chunks_.size() && chunks_[idx].mem && chunks_[idx].filled > in)
      have = std::min(n, chunks_[idx].filled - in);
    if (have) std::memcpy(out.data() + pos, chunks_[idx].mem.data() + in, have);
    if (have < n) std::memset(out.data() + pos + have, 0, n - have);
    pos += n;
  }
  return total;
}

void write_buffer::truncate(std::uint64_t size) {
  if (fd_ >= 0) {
    if (::ftruncate(fd_, off_t(size)) != 0) throw_errno(errno, "staging file truncate");
    size_ = size;
    return;
  }
  if (size < size_) {
    // Free whole chunks past the end and cut the last one's data at the new end, so that
    // growing the file again reads zeros there.
    std::size_t keep = std::size_t((size + chunk_bytes - 1) / chunk_bytes);
    for (std::size_t i = keep; i < chunks_.size(); ++i) {
      if (chunks_[i].mem) {
        budget_.recycle(std::move(chunks_[i].mem));
        budget_.give(chunk_bytes);
        taken_ -= chunk_bytes;
      }
    }
    if (chunks_.size() > keep) chunks_.resize(keep);
    std::size_t in = std::size_t(size % chunk_bytes);
    if (in && keep && chunks_.size() >= keep)
      chunks_[keep - 1].filled = std::min(chunks_[keep - 1].filled, in);
  }
  size_ = size;
}

format::source write_buffer::source() const {
  return format::source(size_, [this](std::uint64_t off, std::span<std::byte> out) {
    if (read(off, out) != out.size()) throw io_error(EIO, "write buffer shorter than its size");
  });
}

}  // namespace ckpt::fs
