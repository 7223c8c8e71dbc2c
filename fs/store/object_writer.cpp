// object_writer: an object streamed into `<id>.obj.tmp` and committed by fdatasync + rename (see
// object_store.hpp for the contract, docs/format.md "Objects" for the crash rules).
//
// The payload is gathered in two page-aligned 4 MiB buffers. A full buffer is written with
// O_DIRECT through an io_uring write_queue while the caller fills the other one: the disk works
// while the caller encodes, and an object (a keyframe is most of a checkpoint's size) never
// passes through the page cache, where it would push out the user's data and, on the benchmark
// VM, cost a fresh page per 4 KiB. What is left at commit (the last partial buffer), the footer
// and the header (whose payload size is known only then) are written with ordinary pwrites.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "fs/store/object_framing.hpp"
#include "fs/store/object_store.hpp"
#include "fs/store/page_buffer.hpp"
#include "fs/store/uring.hpp"

namespace ckpt::store {

using namespace detail;

namespace {
constexpr std::size_t buffer_bytes = std::size_t{4} << 20;  // a multiple of any block size
}  // namespace

struct object_writer::state {
  std::shared_ptr<object_dir> dir;
  object_id id = 0;
  std::string tmp;
  unique_fd fd;      // buffered
  unique_fd direct;  // O_DIRECT on the same file, when the filesystem supports it
  page_buffer buf[2];
  int cur = 0;
  std::size_t fill = 0;       // bytes in buf[cur]
  std::uint64_t buf_off = 0;  // file offset of buf[cur][0]
  std::uint64_t payload = 0;  // payload bytes appended
  XXH3_state_t hash;
  write_queue queue{1};  // one write in flight while the other buffer fills
  bool failed = false;
  bool committed = false;

  ~state() {
    if (committed) return;
    try {
      queue.wait_all();
    } catch (...) {
      // The file is removed below either way.
    }
    ::unlinkat(dir->dir_fd.get(), tmp.c_str(), 0);
  }

  [[noreturn]] void fail(const io_error& e) {
    failed = true;
    throw io_error(e.sys_errno(),
                   "put object " + hex_id(id) + " into " + dir->dir + ": " + e.what());
  }

  void flush_full() {
    const int out = direct ? direct.get() : fd.get();
    queue.submit(out, std::span<const std::byte>(buf[cur].data(), buffer_bytes), buf_off);
    buf_off += buffer_bytes;
    cur ^= 1;  // the queue holds one write: the other buffer's write has completed
    fill = 0;
    if (!buf[cur].data()) buf[cur] = page_buffer(buffer_bytes);
  }

  void write_tail_and_framing() {
    queue.wait_all();
    pwrite_all(fd.get(), std::span<const std::byte>(buf[cur].data(), fill), buf_off,
               "write object " + tmp);
    const std::uint64_t checksum = XXH3_64bits_digest(&hash);
    const auto footer = make_footer(id, payload, checksum);
    pwrite_all(fd.get(), footer, header_size + payload, "write object " + tmp);
    const auto header = make_header(id, payload);
    pwrite_all(fd.get(), header, 0, "write object " + tmp);
  }
};

object_writer::object_writer(std::unique_ptr<state> s) : s_(std::move(s)) {}
object_writer::object_writer(object_writer&&) noexcept = default;
object_writer& object_writer::operator=(object_writer&&) noexcept = default;
object_writer::~object_writer() = default;

std::uint64_t object_writer::size() const noexcept {
  return s_->payload;
}

void object_writer::append(std::span<const std::byte> bytes) {
  state& s = *s_;
  if (s.failed || s.committed) throw io_error(EIO, "object writer used after failure or commit");
  try {
    XXH3_64bits_update(&s.hash, bytes.data(), bytes.size());
    s.payload += bytes.size();
    while (!bytes.empty()) {
      const std::size_t n = std::min(bytes.size(), buffer_bytes - s.fill);
      std::memcpy(s.buf[s.cur].data() + s.fill, bytes.data(), n);
      s.fill += n;
      bytes = bytes.subspan(n);
      if (s.fill == buffer_bytes) s.flush_full();
    }
  } catch (const io_error& e) {
    s.fail(e);
  }
}

std::size_t object_writer::buffer_bytes_held() const noexcept {
  return s_ ? s_->buf[0].capacity() + s_->buf[1].capacity() : 0;
}

object_ref object_writer::commit() {
  state& s = *s_;
  if (s.failed || s.committed) throw io_error(EIO, "object writer used after failure or commit");
  const int dfd = s.dir->dir_fd.get();
  try {
    s.write_tail_and_framing();
    if (::fdatasync(s.fd.get()) != 0) throw_errno(errno, "fdatasync of object " + s.tmp);
    // Normally the id is free. It can be taken when another process writes into the same
    // directory with its own counter (a fork()ed child shares the store lock): an existing object
    // is never replaced; the object takes the next id instead (its framing names the id, so it
    // is rewritten and synced again).
    for (;;) {
      const std::string name = object_name(s.id);
      const int rc = rename_noreplace(dfd, s.tmp, name);
      if (rc == 0) break;
      if (rc != EEXIST) throw_errno(rc, "cannot rename object " + s.tmp);
      s.id = s.dir->next_id.fetch_add(1);
      const auto header = make_header(s.id, s.payload);
      const auto footer = make_footer(s.id, s.payload, XXH3_64bits_digest(&s.hash));
      pwrite_all(s.fd.get(), header, 0, "write object " + s.tmp);
      pwrite_all(s.fd.get(), footer, header_size + s.payload, "write object " + s.tmp);
      if (::fdatasync(s.fd.get()) != 0) throw_errno(errno, "fdatasync of object " + s.tmp);
    }
  } catch (const io_error& e) {
    s.fail(e);  // ~state removes the tmp file
  }
  s.committed = true;
  // Unusable from here on: its buffers and descriptors go now, not with the writer, which a
  // stream keeps until its put returns (its write queue's ring, a few pages, goes with it).
  s.buf[0] = {};
  s.buf[1] = {};
  s.fd.reset();
  s.direct.reset();
  // The name must be durable before anyone records a reference to it. If the directory fsync
  // fails the object's fate is unknown: remove it and fail the commit (the caller rewrites).
  if (::fsync(dfd) != 0) {
    const int e = errno;
    ::unlinkat(dfd, object_name(s.id).c_str(), 0);
    s.failed = true;
    throw_errno(e, "put object " + hex_id(s.id) + ": fsync of " + s.dir->dir);
  }
  return {s.id, s.payload, XXH3_64bits_digest(&s.hash)};
}

object_writer object_store::begin() {
  const std::shared_ptr<object_dir> dir = shared_dir();
  for (;;) {
    auto s = std::make_unique<object_writer::state>();
    s->dir = dir;
    s->id = dir->next_id.fetch_add(1);
    const std::string name = object_name(s->id);
    struct stat existing;
    if (::fstatat(dir->dir_fd.get(), name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0) continue;
    s->tmp = name + ".tmp";
    s->fd = unique_fd(
        ::openat(dir->dir_fd.get(), s->tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!s->fd && errno == EEXIST) continue;
    if (!s->fd) {
      s->committed = true;  // nothing to remove
      throw_errno(errno, "cannot create object " + dir->dir + "/" + s->tmp);
    }
    // Filesystems without O_DIRECT (tmpfs) refuse the open: buffered writes then.
    s->direct =
        unique_fd(::openat(dir->dir_fd.get(), s->tmp.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC));
    XXH3_64bits_reset(&s->hash);
    s->buf[0] = page_buffer(buffer_bytes);
    s->fill = header_size;  // the header is written at commit, when the size is known
    std::memset(s->buf[0].data(), 0, header_size);
    return object_writer(std::move(s));
  }
}

}  // namespace ckpt::store
