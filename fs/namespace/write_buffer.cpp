#include "fs/namespace/write_buffer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

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

// Direct I/O (O_DIRECT) moves whole chunks between chunk memory (page-aligned) and the disk
// without the page cache: copying a checkpoint's worth of bytes into freshly allocated
// page-cache pages cost the daemon more CPU than its encode (perf of a 4 GiB delta save on the
// 2-core VM: 35-41% of its CPU in copy_folio_from_iter_atomic; the same bytes written direct
// cost 0.2 s of CPU for 4 GiB, docs/benchmarks.md). Offsets and lengths of direct transfers are
// multiples of kDirectAlign.
constexpr std::size_t kDirectAlign = 4096;

// One chunk of aligned memory per thread that moves chunks by direct I/O (FUSE workers,
// streams), inside the daemon's fixed overhead; used within one call at a time.
std::byte* bounce_chunk() {
  struct free_deleter {
    void operator()(std::byte* b) const { std::free(b); }
  };
  thread_local std::unique_ptr<std::byte, free_deleter> bounce;
  if (!bounce) {
    bounce.reset(static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, chunk_memory::bytes)));
    if (!bounce) throw std::bad_alloc();
  }
  return bounce.get();
}

// Reads [off, off + n) of a chunk written directly, through an aligned bounce buffer: the
// destination is the caller's (any alignment), and the file range is widened to whole blocks
// inside the chunk. Bytes past the end of the file read as zeros. False when the filesystem
// refuses the transfer (EINVAL): the caller reads through the page cache instead, which is
// coherent with direct writes.
bool pread_direct(int dfd, std::byte* p, std::size_t n, std::uint64_t off,
                  std::uint64_t chunk_end) {
  std::byte* const bounce = bounce_chunk();
  const std::uint64_t from = off / kDirectAlign * kDirectAlign;
  const std::uint64_t to =
      std::min(chunk_end, (off + n + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
  const std::size_t len = std::size_t(to - from);
  ssize_t r;
  do {
    r = ::pread(dfd, bounce, len, off_t(from));
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    if (errno == EINVAL) return false;
    throw_errno(errno, "staging file read");
  }
  // Short only at the end of the file (a truncate inside the chunk): zeros from there.
  if (std::size_t(r) < len) std::memset(bounce + r, 0, len - std::size_t(r));
  std::memcpy(p, bounce + (off - from), n);
  return true;
}

// Writes one whole chunk of aligned memory at `off` (a chunk boundary) by direct I/O. False when
// the filesystem refuses the transfer (EINVAL) or writes short: the caller writes through the
// page cache instead.
bool pwrite_chunk_direct(int dfd, const std::byte* aligned, std::uint64_t off) {
  ssize_t w;
  do {
    w = ::pwrite(dfd, aligned, chunk_memory::bytes, off_t(off));
  } while (w < 0 && errno == EINTR);
  if (w == ssize_t(chunk_memory::bytes)) return true;
  if (w < 0 && errno != EINVAL) throw_errno(errno, "staging file write");
  return false;
}

// The same from memory of any alignment, through the bounce buffer: a copy in memory instead of
// one into fresh page-cache pages.
bool pwrite_direct(int dfd, const std::byte* p, std::uint64_t off) {
  std::byte* const bounce = bounce_chunk();
  std::memcpy(bounce, p, chunk_memory::bytes);
  return pwrite_chunk_direct(dfd, bounce, off);
}

}  // namespace

write_buffer::write_buffer(std::shared_ptr<memory_budget> budget, std::string staging_dir)
    : budget_(std::move(budget)), staging_dir_(std::move(staging_dir)) {}

write_buffer::~write_buffer() {
  for (auto& [i, c] : chunks_) budget_->recycle(std::move(c.mem));
  if (spare_) budget_->recycle(std::move(spare_));
  budget_->give(taken_);
  uncount_spill(spilled_);
  if (dfd_ >= 0) ::close(dfd_);
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
    // The same file again for direct I/O; where the filesystem refuses it, every transfer goes
    // through the page cache.
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    dfd_ = ::open(self.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  } catch (const io_error& e) {
    // The daemon's staging directory is unusable (-o scratch= names a file, a read-only or
    // missing directory): to the writer that is an I/O error of the filesystem, which the FUSE
    // boundary logs, not ENOTDIR/EACCES/EROFS about a path of its own (answers it does not log).
    // A full disk stays ENOSPC.
    if (e.sys_errno() == ENOSPC || e.sys_errno() == EDQUOT) throw;
    throw io_error(EIO, e.what());
  }
}

write_buffer::chunk& write_buffer::place(std::uint64_t index) {
  // An entry may exist without memory or file space: a hole punched over the base, which must
  // stay one if this call fails (erasing it would let the base's bytes show through again).
  const auto [at, inserted] = chunks_.try_emplace(index);
  chunk& c = at->second;
  if (c.mem || c.in_file) return c;
  const auto undo = [&, at = at, inserted = inserted] {
    if (inserted) chunks_.erase(at);
  };
  if (budget_->try_take(chunk_bytes)) {
    try {
      c.mem = budget_->take_chunk();
    } catch (...) {
      budget_->give(chunk_bytes);
      undo();
      throw;
    }
    c.filled = 0;
    taken_ += chunk_bytes;
  } else if (const auto old = spare_ ? chunks_.end() : reusable_chunk();
             spare_ || old != chunks_.end()) {
    // The memory of a chunk the stream is done with (moved to the file by wait_for_room()
    // already, spare_, without the filesystem's lock, or here), or of a full chunk of a file no
    // stream follows.
    try {
      if (!spare_) make_spare(old);
    } catch (...) {
      undo();
      throw;
    }
    c.mem = std::move(spare_);
    c.filled = 0;
  } else {
    try {
      if (fd_ < 0) open_staging();
    } catch (...) {
      undo();
      throw;
    }
    c.in_file = true;  // the file reads zeros there until written (punch_hole() and
                       // truncate() clear what they drop of it)
    spilled_ += chunk_bytes;
    budget_->note_spilled(chunk_bytes);
  }
  return c;
}

void write_buffer::set_base(std::shared_ptr<const content_reader> base, std::uint64_t version,
                            std::vector<std::pair<std::uint64_t, std::uint64_t>> base_runs) {
  std::unique_lock lock(mu_);
  if (!chunks_.empty() || size_ != 0) throw io_error(EINVAL, "set_base on a written buffer");
  unstreamable_ = true;
  size_ = base_limit_ = base->size();
  base_ = std::move(base);
  base_version_ = version;
  base_runs_ = std::move(base_runs);
}

void write_buffer::make_spare(std::map<std::uint64_t, chunk>::iterator old) {
  // Its bytes go to the file now (they would at the head's publication anyway), its memory to
  // spare_: the budget is unchanged, one more chunk counts as spilled.
  if (fd_ < 0) open_staging();
  // By direct I/O also a chunk the stream has yet to read (newest_full_chunk()), which it then
  // reads from the disk: through the page cache the writes cost the daemon more CPU than the
  // read saved whenever the host was short of free memory (docs/benchmarks.md, "DCP shards
  // streamed with head images off").
  old->second.direct = write_to_file(old->first, old->second);
  spare_ = std::move(old->second.mem);
  old->second.in_file = true;
  old->second.filled = 0;
  spilled_ += chunk_bytes;
  budget_->note_spilled(chunk_bytes);
}

bool write_buffer::write_to_file(std::uint64_t index, const chunk& c) const {
  const std::uint64_t off = index * chunk_bytes;
  const std::size_t n = std::size_t(std::min<std::uint64_t>(c.filled, size_ - off));
  // Chunk memory is page-aligned: straight from it, no bounce.
  if (dfd_ >= 0 && n == chunk_bytes && pwrite_chunk_direct(dfd_, c.mem.data(), off)) return true;
  pwrite_all(fd_, c.mem.data(), n, off);  // past `filled` the file reads zeros (a hole)
  return false;
}

std::map<std::uint64_t, write_buffer::chunk>::iterator write_buffer::reusable_chunk() {
  const stream_state st = stream_.load();
  if (st != stream_state::open && st != stream_state::complete) return full_chunk();
  const auto settled = settled_chunk();
  return settled != chunks_.end() ? settled : newest_full_chunk();
}

std::map<std::uint64_t, write_buffer::chunk>::iterator write_buffer::newest_full_chunk() {
  // A sequential writer's newest full chunk is the one before the chunk being placed; a few
  // more are looked at for writes a little out of order, no more (this runs for every chunk
  // placed past the budget, and a writer far from sequential spills raw instead).
  constexpr int kLook = 8;
  int looked = 0;
  for (auto it = chunks_.rbegin(); it != chunks_.rend() && looked < kLook; ++it, ++looked)
    if (it->second.mem && it->second.filled == chunk_bytes) return std::prev(it.base());
  return chunks_.end();
}

std::map<std::uint64_t, write_buffer::chunk>::iterator write_buffer::full_chunk() {
  // evicted_below_ as for settled_chunk(): below it no chunk is both in memory and full.
  auto it = chunks_.lower_bound(evicted_below_);
  while (it != chunks_.end() && !(it->second.mem && it->second.filled == chunk_bytes)) ++it;
  if (it != chunks_.end()) evicted_below_ = it->first;
  return it;
}

std::map<std::uint64_t, write_buffer::chunk>::iterator write_buffer::settled_chunk() {
  // Only while a stream follows the file; a stale one still counts (its reads are done, and
  // moving bytes to the file never changes them).
  const stream_state st = stream_.load();
  if (st != stream_state::open && st != stream_state::complete) return chunks_.end();
  auto it = chunks_.lower_bound(evicted_below_);
  for (; it != chunks_.end() && (it->first + 1) * chunk_bytes <= settled_; ++it)
    if (it->second.mem) break;
  if (it == chunks_.end() || (it->first + 1) * chunk_bytes > settled_) {
    // None in memory below here; chunks placed later may be (settle() of the whole file runs
    // ahead of the writer), so never past the chunks there are.
    const std::uint64_t next = chunks_.empty() ? 0 : chunks_.rbegin()->first + 1;
    evicted_below_ = std::max(evicted_below_, std::min(settled_ / chunk_bytes, next));
    return chunks_.end();
  }
  evicted_below_ = it->first;
  return it;
}

void write_buffer::settle(std::uint64_t end) {
  std::unique_lock lock(mu_);
  if (stream_.load() == stream_state::open || stream_.load() == stream_state::complete)
    settled_ = std::max(settled_, end);
  room_cv_.notify_all();
}

void write_buffer::wait_for_room(std::uint64_t offset, std::size_t n) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stream_.load() != stream_state::open || stale_ || stream_waits_) return;
    bool needs_chunk = false;
    for (std::uint64_t i = offset / chunk_bytes; i * chunk_bytes < offset + n; ++i)
      needs_chunk |= !chunks_.count(i);
    if (!needs_chunk || spare_ || budget_->used() + chunk_bytes <= budget_->limit()) return;
    if (const auto old = settled_chunk(); old != chunks_.end()) {
      // Moved to the file here, where the writer holds no filesystem lock: a slow disk then
      // delays this writer only.
      make_spare(old);
      return;
    }
    // After a wait that saw nothing settled, none until the stream settles again: a stream
    // stuck for long (another put of its lineage holds the lineage, every encode slot is
    // taken) costs its writer a second a stall, not one a chunk; one that moves again paces it
    // again (a single stall used to leave the rest of a 100 GB file spilled raw).
    if (no_wait_until_past_ && settled_ <= *no_wait_until_past_) return;
    // Only a chunk of ours in memory that the stream has yet to settle can give memory back.
    auto it = chunks_.lower_bound(settled_ / chunk_bytes);
    while (it != chunks_.end() && !it->second.mem) ++it;
    if (it == chunks_.end()) return;
    const std::uint64_t before = settled_;
    if (room_cv_.wait_for(lock, kRoomWait) == std::cv_status::timeout && settled_ == before) {
      no_wait_until_past_ = settled_;
      return;
    }
  }
}

bool write_buffer::from_base(std::uint64_t index) const {
  return base_ && index * chunk_bytes < base_limit_ && !chunks_.count(index);
}

write_buffer::chunk& write_buffer::own(std::uint64_t index) {
  if (!from_base(index)) return place(index);
  // Read the base's bytes first: a failed read leaves the chunk reading from the base.
  const std::uint64_t from = index * chunk_bytes;
  const std::size_t n = std::size_t(std::min<std::uint64_t>(chunk_bytes, base_limit_ - from));
  std::vector<std::byte> bytes(n);
  if (base_->read(from, bytes) != n) throw io_error(EIO, "base version read short");
  chunk& c = place(index);
  if (c.mem) {
    std::memcpy(c.mem.data(), bytes.data(), n);
    c.filled = n;
  } else {
    try {
      pwrite_all(fd_, bytes.data(), n, from);
    } catch (...) {
      // The chunk reads from the base again: as an own chunk in the file it would read what
      // the failed write left there (zeros) for good. (place() inserted it: it read from the
      // base.) Whatever part of it was written is punched out, best effort: a chunk placed in
      // the file later reads zeros until written.
      [[maybe_unused]] const int punched =
          ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(from), off_t(n));
      drop_chunk(c);
      chunks_.erase(index);
      throw;
    }
  }
  return c;
}

void write_buffer::materialize_base() {
  if (!base_) return;
  for (const auto& [from, to] : base_runs_) {
    for (std::uint64_t i = from / chunk_bytes; i * chunk_bytes < std::min(to, base_limit_); ++i)
      if (from_base(i)) own(i);
  }
  base_.reset();
  base_runs_.clear();
  base_limit_ = 0;
}

write_buffer::unchanged_ranges write_buffer::unchanged() const {
  std::shared_lock lock(mu_);
  unchanged_ranges u;
  if (!base_ || modified_) return u;
  u.version = base_version_;
  for (const auto& [from, to] : base_runs_) {
    for (std::uint64_t i = from / chunk_bytes; i * chunk_bytes < std::min(to, base_limit_); ++i) {
      if (!from_base(i)) continue;
      const std::uint64_t a = i * chunk_bytes;
      const std::uint64_t b = std::min({a + chunk_bytes, base_limit_, size_});
      // Two runs may share a chunk (a file extended by truncate): emitted once, ascending.
      if (!u.ranges.empty() && a < u.ranges.back().second) continue;
      if (!u.ranges.empty() && u.ranges.back().second == a)
        u.ranges.back().second = b;
      else
        u.ranges.emplace_back(a, b);
    }
  }
  return u;
}

void write_buffer::drop_chunk(chunk& c) {
  if (c.mem) {
    budget_->recycle(std::move(c.mem));
    budget_->give(chunk_bytes);
    taken_ -= chunk_bytes;
  } else if (c.in_file) {
    uncount_spill(chunk_bytes);
  }
  c.in_file = false;
  c.direct = false;
  c.filled = 0;
}

void write_buffer::write(std::uint64_t offset, std::span<const std::byte> data) {
  std::unique_lock lock(mu_);
  if (stream_.load() == stream_state::open) check_stream_overlap(offset, data);
  // A write that fails part-way moves no mark: the stream waits for those bytes again (or for
  // the file's end).
  write_locked(offset, data);
  note_written(offset, offset + data.size());
}

void write_buffer::check_stream_overlap(std::uint64_t offset, std::span<const std::byte> data) {
  if (stale_ || offset >= consumed_) return;
  const std::size_t n = std::size_t(std::min<std::uint64_t>(data.size(), consumed_ - offset));
  std::vector<std::byte> old(n);
  // The same bytes again (a client that rewrites what it wrote) leave the stream good.
  if (read_locked(offset, old) != n || std::memcmp(old.data(), data.data(), n) != 0) {
    stale_ = true;
    written_cv_.notify_all();
    room_cv_.notify_all();
  }
}

void write_buffer::note_written(std::uint64_t offset, std::uint64_t end) {
  if (unstreamable_ || end <= offset) return;
  if (offset > contiguous_) {
    // Runs ahead of the mark, merged with their neighbours: two writers filling one file in
    // two sequential halves keep two runs, not one per write.
    auto it = ahead_.upper_bound(offset);
    if (it != ahead_.begin() && std::prev(it)->second >= offset) {
      it = std::prev(it);
      it->second = std::max(it->second, end);
    } else {
      it = ahead_.emplace_hint(it, offset, end);
    }
    for (auto next = std::next(it); next != ahead_.end() && next->first <= it->second;) {
      it->second = std::max(it->second, next->second);
      next = ahead_.erase(next);
    }
    if (ahead_.size() > kAheadMax) {  // not a sequential writer: give up following it
      unstreamable_ = true;
      ahead_.clear();
      written_cv_.notify_all();
    }
    return;
  }
  const std::uint64_t before = contiguous_;
  contiguous_ = std::max(contiguous_, end);
  while (!ahead_.empty() && ahead_.begin()->first <= contiguous_) {
    contiguous_ = std::max(contiguous_, ahead_.begin()->second);
    ahead_.erase(ahead_.begin());
  }
  if (contiguous_ != before && stream_.load() == stream_state::open) written_cv_.notify_all();
}

void write_buffer::write_locked(std::uint64_t offset, std::span<const std::byte> data) {
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::uint64_t off = offset + pos;
    std::size_t in = std::size_t(off % chunk_bytes);
    std::size_t n = std::min(chunk_bytes - in, data.size() - pos);
    // A whole chunk overwritten needs nothing from the base.
    chunk& c = n == chunk_bytes ? place(off / chunk_bytes) : own(off / chunk_bytes);
    if (c.mem) {
      if (in > c.filled) std::memset(c.mem.data() + c.filled, 0, in - c.filled);  // a gap
      std::memcpy(c.mem.data() + in, data.data() + pos, n);
      c.filled = std::max(c.filled, in + n);
    } else if (n == chunk_bytes && dfd_ >= 0 && pwrite_direct(dfd_, data.data() + pos, off)) {
      c.direct = true;  // a whole chunk in the file (the reconstruction over a spilled one)
    } else {
      pwrite_all(fd_, data.data() + pos, n, off);
    }
    pos += n;
    // What was written counts even if a later piece fails. Stored only when it grows: the
    // stream's overwrite() never does, and size() is read without this buffer's lock.
    if (off + n > size_) size_ = off + n;
  }
}

std::size_t write_buffer::read(std::uint64_t offset, std::span<std::byte> out) const {
  std::shared_lock lock(mu_);
  return read_locked(offset, out);
}

std::size_t write_buffer::read_locked(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset >= size_) return 0;
  std::size_t total = std::size_t(std::min<std::uint64_t>(out.size(), size_ - offset));
  std::size_t pos = 0;
  while (pos < total) {
    std::uint64_t off = offset + pos;
    std::uint64_t idx = off / chunk_bytes;
    std::size_t in = std::size_t(off % chunk_bytes);
    std::size_t n = std::min(chunk_bytes - in, total - pos);
    auto it = chunks_.find(idx);
    const chunk* c = it != chunks_.end() ? &it->second : nullptr;
    if (!c && from_base(idx)) {
      const std::size_t have =
          std::size_t(std::min<std::uint64_t>(n, base_limit_ > off ? base_limit_ - off : 0));
      if (have && base_->read(off, std::span(out.data() + pos, have)) != have)
        throw io_error(EIO, "base version read short");
      if (have < n) std::memset(out.data() + pos + have, 0, n - have);
    } else if (c && c->in_file) {
      if (!c->direct || dfd_ < 0 ||
          !pread_direct(dfd_, out.data() + pos, n, off, (idx + 1) * chunk_bytes))
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
  std::unique_lock lock(mu_);
  // The staging file first: if it cannot be cut, nothing else is (the file keeps its size and
  // bytes, and the call fails).
  if (size < size_ && fd_ >= 0 && ::ftruncate(fd_, off_t(size)) != 0)
    throw_errno(errno, "staging file truncate");
  // Nothing past the new end counts as written any more.
  contiguous_ = std::min(contiguous_, size);
  for (auto it = ahead_.lower_bound(size); it != ahead_.end();) it = ahead_.erase(it);
  if (!ahead_.empty() && ahead_.rbegin()->second > size) ahead_.rbegin()->second = size;
  if (stream_.load() == stream_state::open && size < consumed_ && !stale_) {
    stale_ = true;
    written_cv_.notify_all();
    room_cv_.notify_all();
  }
  if (size < size_) {
    // Drop whole chunks past the end and cut the last one's data at the new end, so that
    // growing the file again reads zeros there.
    const std::uint64_t keep = (size + chunk_bytes - 1) / chunk_bytes;
    // Chunks written again from here on may be full and in memory below the old mark.
    evicted_below_ = std::min(evicted_below_, keep ? keep - 1 : 0);
    for (auto it = chunks_.lower_bound(keep); it != chunks_.end();) {
      drop_chunk(it->second);
      it = chunks_.erase(it);
    }
    std::size_t in = std::size_t(size % chunk_bytes);
    if (in && keep) {
      if (auto it = chunks_.find(keep - 1); it != chunks_.end())
        it->second.filled = std::min(it->second.filled, in);
    }
    base_limit_ = std::min(base_limit_, size);  // growing again reads zeros there
  }
  size_ = size;
}

void write_buffer::punch_hole(std::uint64_t offset, std::uint64_t length) {
  std::unique_lock lock(mu_);
  if (offset >= size_ || length == 0) return;
  if (stream_.load() == stream_state::open && offset < consumed_ && !stale_) {
    stale_ = true;
    written_cv_.notify_all();
    room_cv_.notify_all();
  }
  const std::uint64_t end = std::min(size_, offset + std::min(length, size_ - offset));
  std::uint64_t off = offset;
  while (off < end) {
    const std::uint64_t idx = off / chunk_bytes;
    const std::size_t in = std::size_t(off % chunk_bytes);
    const std::size_t n = std::size_t(std::min<std::uint64_t>(chunk_bytes - in, end - off));
    if (from_base(idx)) {
      // A whole chunk becomes an own hole; a part of one is copied from the base first.
      if (n == chunk_bytes) {
        chunks_[idx];
        off += n;
        continue;
      }
      own(idx);
    }
    auto it = chunks_.find(idx);
    if (it == chunks_.end()) {           // a hole already: skip to the next chunk that exists
      if (base_ && off < base_limit_) {  // chunks of the base may follow
        off += n;
        continue;
      }
      auto next = chunks_.lower_bound(idx);
      if (next == chunks_.end()) break;
      off = std::max(off + n, next->first * chunk_bytes);
      continue;
    }
    chunk& c = it->second;
    if (n == chunk_bytes) {
      if (c.in_file) {
        // The staging file must read zeros there if the chunk is placed in it again.
        if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(off),
                        off_t(chunk_bytes)) != 0) {
          static const std::vector<std::byte> zeros(chunk_bytes);
          pwrite_all(fd_, zeros.data(), chunk_bytes, off);
        }
      }
      drop_chunk(c);
      if (base_ && off < base_limit_)
        c = chunk{};  // stays own (a hole), or the base would show through
      else
        chunks_.erase(it);
    } else if (c.mem) {
      if (in < c.filled) std::memset(c.mem.data() + in, 0, std::min(n, c.filled - in));
    } else if (c.in_file) {
      const std::vector<std::byte> zeros(n);
      pwrite_all(fd_, zeros.data(), n, off);
    }  // else an own hole already
    off += n;
  }
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> write_buffer::data_runs() const {
  std::shared_lock lock(mu_);
  return data_runs_locked();
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> write_buffer::data_runs_locked() const {
  // Chunk indices that hold data: own chunks with data, and base chunks with data still showing.
  std::vector<std::uint64_t> idx;
  for (const auto& [i, c] : chunks_)
    if ((c.mem && c.filled) || c.in_file) idx.push_back(i);
  if (base_) {
    for (const auto& [from, to] : base_runs_)
      for (std::uint64_t i = from / chunk_bytes; i * chunk_bytes < std::min(to, base_limit_); ++i)
        if (from_base(i)) idx.push_back(i);
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  for (const std::uint64_t i : idx) {
    const std::uint64_t from = i * chunk_bytes;
    if (from >= size_) break;
    const std::uint64_t to = std::min(size_, from + chunk_bytes);
    if (!runs.empty() && runs.back().second == from)
      runs.back().second = to;
    else
      runs.emplace_back(from, to);
  }
  return runs;
}

std::uint64_t write_buffer::allocated_bytes() const {
  std::shared_lock lock(mu_);
  std::uint64_t n = 0;
  for (const auto& [from, to] : data_runs_locked()) n += to - from;
  return n;
}

void write_buffer::read_fully(std::uint64_t offset, std::span<std::byte> out) const {
  if (stream_.load() == stream_state::open) {
    // The stream's reads: remember what was read, under the lock the read took, so that a write
    // changing it afterwards is noticed (check_stream_overlap). Waiting is await()'s. A chunk
    // at a time: the writer (which holds the filesystem's lock) waits for one chunk's copy at
    // most, not for a slab's.
    for (std::size_t pos = 0; pos < out.size();) {
      const std::size_t n = std::min(chunk_bytes, out.size() - pos);
      std::unique_lock lock(mu_);
      if (read_locked(offset + pos, out.subspan(pos, n)) != n)
        throw io_error(EIO, "write buffer shorter than its size");
      if (stream_.load() == stream_state::open) consumed_ = std::max(consumed_, offset + pos + n);
      pos += n;
    }
    return;
  }
  if (read(offset, out) != out.size()) throw io_error(EIO, "write buffer shorter than its size");
}

void write_buffer::overwrite(std::uint64_t offset, std::span<const std::byte> data) {
  // A chunk at a time, as the stream's reads (above), cut at chunk boundaries: a whole chunk in
  // the staging file is then written by direct I/O.
  for (std::size_t pos = 0; pos < data.size();) {
    const std::size_t n =
        std::min(chunk_bytes - std::size_t((offset + pos) % chunk_bytes), data.size() - pos);
    std::unique_lock lock(mu_);
    // A stale stream's reconstruction would replace bytes written after the store read them.
    if (stale_) return;
    if (offset > size_ || data.size() > size_ - offset)
      throw io_error(EINVAL, "overwrite past the end of a write buffer");
    modified_ = true;
    write_locked(offset + pos, data.subspan(pos, n));
    pos += n;
  }
}

std::uint64_t write_buffer::contiguous() const {
  std::shared_lock lock(mu_);
  return contiguous_;
}

bool write_buffer::streamable() const {
  std::shared_lock lock(mu_);
  return !unstreamable_ && !base_ && stream_.load() == stream_state::none && contiguous_ > 0;
}

void write_buffer::no_stream() {
  std::unique_lock lock(mu_);
  unstreamable_ = true;
  ahead_.clear();
}

void write_buffer::begin_stream() {
  std::unique_lock lock(mu_);
  if (stream_.load() != stream_state::none) throw io_error(EINVAL, "a write buffer streams once");
  stream_ = stream_state::open;
  consumed_ = 0;
  settled_ = 0;
  evicted_below_ = 0;
  stream_waits_ = false;
  no_wait_until_past_.reset();
  stale_ = false;
}

void write_buffer::complete_stream() {
  std::unique_lock lock(mu_);
  if (stream_.load() == stream_state::open) stream_ = stream_state::complete;
  written_cv_.notify_all();
  room_cv_.notify_all();
}

void write_buffer::cancel_stream() {
  std::unique_lock lock(mu_);
  if (stream_.load() == stream_state::open || stream_.load() == stream_state::complete)
    stream_ = stream_state::cancelled;
  written_cv_.notify_all();
  room_cv_.notify_all();
}

void write_buffer::end_stream() {
  std::unique_lock lock(mu_);
  if (stream_.load() != stream_state::none) stream_ = stream_state::done;
  stale_ = false;
  written_cv_.notify_all();
  room_cv_.notify_all();
}

bool write_buffer::await(std::uint64_t end) {
  std::unique_lock lock(mu_);
  // A writer the mark stopped following (unstreamable_) is waited for until the file is complete.
  stream_waits_ = true;
  room_cv_.notify_all();  // a writer waiting for room must not wait for this stream now
  written_cv_.wait(
      lock, [&] { return stream_.load() != stream_state::open || stale_ || contiguous_ >= end; });
  stream_waits_ = false;
  switch (stream_.load()) {
    case stream_state::open:
      return !stale_ && contiguous_ >= end;
    case stream_state::complete:
      return !stale_ && end <= size_;
    default:
      return false;  // cancelled, or no stream
  }
}

bool write_buffer::await_complete() {
  std::unique_lock lock(mu_);
  written_cv_.wait(lock, [&] { return stream_.load() != stream_state::open; });
  return stream_.load() == stream_state::complete;
}

bool write_buffer::stale() const {
  std::shared_lock lock(mu_);
  return stale_;
}

int write_buffer::backing_file() {
  std::unique_lock lock(mu_);
  materialize_base();  // the file must hold every byte: the kernel or the head store reads it
  if (fd_ < 0) open_staging();
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_errno(errno, "staging file stat");
  if (std::uint64_t(st.st_size) != size_ && ::ftruncate(fd_, off_t(size_)) != 0)
    throw_errno(errno, "staging file truncate");
  return fd_;
}

void write_buffer::copy_memory_to_file() const {
  // The lock a chunk at a time, not over the whole copy: publishing a head image writes up to
  // buffer= to the disk (about a second per GiB here), and meanwhile the stream's last settle()
  // and end_stream(), on the committing fsync's path, wait for the exclusive lock (measured:
  // 0.57 s of a 2 GiB delta's 6.2 s save+fsync).
  for (std::uint64_t next = 0;;) {
    std::shared_lock lock(mu_);
    auto it = chunks_.lower_bound(next);
    while (it != chunks_.end() && !(it->second.mem && it->second.filled)) ++it;
    if (it == chunks_.end()) return;
    write_to_file(it->first, it->second);
    next = it->first + 1;
  }
}

void write_buffer::drop_memory() {
  std::unique_lock lock(mu_);
  for (auto& [i, c] : chunks_) {
    if (!c.mem) continue;
    // As copy_memory_to_file() wrote it; only a hint for reads (a direct read of bytes written
    // through the page cache is correct, the kernel writes them back first).
    c.direct = dfd_ >= 0 && c.filled == chunk_bytes && (i + 1) * chunk_bytes <= size_;
    budget_->recycle(std::move(c.mem));
    c.in_file = true;
    c.filled = 0;
  }
  if (spare_) budget_->recycle(std::move(spare_));
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
