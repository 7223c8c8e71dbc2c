#pragma once
// A few threads that run queued jobs in order of submission (commits of finished files). drain()
// waits until every job submitted so far has finished. Jobs must not throw.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt::fs {

class worker_pool {
 public:
  explicit worker_pool(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~worker_pool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    threads_.clear();  // joins (jobs already queued are finished first)
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  void submit(std::function<void()> job) {
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
      ++outstanding_;
    }
    cv_.notify_one();
  }

  void drain() {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [this] { return outstanding_ == 0; });
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      job();
      lk.lock();
      if (--outstanding_ == 0) idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> jobs_;
  std::size_t outstanding_ = 0;
  bool stop_ = false;
  std::vector<std::jthread> threads_;
};

}  // namespace ckpt::fs
