// FUSE passthrough from libfuse 3.14: see passthrough.hpp for the why and the kernel's rules.
#include "fs/fuse/passthrough.hpp"

#include <linux/fuse.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "fs/fuse/ops.hpp"
#include "fs/namespace/log.hpp"

namespace ckpt::fs::fuse {
namespace {

// Kernel ABI newer than Debian 12's headers (uapi 7.38) and libfuse 3.14 (7.31): the values of
// include/uapi/linux/fuse.h, protocol 7.40 (kernel 6.9).
constexpr std::uint32_t k_init_ext = 1u << 30;         // flags: flags2 is valid
constexpr std::uint32_t k_writeback_cache = 1u << 16;  // flags: excludes passthrough
constexpr std::uint32_t k_passthrough_hi = 1u << 5;    // flags2: FUSE_PASSTHROUGH (1ULL << 37)
// flags2: FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36, kernel 6.6+): shared mappings of a file opened
// with direct I/O go through the page cache instead of failing with ENODEV.
constexpr std::uint32_t k_direct_io_allow_mmap_hi = 1u << 4;
constexpr std::uint32_t k_fopen_passthrough = 1u << 7;
constexpr std::uint32_t k_opcode_init = 26, k_opcode_open = 14;
// fuse_init_in: flags at 12, flags2 at 16. fuse_init_out (64 bytes): flags at 12, flags2 at 32
// (was unused[0]), max_stack_depth at 36 (unused[1]). fuse_open_out: fh at 0, open_flags at 8,
// backing_id at 12 (was padding).
constexpr std::size_t k_init_in_flags = 12, k_init_in_flags2 = 16;
constexpr std::size_t k_init_out_flags = 12, k_init_out_flags2 = 32, k_init_out_stack = 36;
constexpr std::size_t k_init_out_size = 64;
constexpr std::size_t k_open_out_flags = 8, k_open_out_backing = 12, k_open_out_size = 16;

struct backing_map {  // struct fuse_backing_map
  std::int32_t fd;
  std::uint32_t flags;
  std::uint64_t padding;
};
constexpr unsigned long k_ioc_backing_open = _IOW(229, 1, backing_map);
constexpr unsigned long k_ioc_backing_close = _IOW(229, 2, std::uint32_t);
static_assert(sizeof(backing_map) == 16);
static_assert(k_ioc_backing_open == 0x4010e501 && k_ioc_backing_close == 0x4004e502);

constexpr std::size_t k_out_header = sizeof(fuse_out_header);
constexpr std::size_t k_in_header = sizeof(fuse_in_header);

std::uint32_t get32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void put32(std::byte* p, std::uint32_t v) {
  std::memcpy(p, &v, 4);
}

// Flattens a reply into `out`; false if it does not fit.
bool gather(const iovec* iov, int count, std::byte* out, std::size_t cap, std::size_t& len) {
  len = 0;
  for (int i = 0; i < count; ++i) {
    if (len + iov[i].iov_len > cap) return false;
    std::memcpy(out + len, iov[i].iov_base, iov[i].iov_len);
    len += iov[i].iov_len;
  }
  return true;
}

passthrough* of(void* userdata) {
  return static_cast<context*>(userdata)->pt;
}

ssize_t hook_read(int fd, void* buf, std::size_t len, void* userdata) {
  passthrough* pt = of(userdata);
  return pt ? pt->on_read(fd, buf, len) : ::read(fd, buf, len);
}
ssize_t hook_writev(int fd, iovec* iov, int count, void* userdata) {
  passthrough* pt = of(userdata);
  return pt ? pt->on_writev(fd, iov, count) : ::writev(fd, iov, count);
}

const fuse_custom_io hooks = {hook_writev, hook_read, nullptr, nullptr};

}  // namespace

passthrough::passthrough(fuse_session* se, bool wanted) : wanted_(wanted) {
  dev_fd_ = fuse_session_fd(se);
  if (dev_fd_ < 0 || fuse_session_custom_io(se, &hooks, dev_fd_) != 0)
    throw std::runtime_error("cannot install the FUSE transport hooks for passthrough");
}

ssize_t passthrough::on_read(int fd, void* buf, std::size_t len) {
  const ssize_t n = ::read(fd, buf, len);
  if (n < ssize_t(k_in_header)) return n;
  const auto* h = static_cast<const fuse_in_header*>(buf);
  const auto* arg = static_cast<const std::byte*>(buf) + k_in_header;
  if (h->opcode == k_opcode_open) {
    std::lock_guard lock(mu_);
    open_requests_[h->unique] = true;
    pending_opens_.fetch_add(1);
  } else if (h->opcode == k_opcode_init && n >= ssize_t(k_in_header + k_init_in_flags2 + 4)) {
    const std::uint32_t flags = get32(arg + k_init_in_flags);
    const std::uint32_t flags2 = (flags & k_init_ext) ? get32(arg + k_init_in_flags2) : 0;
    offered_ = (flags2 & k_passthrough_hi) != 0;
    mmap_offered_ = (flags2 & k_direct_io_allow_mmap_hi) != 0;
    init_unique_ = h->unique;
  }
  return n;
}

ssize_t passthrough::on_writev(int fd, iovec* iov, int count) {
  if (count >= 1 && iov[0].iov_len >= k_out_header) {
    const auto* h = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (h->unique && h->unique == init_unique_.load()) {
      init_unique_ = 0;
      return patch_init(fd, iov, count);
    }
    if (h->unique && pending_opens_.load()) {
      bool was_open = false;
      {
        std::lock_guard lock(mu_);
        if (open_requests_.erase(h->unique)) {
          was_open = true;
          pending_opens_.fetch_sub(1);
        }
      }
      if (was_open) return patch_open(fd, iov, count);
    }
  }
  return ::writev(fd, iov, count);
}

ssize_t passthrough::patch_init(int fd, iovec* iov, int count) {
  std::byte b[k_out_header + k_init_out_size] = {};
  std::size_t len = 0;
  auto* h = reinterpret_cast<fuse_out_header*>(b);
  const bool pt = wanted_ && offered_;
  if (!gather(iov, count, b, sizeof b, len) || len < k_out_header + k_init_out_flags2 || h->error ||
      !(pt || mmap_offered_))
    return ::writev(fd, iov, count);
  std::byte* o = b + k_out_header;
  std::uint32_t flags = get32(o + k_init_out_flags) | k_init_ext;
  std::uint32_t flags2 = get32(o + k_init_out_flags2);
  if (mmap_offered_) {
    flags2 |= k_direct_io_allow_mmap_hi;
    mmap_allowed_ = true;
  }
  if (pt) {
    flags &= ~k_writeback_cache;
    flags2 |= k_passthrough_hi;
    put32(o + k_init_out_stack, 1);  // backing files on a non-stacked filesystem
  }
  put32(o + k_init_out_flags, flags);
  put32(o + k_init_out_flags2, flags2);
  len = sizeof b;  // the kernel takes any size up to its fuse_init_out
  h->len = std::uint32_t(len);
  active_ = pt;
  return ::write(fd, b, len);
}

ssize_t passthrough::patch_open(int fd, iovec* iov, int count) {
  std::byte b[k_out_header + k_open_out_size];
  std::size_t len = 0;
  const auto* h = reinterpret_cast<const fuse_out_header*>(b);
  if (!gather(iov, count, b, sizeof b, len) || len != sizeof b || h->error)
    return ::writev(fd, iov, count);
  std::byte* o = b + k_out_header;
  std::uint64_t fh;
  std::memcpy(&fh, o, 8);
  int id = 0;
  {
    std::lock_guard lock(mu_);
    if (auto it = handles_.find(fh); it != handles_.end()) id = it->second.backing_id;
  }
  if (!id) return ::writev(fd, iov, count);
  put32(o + k_open_out_flags, get32(o + k_open_out_flags) | k_fopen_passthrough);
  put32(o + k_open_out_backing, std::uint32_t(id));
  return ::write(fd, b, len);
}

passthrough::choice passthrough::decide(std::uint64_t fh, ino_t ino, std::uint64_t version,
                                        int backing_fd, bool writable, bool direct_io) {
  choice c;
  c.direct_io = direct_io;
  std::lock_guard lock(mu_);
  handle_state hs;
  hs.ino = ino;
  inode_state& st = inodes_[ino];
  if (st.backing_id) {
    // The inode is in passthrough mode: every open joins it (the kernel refuses any other).
    // Only a read-only open of the very version the image holds reads it directly.
    ++st.pt_opens;
    hs.backing_id = st.backing_id;
    c.passthrough = true;
    if (writable && st.version) {
      c.exposed = st.version;
      st.version = 0;  // the image is not the version's content any more: nobody reads it
    }
    c.direct_io = writable || st.version == 0 || version != st.version;
  } else if (active_ && backing_fd >= 0 && !writable && st.cached_opens == 0) {
    backing_map map{backing_fd, 0, 0};
    const int id = ::ioctl(dev_fd_, k_ioc_backing_open, &map);
    if (id > 0) {
      st.backing_id = id;
      st.version = version;
      st.pt_opens = 1;
      hs.backing_id = id;
      c.passthrough = true;
      c.direct_io = false;
    } else if (errno == EPERM) {
      // Not root (no CAP_SYS_ADMIN), or the kernel did not take the INIT reply's offer.
      active_ = false;
      if (!refused_logged_) {
        refused_logged_ = true;
        log_info(
            "passthrough refused by the kernel (EPERM: the daemon needs CAP_SYS_ADMIN); "
            "head images are read through the daemon");
      }
    }
  }
  if (!c.passthrough && !c.direct_io) {
    hs.cached = true;
    ++st.cached_opens;
  }
  if (!c.passthrough && !hs.cached && !st.backing_id && !st.cached_opens) inodes_.erase(ino);
  handles_[fh] = hs;
  return c;
}

void passthrough::release(std::uint64_t fh) {
  std::lock_guard lock(mu_);
  auto h = handles_.find(fh);
  if (h == handles_.end()) return;
  const handle_state hs = h->second;
  handles_.erase(h);
  auto it = inodes_.find(hs.ino);
  if (it == inodes_.end()) return;
  inode_state& st = it->second;
  if (hs.cached && st.cached_opens) --st.cached_opens;
  if (hs.backing_id && st.pt_opens && --st.pt_opens == 0) {
    std::uint32_t id = std::uint32_t(st.backing_id);
    ::ioctl(dev_fd_, k_ioc_backing_close, &id);  // the kernel keeps what open files still use
    st.backing_id = 0;
  }
  if (!st.backing_id && !st.cached_opens) inodes_.erase(it);
}

}  // namespace ckpt::fs::fuse
