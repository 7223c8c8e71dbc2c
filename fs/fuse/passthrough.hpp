#pragma once
// FUSE passthrough (kernel 6.9+) from libfuse 3.14, which has no API for it: reads (and mmap) of
// a file opened in passthrough mode go from the kernel straight to a backing file, here a
// lineage's published head image, without a request to the daemon. The newest version of a
// checkpoint then loads at the speed of a plain file (docs/benchmarks.md, "Passthrough").
//
// How, without libfuse's help: fuse_session_custom_io() lets us see every request read from
// /dev/fuse and every reply written to it. From the INIT request we learn whether the kernel
// offers passthrough; its reply gets FUSE_PASSTHROUGH in flags2 and max_stack_depth 1. A backing
// file is registered with ioctl(FUSE_DEV_IOC_BACKING_OPEN), which needs CAP_SYS_ADMIN, and an
// OPEN reply whose handle asked for it gets FOPEN_PASSTHROUGH and the backing id.
//
// The kernel's rules (measured on 6.18, docs/filesystem.md, "Passthrough"), which decide():
// - while an inode has passthrough opens, every new open of it must be a passthrough open of the
//   same backing file, else the open fails with EIO. One backing id per inode, counted by its
//   opens, closed at the last release (closing it earlier fails opens still in flight);
// - a passthrough open fails (EIO) while the inode has a page-cache (non-direct) open;
// - FOPEN_PASSTHROUGH combines with FOPEN_DIRECT_IO (read/write then go to the daemon, mmap to
//   the backing file), not with FOPEN_KEEP_CACHE.
// The same INIT reply also gets FUSE_DIRECT_IO_ALLOW_MMAP when the kernel offers it (kernel
// 6.6+; libfuse 3.14 cannot ask for it either): files being written use direct I/O, and without
// it a shared mapping through a writable descriptor fails (SQLite's WAL index, numpy.memmap r+,
// LMDB). With it the kernel serves such mappings from its page cache, writing dirty pages back
// as ordinary WRITE requests. This part does not depend on `wanted`.
//
// So: the first read-only open of a version with a published image, when the inode has no
// page-cache open, registers the image. Later opens join it: read-only opens of that same
// version pure passthrough, writers and opens of a newer version passthrough + direct I/O (their
// reads and writes are the daemon's; only an mmap of them would see the older image). The kernel
// opens a writer's backing file for writing, so a shared writable mmap of a writer would change
// the image in place: the first writer to join ends direct reads of the image (later opens are
// passthrough + direct I/O) and the image is discarded (choice::exposed).
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace ckpt::fs::fuse {

class passthrough {
 public:
  // Installs the transport hooks on the session's /dev/fuse descriptor: call after
  // fuse_session_mount() and before the session loop (the INIT request must still be ahead).
  // `wanted` false: no passthrough (the option passthrough=off); the hooks then only ask for
  // FUSE_DIRECT_IO_ALLOW_MMAP. Throws on failure.
  passthrough(fuse_session* se, bool wanted);
  passthrough(const passthrough&) = delete;
  passthrough& operator=(const passthrough&) = delete;

  // True once INIT negotiated passthrough and no backing registration was refused.
  bool active() const noexcept { return active_.load(); }
  // True once INIT negotiated FUSE_DIRECT_IO_ALLOW_MMAP (kernel 6.6+): shared mappings of files
  // opened with direct I/O (every writable open) work. Without it they fail with ENODEV.
  bool direct_io_mmap() const noexcept { return mmap_allowed_.load(); }

  // How an open is served, decided before its reply (decide() then expects release() of fh).
  struct choice {
    bool passthrough = false;  // FOPEN_PASSTHROUGH with the inode's backing id
    bool direct_io = false;
    // A writer joined the inode's backing file: a shared writable mmap of it writes into this
    // version's head image, behind the daemon. The caller discards that image
    // (filesystem::discard_head); from now on no open of the inode reads it directly.
    std::uint64_t exposed = 0;
  };
  // `backing_fd` is the published image of `version` (the file's current content), or -1;
  // `direct_io` what the open would use otherwise. Never throws: a refused registration means an
  // ordinary open (and logs once).
  choice decide(std::uint64_t fh, ino_t ino, std::uint64_t version, int backing_fd, bool writable,
                bool direct_io);
  // The open's handle is gone (RELEASE, or its reply failed).
  void release(std::uint64_t fh);

  // transport hooks (C callbacks of fuse_custom_io)
  ssize_t on_read(int fd, void* buf, std::size_t len);
  ssize_t on_writev(int fd, struct iovec* iov, int count);

 private:
  struct inode_state {
    int backing_id = 0;  // 0: no passthrough open
    std::uint64_t version = 0;
    std::uint32_t pt_opens = 0, cached_opens = 0;
  };
  struct handle_state {
    ino_t ino = 0;
    int backing_id = 0;  // 0: ordinary open
    bool cached = false;
  };
  ssize_t patch_init(int fd, struct iovec* iov, int count);
  ssize_t patch_open(int fd, struct iovec* iov, int count);

  int dev_fd_ = -1;
  const bool wanted_;
  std::atomic<bool> offered_{false}, active_{false};
  std::atomic<bool> mmap_offered_{false}, mmap_allowed_{false};
  std::atomic<std::uint64_t> init_unique_{0};
  std::atomic<int> pending_opens_{0};  // open_requests_.size(): most replies skip the lock
  std::mutex mu_;                      // below
  std::unordered_map<ino_t, inode_state> inodes_;
  std::unordered_map<std::uint64_t, handle_state> handles_;
  // OPEN requests read but not yet answered: their replies are where passthrough goes in.
  std::unordered_map<std::uint64_t, bool> open_requests_;
  bool refused_logged_ = false;
};

}  // namespace ckpt::fs::fuse
