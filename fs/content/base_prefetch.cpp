#include "fs/content/base_prefetch.hpp"

#include <new>
#include <utility>

namespace ckpt::fs {

base_prefetch::unit::unit(std::size_t slab_bytes)
    : a_(slab_bytes), b_(slab_bytes), thread_([this](std::stop_token stop) { run(stop); }) {}

base_prefetch::unit::~unit() {
  try {
    wait();
  } catch (...) {
    // The read's error belonged to an encode that is gone.
  }
}

std::byte* base_prefetch::unit::buffer(std::uint64_t index) noexcept {
  return index % 2 ? b_.data() : a_.data();
}

void base_prefetch::unit::start(std::function<void()> read) {
  {
    std::lock_guard lock(mu_);
    job_ = std::move(read);
    error_ = nullptr;
  }
  started_ = true;
  cv_.notify_all();
}

void base_prefetch::unit::wait() {
  if (!started_) return;
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !job_; });
  started_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::uint64_t base_prefetch::unit::resident_bytes() const noexcept {
  return a_.capacity() + b_.capacity();
}

void base_prefetch::unit::run(std::stop_token stop) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!cv_.wait(lock, stop, [&] { return bool(job_); })) return;
    std::function<void()> job = job_;  // job_ stays set until done: wait() watches it
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    job_ = nullptr;
    cv_.notify_all();
  }
}

base_prefetch::lease::~lease() {
  if (!owner_) return;
  try {
    (**this).wait();
  } catch (...) {
    // A read-ahead nobody waited for (the encode failed first): its error is not this one's.
  }
  std::lock_guard lock(owner_->mu_);
  owner_->busy_[index_] = false;
}

base_prefetch::unit& base_prefetch::lease::operator*() const noexcept {
  return *owner_->units_[index_];  // set before the lease was made, never reset while leased
}

base_prefetch::base_prefetch(std::size_t units, std::size_t slab_bytes)
    : slab_bytes_(slab_bytes), units_(units), busy_(units) {}

std::optional<base_prefetch::lease> base_prefetch::try_acquire() noexcept {
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (busy_[i]) continue;
    if (!units_[i]) {
      try {
        units_[i] = std::make_unique<unit>(slab_bytes_);
      } catch (...) {  // no memory or no thread for it: no read-ahead this time
        return std::nullopt;
      }
    }
    busy_[i] = true;
    return lease(this, i);
  }
  return std::nullopt;
}

std::uint64_t base_prefetch::resident_bytes() const {
  std::lock_guard lock(mu_);
  std::uint64_t n = 0;
  for (const auto& u : units_)
    if (u) n += u->resident_bytes();
  return n;
}

}  // namespace ckpt::fs
