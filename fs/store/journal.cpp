// Journal: header (16 bytes) then records `u32 length | u32 checksum | payload`
// (byte layout and crash rules: docs/format.md, "Journal").
//
// I/O is plain pwrite + fdatasync, not io_uring: a sync writes one small contiguous buffer and
// then waits for the device anyway, so a ring would add per-thread setup and nothing to batch
// (RocksDB keeps its WAL on pwrite for the same reason). Concurrent sync() calls are serialised;
// a caller that waited for another thread's sync finds its records already written (group
// commit) and returns without a second fdatasync.
#include "fs/store/journal.hpp"

#include <sys/stat.h>
#include <ctime>
#include "codec/xxh3.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "fs/store/posix.hpp"

namespace ckpt::store {

using namespace detail;

namespace {

constexpr std::uint32_t journal_magic = 0x4c4a4b43;  // "CKJL"
constexpr std::uint16_t journal_version = 1;
constexpr std::size_t header_size = 16;
constexpr std::size_t record_header = 8;
constexpr std::uint32_t max_record = std::uint32_t{256} << 20;  // larger lengths are damage
// Seed of the record checksum: makes an all-zero record (length 0, checksum 0 — what a crash
// can leave in a preallocated or not-yet-written block) invalid.
constexpr std::uint64_t record_seed = 0x636b70746a726e6cULL;  // "ckptjrnl"

std::array<std::byte, header_size> make_header() {
  std::array<std::byte, header_size> h{};
  put_u32(&h[0], journal_magic);
  put_u16(&h[4], journal_version);
  put_u16(&h[6], header_size);
  put_u32(&h[8], 0);  // reserved
  put_u32(&h[12], static_cast<std::uint32_t>(XXH3_64bits(h.data(), 12)));
  return h;
}

std::uint32_t record_checksum(std::span<const std::byte> payload) {
  // The length is part of the seed, so a damaged length field fails the check too.
  return static_cast<std::uint32_t>(
      XXH3_64bits_withSeed(payload.data(), payload.size(), record_seed + payload.size()));
}

void append_framed(std::vector<std::byte>& out, std::span<const std::byte> record) {
  std::size_t at = out.size();
  out.resize(at + record_header + record.size());
  put_u32(&out[at], static_cast<std::uint32_t>(record.size()));
  put_u32(&out[at + 4], record_checksum(record));
  std::copy(record.begin(), record.end(), out.begin() + static_cast<std::ptrdiff_t>(at + 8));
}

std::string dir_of(const boost::filesystem::path& file) {
  auto d = file.parent_path();
  return d.empty() ? std::string(".") : d.string();
}

void fsync_parent(const boost::filesystem::path& file) {
  const std::string dir = dir_of(file);
  unique_fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) throw_errno(errno, "cannot open directory " + dir);
  fsync_dir(d.get(), "fsync of directory " + dir);
}

// Writes `bytes` as the whole content of `file` atomically: tmp, fdatasync, rename, fsync dir.
// Returns an O_RDWR fd of the new file. On failure the tmp file is removed and `file` is
// untouched (unless the final directory fsync failed: then it throws with `renamed` set).
unique_fd write_atomically(const boost::filesystem::path& file, std::span<const std::byte> bytes,
                           bool& renamed) {
  renamed = false;
  const std::string tmp = file.string() + ".tmp";
  unique_fd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw_errno(errno, "cannot create " + tmp);
  try {
    pwrite_all(fd.get(), bytes, 0, "write " + tmp);
    if (::fdatasync(fd.get()) != 0) throw_errno(errno, "fdatasync " + tmp);
    if (::rename(tmp.c_str(), file.string().c_str()) != 0)
      throw_errno(errno, "rename " + tmp + " over " + file.string());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  renamed = true;
  fsync_parent(file);
  return fd;
}

}  // namespace

journal::journal(boost::filesystem::path file) : file_(std::move(file)) {
  // A leftover tmp is a compact() that crashed before its rename: the journal itself is intact.
  ::unlink((file_.string() + ".tmp").c_str());
  unique_fd fd(::open(file_.string().c_str(), O_RDWR | O_CLOEXEC));
  if (!fd && errno == ENOENT) {
    // Created atomically, so a journal file always has a complete header.
    bool renamed;
    fd = write_atomically(file_, make_header(), renamed);
  } else if (!fd) {
    throw_errno(errno, "cannot open journal " + file_.string());
  } else {
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw_errno(errno, "cannot stat journal " + file_.string());
    if (st.st_size == 0) {  // an empty file (made by someone else): give it a header
      pwrite_all(fd.get(), make_header(), 0, "write journal header " + file_.string());
      if (::fdatasync(fd.get()) != 0) throw_errno(errno, "fdatasync " + file_.string());
    }
  }
  fd_ = fd.release();
}

journal::~journal() {
  // A clean shutdown keeps what was appended; durability was only promised after sync().
  try {
    bool pending;
    {
      std::lock_guard lk(mu_);
      pending = !pending_.empty() && !failed_ && replayed_;
    }
    if (pending) sync();
  } catch (...) {
  }
  if (fd_ >= 0) ::close(fd_);
}

void journal::replay(const std::function<void(std::span<const std::byte>)>& apply) {
  std::lock_guard s(sync_mu_);
  std::lock_guard lk(mu_);
  if (replayed_) throw invalid_argument("journal " + file_.string() + ": replay() called twice");
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_errno(errno, "cannot stat journal " + file_.string());
  // Read it whole: compaction keeps the journal small (the live state, not the history).
  std::vector<std::byte> data(static_cast<std::size_t>(st.st_size));
  data.resize(pread_full(fd_, data, 0, "read journal " + file_.string()));
  // A damaged header is not a torn tail: refuse rather than truncate the whole journal.
  if (data.size() < header_size || get_u32(&data[0]) != journal_magic ||
      get_u32(&data[12]) != static_cast<std::uint32_t>(XXH3_64bits(data.data(), 12)))
    throw corrupt_error("journal " + file_.string() + ": damaged header");
  if (get_u16(&data[4]) != journal_version || get_u16(&data[6]) != header_size)
    throw error(errc::unsupported, "journal " + file_.string() + ": unsupported version " +
                                       std::to_string(get_u16(&data[4])));
  std::size_t pos = header_size;
  while (data.size() - pos >= record_header) {
    const std::uint32_t len = get_u32(&data[pos]);
    if (len > max_record || len > data.size() - pos - record_header) break;  // torn or damaged
    std::span<const std::byte> payload(data.data() + pos + record_header, len);
    if (get_u32(&data[pos + 4]) != record_checksum(payload)) break;  // damaged: stop here
    apply(payload);
    pos += record_header + len;
  }
  if (pos < data.size()) {
    // Drop the torn/damaged tail so that new records follow the last good one; make the cut
    // durable before anything is appended after it. Bytes that are not all zero are kept aside
    // first (JOURNAL.tail-<offset>-<time>, durable before the cut): a damaged record in the middle
    // cuts every record after it, and whatever they recorded can still be looked at.
    const std::span<const std::byte> tail(data.data() + pos, data.size() - pos);
    tail_ = {pos, tail.size(), {}};
    if (std::any_of(tail.begin(), tail.end(), [](std::byte b) { return b != std::byte{0}; })) {
      const boost::filesystem::path kept =
          file_.string() + ".tail-" + std::to_string(pos) + "-" + std::to_string(::time(nullptr));
      bool renamed = false;
      write_atomically(kept, tail, renamed);
      tail_.kept = kept.string();
    }
    if (::ftruncate(fd_, static_cast<off_t>(pos)) != 0)
      throw_errno(errno, "truncate journal " + file_.string());
    if (::fsync(fd_) != 0) throw_errno(errno, "fsync journal " + file_.string());
  }
  end_ = pos;
  replayed_ = true;
}

void journal::append(std::span<const std::byte> record) {
  std::lock_guard lk(mu_);
  if (failed_)
    throw io_error(EIO, "journal " + file_.string() + " failed to sync earlier; refusing appends");
  if (!replayed_)
    throw invalid_argument("journal " + file_.string() + ": append() before replay()");
  if (record.size() > max_record)
    throw invalid_argument("journal record of " + std::to_string(record.size()) +
                           " bytes exceeds the limit");
  append_framed(pending_, record);
  end_ += record_header + record.size();
}

void journal::sync() {
  std::lock_guard s(sync_mu_);
  std::vector<std::byte> buf;
  std::uint64_t off;
  {
    std::lock_guard lk(mu_);
    if (failed_) throw io_error(EIO, "journal " + file_.string() + " failed to sync earlier");
    if (pending_.empty()) return;  // everything appended before us is already durable
    buf.swap(pending_);
    off = end_ - buf.size();
  }
  try {
    pwrite_all(fd_, buf, off, "write journal " + file_.string());
    if (::fdatasync(fd_) != 0) throw_errno(errno, "fdatasync journal " + file_.string());
  } catch (...) {
    // fsyncgate: the state on disk is unknown and a retry could report success for lost data.
    std::lock_guard lk(mu_);
    failed_ = true;
    throw;
  }
}

journal::compaction journal::begin_compact() {
  compaction c;
  c.sync_lock_ = std::unique_lock(sync_mu_);
  std::lock_guard lk(mu_);
  c.cut_ = pending_.size();
  return c;
}

void journal::compact(const std::vector<std::vector<std::byte>>& records) {
  finish_compact(begin_compact(), records);
}

void journal::finish_compact(compaction cut, const std::vector<std::vector<std::byte>>& records) {
  if (!cut.sync_lock_.owns_lock() || cut.sync_lock_.mutex() != &sync_mu_)
    throw invalid_argument("journal " + file_.string() + ": finish_compact without begin");
  std::vector<std::byte> buf;
  const auto h = make_header();
  buf.insert(buf.end(), h.begin(), h.end());
  for (const auto& r : records) {
    if (r.size() > max_record)
      throw invalid_argument("journal record of " + std::to_string(r.size()) +
                             " bytes exceeds the limit");
    append_framed(buf, r);
  }
  bool renamed = false;
  unique_fd fd;
  try {
    fd = write_atomically(file_, buf, renamed);
  } catch (...) {
    if (renamed) {  // the new file may or may not be the journal after a crash: stop here
      std::lock_guard lk(mu_);
      failed_ = true;
    }
    throw;
  }
  std::lock_guard lk(mu_);
  ::close(fd_);
  fd_ = fd.release();
  // The records before the cut are in the snapshot; those after it wait for the next sync().
  pending_.erase(pending_.begin(), pending_.begin() + std::ptrdiff_t(cut.cut_));
  end_ = buf.size() + pending_.size();
  replayed_ = true;
  // A fresh file written and synced in full is a known state again, so a journal that failed a
  // sync recovers here (rewrite from memory instead of retrying an fsync).
  failed_ = false;
}

std::uint64_t journal::size_bytes() const {
  std::lock_guard lk(mu_);
  return end_;
}

}  // namespace ckpt::store
