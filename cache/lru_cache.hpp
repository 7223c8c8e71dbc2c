#pragma once
// A byte-bounded LRU cache of immutable values (reconstructed tensors, decoded blocks, parsed
// metadata). Values are shared_ptrs: an evicted value stays valid for whoever still holds it.
// get_or_load() runs the loader outside the lock and at most once per key at a time (concurrent
// callers for the same key wait for the first one), so two readers never decode the same block
// twice. A value larger than the whole budget is returned but not kept. Thread-safe.
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace ckpt::cache {

template <class Key, class Value, class Hash = std::hash<Key>>
class lru_cache {
 public:
  using value_ptr = std::shared_ptr<const Value>;

  explicit lru_cache(std::uint64_t budget_bytes) : budget_(budget_bytes) {}

  value_ptr get(const Key& k) {
    std::lock_guard lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.pos);
    return it->second.value;
  }

  // Cached or being loaded right now; does not count as a use (the LRU order stays).
  bool present(const Key& k) const {
    std::lock_guard lock(mu_);
    return map_.count(k) || loading_.count(k);
  }

  void put(const Key& k, value_ptr v, std::uint64_t bytes) {
    std::lock_guard lock(mu_);
    insert_locked(k, std::move(v), bytes);
  }

  // `load` returns the value and its size in bytes. Exceptions propagate to every waiter and
  // nothing is cached.
  value_ptr get_or_load(const Key& k,
                        const std::function<std::pair<value_ptr, std::uint64_t>()>& load) {
    std::shared_future<value_ptr> wait;
    std::promise<value_ptr> mine;
    {
      std::lock_guard lock(mu_);
      if (auto it = map_.find(k); it != map_.end()) {
        order_.splice(order_.begin(), order_, it->second.pos);
        return it->second.value;
      }
      if (auto it = loading_.find(k); it != loading_.end()) {
        wait = it->second;
      } else {
        loading_.emplace(k, mine.get_future().share());
      }
    }
    if (wait.valid()) return wait.get();
    try {
      auto [v, bytes] = load();
      std::lock_guard lock(mu_);
      insert_locked(k, v, bytes);
      loading_.erase(k);
      mine.set_value(v);
      return v;
    } catch (...) {
      std::lock_guard lock(mu_);
      loading_.erase(k);
      mine.set_exception(std::current_exception());
      throw;
    }
  }

  void erase(const Key& k) {
    std::lock_guard lock(mu_);
    if (auto it = map_.find(k); it != map_.end()) {
      bytes_ -= it->second.bytes;
      order_.erase(it->second.pos);
      map_.erase(it);
    }
  }

  void clear() {
    std::lock_guard lock(mu_);
    map_.clear();
    order_.clear();
    bytes_ = 0;
  }

  std::uint64_t bytes() const {
    std::lock_guard lock(mu_);
    return bytes_;
  }
  std::uint64_t budget() const { return budget_; }

 private:
  struct entry {
    value_ptr value;
    std::uint64_t bytes;
    typename std::list<Key>::iterator pos;
  };

  void insert_locked(const Key& k, value_ptr v, std::uint64_t bytes) {
    if (auto it = map_.find(k); it != map_.end()) {
      bytes_ -= it->second.bytes;
      order_.erase(it->second.pos);
      map_.erase(it);
    }
    if (bytes > budget_) return;
    while (bytes_ + bytes > budget_ && !order_.empty()) {
      auto last = map_.find(order_.back());
      bytes_ -= last->second.bytes;
      map_.erase(last);
      order_.pop_back();
    }
    order_.push_front(k);
    map_.emplace(k, entry{std::move(v), bytes, order_.begin()});
    bytes_ += bytes;
  }

  const std::uint64_t budget_;
  mutable std::mutex mu_;
  std::list<Key> order_;  // most recently used first
  std::unordered_map<Key, entry, Hash> map_;
  std::unordered_map<Key, std::shared_future<value_ptr>, Hash> loading_;
  std::uint64_t bytes_ = 0;
};

}  // namespace ckpt::cache
