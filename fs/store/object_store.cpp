// Object store: one file per object, `%016llx.obj`, framed as
//   header (32 bytes) | payload | footer (32 bytes, magic in the last 4 bytes of the file)
// (byte layout and crash rules: docs/format.md, "Objects").
// put(): write `<name>.tmp` through io_uring, fdatasync it, rename it to `<name>`, fsync the
// directory. So a `.obj` name only ever appears for a complete, durable object; a crash leaves
// at most a `.tmp` file, removed the next time the store is opened.
#include "fs/store/object_store.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "codec/xxh3.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/filesystem/operations.hpp>
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>

#include "fs/store/object_framing.hpp"

namespace ckpt::store {

using namespace detail;

namespace {

constexpr std::size_t verify_chunk = std::size_t{4} << 20;

// cachestat(2), Linux 6.5: how many pages of a file range the page cache holds, without
// starting any I/O. Debian 12's headers predate it; the number is the same on every
// architecture that uses the common syscall table.
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct cachestat_range {
  std::uint64_t off, len;
};
struct cachestat_result {
  std::uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

// True when every page of [off, off + len) is in the page cache. False when any is not, and
// when the kernel cannot tell (older kernels, seccomp): the caller then reads with O_DIRECT,
// which is coherent with the page cache either way.
bool range_cached(int fd, std::uint64_t off, std::uint64_t len) {
  const cachestat_range r{off, len};
  cachestat_result c{};
  if (::syscall(__NR_cachestat, fd, &r, &c, 0) != 0) return false;
  const std::uint64_t page = 4096;
  return c.nr_cache >= (len + page - 1) / page;
}

// Parses "<16 hex>.obj" (tmp == false) or "<16 hex>.obj.tmp" (tmp == true).
std::optional<object_id> parse_name(const char* name, bool& tmp) {
  std::string_view s(name);
  if (s.size() == 20 && s.substr(16) == ".obj") {
    tmp = false;
  } else if (s.size() == 24 && s.substr(16) == ".obj.tmp") {
    tmp = true;
  } else {
    return std::nullopt;
  }
  object_id id = 0;
  for (char c : s.substr(0, 16)) {
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else
      return std::nullopt;
    id = (id << 4) | static_cast<object_id>(v);
  }
  return id;
}

// What the framing of an intact object says.
struct framing {
  std::uint64_t payload_size;
  std::uint64_t checksum;
};

// Calls `f` for every entry name of the directory. Opens "." relative to `dir_fd` so each call
// has its own open file description (a dup would share the readdir offset across threads).
template <class F>
void for_each_entry(int dir_fd, const std::string& dir, F&& f) {
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno(errno, "cannot read object directory " + dir);
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    throw_errno(e, "cannot read object directory " + dir);
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(d, &::closedir);
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    f(e->d_name);
    errno = 0;
  }
  if (errno != 0) throw_errno(errno, "cannot read object directory " + dir);
}

}  // namespace

struct object_store::impl : object_dir {
  // Opens object `id` and checks its framing against the file size. corrupt_error if missing,
  // truncated or damaged; io_error for other OS errors.
  unique_fd open_checked(object_id id, framing& out) const {
    const std::string name = object_name(id);
    unique_fd fd(::openat(dir_fd.get(), name.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) {
      if (errno == ENOENT) throw corrupt_error("object " + hex_id(id) + " is missing in " + dir);
      throw_errno(errno, "cannot open object " + dir + "/" + name);
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw_errno(errno, "cannot stat object " + name);
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    const std::string what = "object " + hex_id(id) + " in " + dir;
    if (file_size < framing_size)
      throw corrupt_error(what + " is truncated (" + std::to_string(file_size) + " bytes)");
    std::array<std::byte, header_size> h;
    std::array<std::byte, footer_size> f;
    if (pread_full(fd.get(), h, 0, "read " + what) != h.size() ||
        pread_full(fd.get(), f, file_size - footer_size, "read " + what) != f.size())
      throw corrupt_error(what + " is truncated");
    if (get_u32(&h[0]) != header_magic) throw corrupt_error(what + ": bad header magic");
    if (get_u64(&h[24]) != XXH3_64bits(h.data(), 24))
      throw corrupt_error(what + ": header checksum mismatch");
    if (get_u16(&h[4]) != format_version || get_u16(&h[6]) != header_size)
      throw error(errc::unsupported,
                  what + ": unsupported object format version " + std::to_string(get_u16(&h[4])));
    if (get_u32(&f[28]) != footer_magic)
      throw corrupt_error(what + " is truncated or its footer is damaged (bad magic at EOF)");
    if (get_u32(&f[24]) != static_cast<std::uint32_t>(XXH3_64bits(f.data(), 24)))
      throw corrupt_error(what + ": footer checksum mismatch");
    const std::uint64_t size = get_u64(&h[16]);
    if (get_u64(&h[8]) != id || get_u64(&f[16]) != id)
      throw corrupt_error(what + ": framing names another object id");
    if (get_u64(&f[0]) != size || size != file_size - framing_size)
      throw corrupt_error(what + ": payload size " + std::to_string(size) +
                          " does not match the file size " + std::to_string(file_size));
    out = {size, get_u64(&f[8])};
    return fd;
  }
};

object_store::object_store(boost::filesystem::path dir)
    : dir_(std::move(dir)), impl_(std::make_shared<impl>()) {
  boost::system::error_code ec;
  boost::filesystem::create_directories(dir_, ec);
  impl_->dir = dir_.string();
  impl_->dir_fd = unique_fd(::open(impl_->dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!impl_->dir_fd) throw_errno(errno, "cannot open object directory " + impl_->dir);
  // Ids continue after the largest present (tmp names included, so a crashed put's id is never
  // reused for different bytes). Leftover .tmp files are incomplete puts of a crashed writer:
  // the store lock guarantees there is no live one, so they are removed here.
  object_id max_id = 0;
  std::vector<std::string> stale;
  for_each_entry(impl_->dir_fd.get(), impl_->dir, [&](const char* name) {
    bool tmp = false;
    if (auto id = parse_name(name, tmp)) {
      max_id = std::max(max_id, *id);
      if (tmp) stale.emplace_back(name);
    }
  });
  for (const auto& name : stale) ::unlinkat(impl_->dir_fd.get(), name.c_str(), 0);
  impl_->next_id.store(max_id + 1);
}

std::shared_ptr<object_dir> object_store::shared_dir() const {
  return std::shared_ptr<object_dir>(impl_, impl_.get());  // shares ownership of the impl
}

object_ref object_store::put(std::span<const std::span<const std::byte>> pieces) {
  object_writer w = begin();
  for (auto p : pieces) w.append(p);
  return w.commit();
}

void object_store::read(object_id id, std::uint64_t offset, std::span<std::byte> out) const {
  framing fr;
  unique_fd fd = impl_->open_checked(id, fr);
  if (offset > fr.payload_size || out.size() > fr.payload_size - offset)
    throw corrupt_error("object " + hex_id(id) + ": read of [" + std::to_string(offset) + ", +" +
                        std::to_string(out.size()) + ") past its payload size " +
                        std::to_string(fr.payload_size));
  if (pread_full(fd.get(), out, header_size + offset, "read object " + hex_id(id)) != out.size())
    throw corrupt_error("object " + hex_id(id) + " shrank while being read");
}

void object_store::prefetch(std::span<const object_id> ids, std::uint64_t tail) const {
  for (const object_id id : ids) {
    const std::string name = object_name(id);
    unique_fd fd(::openat(impl_->dir_fd.get(), name.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st;
    if (!fd || ::fstat(fd.get(), &st) != 0) continue;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size <= tail + 4096) {
      (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_WILLNEED);
    } else {
      (void)::posix_fadvise(fd.get(), 0, 4096, POSIX_FADV_WILLNEED);
      (void)::posix_fadvise(fd.get(), off_t(size - tail), off_t(tail), POSIX_FADV_WILLNEED);
    }
  }
}

std::span<const std::byte> object_store::read_uncached(object_id id, std::uint64_t offset,
                                                       std::size_t len,
                                                       page_buffer& scratch) const {
  constexpr std::uint64_t align = 4096;  // O_DIRECT: file offset, length and memory aligned
  framing fr;
  unique_fd fd = impl_->open_checked(id, fr);
  if (offset > fr.payload_size || len > fr.payload_size - offset)
    throw corrupt_error("object " + hex_id(id) + ": read of [" + std::to_string(offset) + ", +" +
                        std::to_string(len) + ") past its payload size " +
                        std::to_string(fr.payload_size));
  const std::uint64_t begin = header_size + offset, end = begin + len;
  const std::uint64_t first = begin / align * align;
  const std::uint64_t last = (end + align - 1) / align * align;
  if (scratch.size() < last - first) scratch = page_buffer(last - first);
  auto at_file = [&](std::uint64_t file_offset) { return scratch.data() + (file_offset - first); };
  const std::string what = "read object " + hex_id(id);
  // A range the page cache holds whole (an object written moments ago) is copied from there;
  // anything else is read with O_DIRECT. The check must not start I/O itself: a RWF_NOWAIT
  // probe read would, since it triggers readahead into the page cache before it fails, and the
  // same bytes would then be read twice.
  std::uint64_t at = begin;  // bytes before `at` are in scratch
  if (!range_cached(fd.get(), first, last - first)) {
    unique_fd direct(
        ::openat(impl_->dir_fd.get(), object_name(id).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
    std::uint64_t got = 0;
    if (direct) {
      const std::span<std::byte> into(at_file(first), std::size_t(last - first));
      for (;;) {
        const ssize_t n =
            ::pread(direct.get(), into.data() + got, into.size() - got, off_t(first + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // end of file, or EINVAL (alignment): the buffered read finishes
        got += std::uint64_t(n);
        if (got % align) break;  // the file's end: no more aligned reads
      }
    }
    at = std::max(at, first + got);
  }
  // Cached ranges, filesystems without O_DIRECT, and whatever O_DIRECT left short.
  if (at < end &&
      pread_full(fd.get(), std::span(at_file(at), std::size_t(end - at)), at, what) != end - at)
    throw corrupt_error("object " + hex_id(id) + " shrank while being read");
  return {at_file(begin), len};
}

void object_store::verify(const object_ref& ref) const {
  framing fr;
  unique_fd fd = impl_->open_checked(ref.id, fr);
  const std::string what = "object " + hex_id(ref.id) + " in " + impl_->dir;
  if (fr.payload_size != ref.size)
    throw corrupt_error(what + " holds " + std::to_string(fr.payload_size) +
                        " payload bytes, the reference says " + std::to_string(ref.size));
  if (fr.checksum != ref.checksum)
    throw corrupt_error(what + ": footer checksum differs from the reference");
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  std::vector<std::byte> buf(std::min<std::uint64_t>(verify_chunk, fr.payload_size));
  for (std::uint64_t off = 0; off < fr.payload_size;) {
    std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), fr.payload_size - off));
    if (pread_full(fd.get(), std::span(buf).first(n), header_size + off, "read " + what) != n)
      throw corrupt_error(what + " shrank while being verified");
    XXH3_64bits_update(&st, buf.data(), n);
    off += n;
  }
  if (XXH3_64bits_digest(&st) != ref.checksum)
    throw corrupt_error(what + ": payload checksum mismatch");
}

void object_store::remove(object_id id) {
  // No directory fsync: a removal that a crash undoes leaves an unreferenced object (garbage
  // for the next gc), never a dangling reference.
  const std::string name = object_name(id);
  if (::unlinkat(impl_->dir_fd.get(), name.c_str(), 0) != 0 && errno != ENOENT)
    throw_errno(errno, "cannot remove object " + impl_->dir + "/" + name);
}

void object_store::reserve_through(object_id id) {
  object_id cur = impl_->next_id.load();
  while (cur <= id && !impl_->next_id.compare_exchange_weak(cur, id + 1)) {
  }
}

std::vector<object_id> object_store::list() const {
  std::vector<object_id> ids;
  for_each_entry(impl_->dir_fd.get(), impl_->dir, [&](const char* name) {
    bool tmp = false;
    if (auto id = parse_name(name, tmp); id && !tmp) ids.push_back(*id);
  });
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::uint64_t object_store::disk_bytes(object_id id) const {
  struct stat st;
  if (::fstatat(impl_->dir_fd.get(), object_name(id).c_str(), &st, 0) != 0) {
    if (errno == ENOENT) return 0;
    throw_errno(errno, "cannot stat object " + hex_id(id));
  }
  return static_cast<std::uint64_t>(st.st_size);
}

int detail::rename_noreplace(int dfd, const std::string& from, const std::string& to) {
  if (::renameat2(dfd, from.c_str(), dfd, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
  if (::linkat(dfd, from.c_str(), dfd, to.c_str(), 0) == 0) {
    ::unlinkat(dfd, from.c_str(), 0);
    return 0;
  }
  if (errno != EPERM && errno != ENOTSUP && errno != ENOSYS) return errno;
  struct stat st;
  if (::fstatat(dfd, to.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return EEXIST;
  return ::renameat(dfd, from.c_str(), dfd, to.c_str()) == 0 ? 0 : errno;
}

}  // namespace ckpt::store
