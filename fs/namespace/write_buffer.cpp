#include "fs/namespace/write_buffer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "codec/error.hpp"
#include "fs/store/posix.hpp"

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

// Reads [off, off + n); bytes past the end of the (sparse) file read as zeros.
void pread_zeros(int fd, std::byte* p, std::size_t n, std::uint64_t off) {
  while (n) {
    ssize_t r = ::pread(fd, p, n, off_t(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "staging file read");
    }
    if (r == 0) {
      std::memset(p, 0, n);
      return;
    }
    p += r;
    n -= std::size_t(r);
    off += std::uint64_t(r);
  }
}

}  // namespace

write_buffer::write_buffer(std::shared_ptr<memory_budget> budget, std::string staging_dir)
    : budget_(std::move(budget)), staging_dir_(std::move(staging_dir)) {}

write_buffer::~write_buffer() {
  for (auto& c : chunks_) budget_->recycle(std::move(c.mem));
  budget_->give(taken_);
  uncount_spill(spilled_);
  if (fd_ >= 0) ::close(fd_);
}

void write_buffer::uncount_spill(std::uint64_t n) {
  n = std::min(n, spilled_);  // never more than this buffer counted
  spilled_ -= n;
  budget_->note_unspilled(n);
}

void write_buffer::open_staging() {
  try {
    fd_ = store::detail::open_unlinked(staging_dir_, "buf");
  } catch (const io_error& e) {
    // The daemon's staging directory is unusable (-o scratch= names a file, a read-only or
    // missing directory): to the writer that is an I/O error of the filesystem, which the FUSE
    // boundary logs, not ENOTDIR/EACCES/EROFS about a path of its own (answers it does not log).
    // A full disk stays ENOSPC.
    if (e.sys_errno() == ENOSPC || e.sys_errno() == EDQUOT) throw;
    throw io_error(EIO, e.what());
  }
}

write_buffer::chunk& write_buffer::place(std::size_t index) {
  if (index >= chunks_.size()) chunks_.resize(index + 1);
  chunk& c = chunks_[index];
  if (c.mem || c.in_file) return c;
  if (budget_->try_take(chunk_bytes)) {
    try {
      c.mem = budget_->take_chunk();
    } catch (...) {
      budget_->give(chunk_bytes);
      throw;
    }
    c.filled = 0;
    taken_ += chunk_bytes;
  } else {
    if (fd_ < 0) open_staging();
    c.in_file = true;  // the file reads zeros there until written
    spilled_ += chunk_bytes;
    budget_->note_spilled(chunk_bytes);
  }
  return c;
}

void write_buffer::write(std::uint64_t offset, std::span<const std::byte> data) {
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::uint64_t off = offset + pos;
    std::size_t in = std::size_t(off % chunk_bytes);
    std::size_t n = std::min(chunk_bytes - in, data.size() - pos);
    chunk& c = place(std::size_t(off / chunk_bytes));
    if (c.mem) {
      if (in > c.filled) std::memset(c.mem.data() + c.filled, 0, in - c.filled);  // a gap
      std::memcpy(c.mem.data() + in, data.data() + pos, n);
      c.filled = std::max(c.filled, in + n);
    } else {
      pwrite_all(fd_, data.data() + pos, n, off);
    }
    pos += n;
    size_ = std::max(size_, off + n);  // what was written counts even if a later piece fails
  }
}

std::size_t write_buffer::read(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset >= size_) return 0;
  std::size_t total = std::size_t(std::min<std::uint64_t>(out.size(), size_ - offset));
  std::size_t pos = 0;
  while (pos < total) {
    std::uint64_t off = offset + pos;
    std::size_t idx = std::size_t(off / chunk_bytes);
    std::size_t in = std::size_t(off % chunk_bytes);
    std::size_t n = std::min(chunk_bytes - in, total - pos);
    const chunk* c = idx < chunks_.size() ? &chunks_[idx] : nullptr;
    if (c && c->in_file) {
      pread_zeros(fd_, out.data() + pos, n, off);
    } else {
      std::size_t have = 0;  // bytes of data (the rest of the range reads as zeros)
      if (c && c->mem && c->filled > in) have = std::min(n, c->filled - in);
      if (have) std::memcpy(out.data() + pos, c->mem.data() + in, have);
      if (have < n) std::memset(out.data() + pos + have, 0, n - have);
    }
    pos += n;
  }
  return total;
}

void write_buffer::truncate(std::uint64_t size) {
  if (size < size_) {
    // Drop whole chunks past the end and cut the last one's data at the new end, so that
    // growing the file again reads zeros there.
    std::size_t keep = std::size_t((size + chunk_bytes - 1) / chunk_bytes);
    for (std::size_t i = keep; i < chunks_.size(); ++i) {
      if (chunks_[i].mem) {
        budget_->recycle(std::move(chunks_[i].mem));
        budget_->give(chunk_bytes);
        taken_ -= chunk_bytes;
      } else if (chunks_[i].in_file) {
        uncount_spill(chunk_bytes);
      }
    }
    if (chunks_.size() > keep) chunks_.resize(keep);
    std::size_t in = std::size_t(size % chunk_bytes);
    if (in && keep && chunks_.size() >= keep)
      chunks_[keep - 1].filled = std::min(chunks_[keep - 1].filled, in);
    if (fd_ >= 0 && ::ftruncate(fd_, off_t(size)) != 0) throw_errno(errno, "staging file truncate");
  }
  size_ = size;
}

void write_buffer::read_fully(std::uint64_t offset, std::span<std::byte> out) const {
  if (read(offset, out) != out.size()) throw io_error(EIO, "write buffer shorter than its size");
}

void write_buffer::overwrite(std::uint64_t offset, std::span<const std::byte> data) {
  if (offset > size_ || data.size() > size_ - offset)
    throw io_error(EINVAL, "overwrite past the end of a write buffer");
  modified_ = true;
  write(offset, data);
}

int write_buffer::backing_file() {
  if (fd_ < 0) open_staging();
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_errno(errno, "staging file stat");
  if (std::uint64_t(st.st_size) != size_ && ::ftruncate(fd_, off_t(size_)) != 0)
    throw_errno(errno, "staging file truncate");
  return fd_;
}

void write_buffer::copy_memory_to_file() const {
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    const chunk& c = chunks_[i];
    if (!c.mem || !c.filled) continue;
    const std::uint64_t off = std::uint64_t(i) * chunk_bytes;
    const std::size_t n = std::size_t(std::min<std::uint64_t>(c.filled, size_ - off));
    pwrite_all(fd_, c.mem.data(), n, off);  // past `filled` the file reads zeros (a hole)
  }
}

void write_buffer::drop_memory() {
  for (auto& c : chunks_) {
    if (!c.mem) continue;
    budget_->recycle(std::move(c.mem));
    c.in_file = true;
    c.filled = 0;
  }
  budget_->give(taken_);
  taken_ = 0;
  // The whole file is the published head image now: the head store counts it, not as a spill.
  uncount_spill(spilled_);
}

format::source write_buffer::source() const {
  return format::source(
      size_, [this](std::uint64_t off, std::span<std::byte> out) { read_fully(off, out); });
}

}  // namespace ckpt::fs
