// io_uring write queue: see uring.hpp for the contract.
#include "fs/store/uring.hpp"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "fs/store/posix.hpp"

namespace ckpt::store::detail {
namespace {

constexpr int max_eagain_retries = 10000;

// Sets up a ring; returns false (and leaves `r` unusable) when the kernel refuses io_uring.
// SINGLE_ISSUER|DEFER_TASKRUN (kernel >= 6.1) lets the kernel skip cross-thread synchronisation
// and run completions only when we wait for them; older kernels reject the flags with -EINVAL and
// get a plain ring. Other failures (ENOMEM, EMFILE) throw.
bool init_ring(io_uring& r, unsigned depth) {
  int rc = io_uring_queue_init(depth, &r, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
  if (rc == -EINVAL) rc = io_uring_queue_init(depth, &r, 0);
  if (rc == -ENOSYS || rc == -EPERM) return false;
  if (rc < 0) throw_errno(-rc, "io_uring_queue_init");
  return true;
}

}  // namespace

struct write_queue::impl {
  struct op {
    int fd = -1;
    const std::byte* data = nullptr;
    std::size_t left = 0;
    std::uint64_t off = 0;
    int eagain = 0;
    bool busy = false;
  };
  io_uring ring{};
  bool async = false;
  std::vector<op> ops;  // one slot per write in flight
  unsigned inflight = 0;
  int err = 0;  // first failure, thrown once nothing is in flight

  explicit impl(unsigned depth) : ops(depth) { async = init_ring(ring, depth); }
  ~impl() {
    if (async) io_uring_queue_exit(&ring);
  }

  void prep(std::size_t i) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);  // never null: one SQE per slot at most
    op& o = ops[i];
    io_uring_prep_write(sqe, o.fd, o.data, unsigned(o.left), o.off);
    io_uring_sqe_set_data64(sqe, i);
  }

  // Submits what is prepared and reaps at least one completion (resubmitting short writes).
  void reap_one() {
    for (;;) {
      int rc = io_uring_submit_and_wait(&ring, 1);
      if (rc >= 0) break;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      throw_errno(-rc, "io_uring_enter");  // the ring is unusable: the caller abandons the file
    }
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      const std::size_t i = std::size_t(io_uring_cqe_get_data64(cqe));
      op& o = ops[i];
      const int res = cqe->res;
      if ((res == -EAGAIN || res == -EINTR) && ++o.eagain <= max_eagain_retries && !err) {
        prep(i);
        continue;
      }
      if (res > 0 && !err) {
        o.data += res;
        o.left -= std::size_t(res);
        o.off += std::uint64_t(res);
        if (o.left > 0) {
          prep(i);
          continue;
        }
      } else if (res <= 0 && !err) {
        err = res < 0 ? -res : EIO;  // no progress and no error: do not spin
      } else if (o.left > 0 && res > 0) {
        // An earlier write failed: the rest of this one is abandoned.
      }
      o.busy = false;
      --inflight;
    }
    io_uring_cq_advance(&ring, seen);
  }

  void drain() {
    while (inflight > 0) reap_one();
  }
};

write_queue::write_queue(unsigned depth) : impl_(std::make_unique<impl>(depth ? depth : 1)) {}

write_queue::~write_queue() {
  try {
    impl_->drain();
  } catch (...) {
    // The ring failed: in-flight writes may still reference buffers. Nothing better than to
    // leave the ring to io_uring_queue_exit, which cancels and waits for them.
  }
}

bool write_queue::asynchronous() const noexcept {
  return impl_->async;
}

void write_queue::submit(int fd, std::span<const std::byte> data, std::uint64_t offset) {
  impl& q = *impl_;
  if (q.err) {
    q.drain();
    throw_errno(q.err, "object write");
  }
  if (data.empty()) return;
  if (!q.async) {
    pwrite_all(fd, data, offset, "object write");
    return;
  }
  while (q.inflight == q.ops.size()) q.reap_one();
  std::size_t slot = 0;
  while (q.ops[slot].busy) ++slot;
  q.ops[slot] = {fd, data.data(), data.size(), offset, 0, true};
  ++q.inflight;
  q.prep(slot);
  // Sent now, so the disk works while the caller prepares the next buffer.
  for (;;) {
    const int rc = io_uring_submit(&q.ring);
    if (rc >= 0 || (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)) {
      if (rc < 0) throw_errno(-rc, "io_uring_submit");
      break;
    }
  }
}

void write_queue::wait_all() {
  impl_->drain();
  if (impl_->err) throw_errno(impl_->err, "object write");
}

bool uring_available() {
  io_uring r{};
  if (!init_ring(r, 1)) return false;
  io_uring_queue_exit(&r);
  return true;
}

}  // namespace ckpt::store::detail
