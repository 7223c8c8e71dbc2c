// io_uring writer: see uring.hpp for the contract.
#include "fs/store/uring.hpp"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <deque>
#include <memory>
#include <vector>

#include "fs/store/posix.hpp"

namespace ckpt::store::detail {
namespace {

// Queue depth: objects are a few large sequential writes (encoded checkpoints, 1 MiB .. 1 GiB);
// 32 SQEs of up to 4 MiB each keep the device busy without much kernel bookkeeping.
constexpr unsigned queue_depth = 32;
constexpr std::size_t chunk_bytes = std::size_t{4} << 20;  // bytes per write SQE (at most)
constexpr std::size_t chunk_iovs = 64;                     // iovecs per write SQE (at most)
constexpr std::uint64_t fsync_tag = ~std::uint64_t{0};
constexpr int max_eagain_retries = 10000;

// One io_uring instance, owned by one thread. SINGLE_ISSUER|DEFER_TASKRUN (kernel >= 6.1) lets
// the kernel skip cross-thread synchronisation and run completions only when we wait for them;
// older kernels reject the flags with -EINVAL and get a plain ring.
class ring {
 public:
  // Throws io_error; `unavailable` is set instead when the kernel refuses io_uring altogether.
  explicit ring(bool& unavailable) : owner_(::getpid()) {
    int rc = io_uring_queue_init(queue_depth, &ring_,
                                 IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
    if (rc == -EINVAL) rc = io_uring_queue_init(queue_depth, &ring_, 0);
    if (rc == -ENOSYS || rc == -EPERM) {
      unavailable = true;
      return;
    }
    if (rc < 0) throw_errno(-rc, "io_uring_queue_init");
    ok_ = true;
  }
  ring(const ring&) = delete;
  ring& operator=(const ring&) = delete;
  ~ring() {
    // In a forked child the mappings are shared with the parent's ring: unmapping our copies and
    // closing our fd does not disturb the parent (io_uring_queue_exit does exactly that).
    if (ok_) io_uring_queue_exit(&ring_);
  }
  io_uring* get() { return &ring_; }
  pid_t owner() const { return owner_; }

 private:
  io_uring ring_{};
  pid_t owner_;
  bool ok_ = false;
};

struct thread_state {
  std::unique_ptr<ring> r;
  bool unavailable = false;
};
thread_local thread_state tls;

// This thread's ring, or nullptr if io_uring is unavailable (then the caller uses pwritev).
ring* local_ring() {
  if (tls.unavailable) return nullptr;
  // After fork() the child inherits the parent's ring memory (MAP_SHARED) and, with
  // SINGLE_ISSUER, may not submit on it: make a new one.
  if (tls.r && tls.r->owner() != ::getpid()) tls.r.reset();
  if (!tls.r) {
    auto r = std::make_unique<ring>(tls.unavailable);
    if (tls.unavailable) return nullptr;
    tls.r = std::move(r);
  }
  return tls.r.get();
}

// One write SQE's worth of work: a contiguous file range described by iovecs. Short writes
// advance `first`/the front iovec and the offset, and the rest is resubmitted.
struct write_op {
  std::uint64_t off = 0;
  std::vector<iovec> iov;
  std::size_t first = 0;
  std::uint64_t left = 0;
  int eagain = 0;

  void advance(std::size_t n) {
    off += n;
    left -= n;
    while (n > 0) {
      iovec& v = iov[first];
      std::size_t k = std::min(n, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + k;
      v.iov_len -= k;
      n -= k;
      if (v.iov_len == 0) ++first;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
};

std::vector<write_op> plan(std::span<const std::span<const std::byte>> segments,
                           std::uint64_t offset) {
  std::vector<write_op> ops;
  write_op cur;
  cur.off = offset;
  auto flush = [&] {
    if (cur.left == 0) return;
    std::uint64_t next = cur.off + cur.left;
    ops.push_back(std::move(cur));
    cur = write_op{};
    cur.off = next;
  };
  for (auto seg : segments) {
    while (!seg.empty()) {
      std::size_t k = std::min<std::size_t>(seg.size(), chunk_bytes - cur.left);
      // iovec wants a non-const pointer; the kernel only reads from it for a write.
      cur.iov.push_back({const_cast<std::byte*>(seg.data()), k});
      cur.left += k;
      seg = seg.subspan(k);
      if (cur.left == chunk_bytes || cur.iov.size() == chunk_iovs) flush();
    }
  }
  flush();
  return ops;
}

// Fallback without io_uring: the same batching with pwritev, then fdatasync.
void write_sync(int fd, std::vector<write_op>& ops) {
  for (auto& op : ops) {
    while (op.left > 0) {
      int cnt = static_cast<int>(std::min<std::size_t>(op.iov.size() - op.first, IOV_MAX));
      ssize_t n = ::pwritev(fd, op.iov.data() + op.first, cnt, static_cast<off_t>(op.off));
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        throw_errno(errno, "object write");
      }
      if (n == 0) throw_errno(EIO, "object write made no progress");
      op.advance(static_cast<std::size_t>(n));
    }
  }
  if (::fdatasync(fd) != 0) throw_errno(errno, "object fdatasync");
}

// Submits what is queued and waits for at least one completion. Retries EINTR/EAGAIN/EBUSY
// (SQEs already published stay in the ring and go in with the next io_uring_enter).
void submit_and_wait(io_uring* r) {
  for (;;) {
    int rc = io_uring_submit_and_wait(r, 1);
    if (rc >= 0) return;
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    // The ring is in an unknown state: drop it so the next put starts clean, then fail.
    tls.r.reset();
    throw_errno(-rc, "io_uring_enter");
  }
}

}  // namespace

bool uring_available() {
  return local_ring() != nullptr;
}

void write_and_datasync(int fd, std::span<const std::span<const std::byte>> segments,
                        std::uint64_t offset) {
  std::vector<write_op> ops = plan(segments, offset);
  ring* rg = local_ring();
  if (!rg) return write_sync(fd, ops);
  io_uring* r = rg->get();

  std::deque<std::size_t> ready;
  for (std::size_t i = 0; i < ops.size(); ++i) ready.push_back(i);
  unsigned inflight = 0;
  int err = 0;
  // Writes: keep up to queue_depth SQEs in flight; on the first error stop submitting and
  // drain, so that no request still references the caller's buffers when we throw.
  while ((err == 0 && !ready.empty()) || inflight > 0) {
    while (err == 0 && !ready.empty() && inflight < queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(r);
      if (!sqe) break;
      std::size_t i = ready.front();
      ready.pop_front();
      write_op& op = ops[i];
      unsigned cnt = static_cast<unsigned>(op.iov.size() - op.first);
      io_uring_prep_writev(sqe, fd, op.iov.data() + op.first, cnt, op.off);
      io_uring_sqe_set_data64(sqe, i);
      ++inflight;
    }
    submit_and_wait(r);
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(r, head, cqe) {
      ++seen;
      --inflight;
      std::size_t i = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      write_op& op = ops[i];
      if (res == -EAGAIN || res == -EINTR) {
        if (++op.eagain > max_eagain_retries && err == 0) err = EAGAIN;
        ready.push_back(i);
      } else if (res < 0) {
        if (err == 0) err = -res;
      } else if (res == 0) {
        if (err == 0) err = EIO;  // no progress and no error: do not spin
      } else {
        op.advance(static_cast<std::size_t>(res));
        if (op.left > 0) ready.push_back(i);
      }
    }
    io_uring_cq_advance(r, seen);
  }
  if (err != 0) throw_errno(err, "object write (io_uring)");

  // Only now the fsync: queued operations are unordered, so it must follow the write CQEs.
  io_uring_sqe* sqe = io_uring_get_sqe(r);
  if (!sqe) {  // cannot happen (the SQ is empty after the loop), but do not guess
    if (::fdatasync(fd) != 0) throw_errno(errno, "object fdatasync");
    return;
  }
  io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
  io_uring_sqe_set_data64(sqe, fsync_tag);
  int res = 0;
  bool done = false;
  while (!done) {
    submit_and_wait(r);
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(r, head, cqe) {
      ++seen;
      if (io_uring_cqe_get_data64(cqe) == fsync_tag) {
        res = cqe->res;
        done = true;
      }
    }
    io_uring_cq_advance(r, seen);
  }
  // fsync errors are never retried: the kernel may already have dropped the dirty pages.
  if (res < 0) throw_errno(-res, "object fdatasync (io_uring)");
}

}  // namespace ckpt::store::detail
