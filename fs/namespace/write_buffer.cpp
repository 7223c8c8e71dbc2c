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
      if (!chunks_[i]) continue;
      std::uint64_t off = std::uint64_t(i) * chunk_bytes;
      std::size_t n = std::size_t(std::min<std::uint64_t>(chunk_bytes, size_ - off));
      pwrite_all(fd_, chunks_[i].get(), n, off);
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  chunks_.clear();
  chunks_.shrink_to_fit();
  budget_.give(taken_);
  taken_ = 0;
}

void write_buffer::ensure_chunk(std::size_t index) {
  if (index >= chunks_.size()) chunks_.resize(index + 1);
  if (chunks_[index]) return;
  if (!budget_.try_take(chunk_bytes)) {
    spill();
    return;
  }
  taken_ += chunk_bytes;
  chunks_[index] = std::make_unique<std::byte[]>(chunk_bytes);  // zero-filled
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
      std::memcpy(chunks_[idx].get() + in, data.data() + pos, n);
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
    if (idx < chunks_.size() && chunks_[idx])
      std::memcpy(out.data() + pos, chunks_[idx].get() + in, n);
    else
      std::memset(out.data() + pos, 0, n);
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
    // Free whole chunks past the end and zero the tail of the last one, so that growing the file
    // again reads zeros there.
    std::size_t keep = std::size_t((size + chunk_bytes - 1) / chunk_bytes);
    for (std::size_t i = keep; i < chunks_.size(); ++i) {
      if (chunks_[i]) {
        budget_.give(chunk_bytes);
        taken_ -= chunk_bytes;
      }
    }
    if (chunks_.size() > keep) chunks_.resize(keep);
    std::size_t in = std::size_t(size % chunk_bytes);
    if (in && keep && chunks_.size() >= keep && chunks_[keep - 1])
      std::memset(chunks_[keep - 1].get() + in, 0, chunk_bytes - in);
  }
  size_ = size;
}

format::source write_buffer::source() const {
  return format::source(size_, [this](std::uint64_t off, std::span<std::byte> out) {
    if (read(off, out) != out.size()) throw io_error(EIO, "write buffer shorter than its size");
  });
}

}  // namespace ckpt::fs
