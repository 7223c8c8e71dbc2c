#pragma once
// A byte-bounded LRU cache of immutable values (reconstructed tensors, decoded blocks, parsed
// metadata). Values are shared_ptrs: an evicted value stays valid for whoever still holds it.
// get_or_load() runs the loader outside the lock and at most once per key at a time (concurrent
// callers for the same key wait for the first one), so two readers never decode the same block
// twice. A value larger than the whole budget is returned but not kept. Thread-safe.
//
// A value its caller still fills (put_pinned) is charged from the start and cannot be evicted
// until its pin is released: a value pushed out while being filled would be memory the budget no
// longer counts, held as long as the filler works on it. Pinned values are never evicted for
// anything; what cannot fit beside them is not kept (a put_pinned says so, so that its caller
// does not fill it).
//
// Part of the budget can be reserved for memory the cache does not hold (reserve()): the cache
// then keeps within what is left, evicting what no longer fits.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace ckpt::cache {

template <class Key, class Value, class Hash = std::hash<Key>>
class lru_cache {
 public:
  using value_ptr = std::shared_ptr<const Value>;

  explicit lru_cache(std::uint64_t budget_bytes) : budget_(budget_bytes) {}

  // Releases a put_pinned value to ordinary LRU eviction when destroyed (or released), as the
  // most recently used value. Empty when the value was not kept. Must not outlive its cache.
  class pin {
   public:
    pin() = default;
    pin(pin&& o) noexcept
        : cache_(std::exchange(o.cache_, nullptr)), key_(std::move(o.key_)), id_(o.id_) {}
    pin& operator=(pin&& o) noexcept {
      if (this != &o) {
        release();
        cache_ = std::exchange(o.cache_, nullptr);
        key_ = std::move(o.key_);
        id_ = o.id_;
      }
      return *this;
    }
    ~pin() { release(); }
    explicit operator bool() const { return cache_ != nullptr; }
    void release() {
      if (auto* c = std::exchange(cache_, nullptr)) c->unpin(key_, id_);
    }

   private:
    friend class lru_cache;
    pin(lru_cache* c, Key k, std::uint64_t id) : cache_(c), key_(std::move(k)), id_(id) {}
    lru_cache* cache_ = nullptr;
    Key key_{};
    std::uint64_t id_ = 0;  // which pinning of the key (entry::pin_id)
  };

  value_ptr get(const Key& k) {
    std::lock_guard lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) return nullptr;
    touch_locked(it->second);
    return it->second.value;
  }

  // Cached or being loaded right now; does not count as a use (the LRU order stays).
  bool present(const Key& k) const {
    std::lock_guard lock(mu_);
    return map_.count(k) || loading_.count(k);
  }

  void put(const Key& k, value_ptr v, std::uint64_t bytes) {
    std::lock_guard lock(mu_);
    insert_locked(k, std::move(v), bytes, false);
  }

  // Charges `bytes` for a value the caller fills after this call (through its own non-const
  // pointer), evicting unpinned values to make room, and keeps it from eviction until the pin
  // goes. An empty pin: not kept (larger than what unpinned values can free), and any value the
  // key had is dropped.
  [[nodiscard]] pin put_pinned(const Key& k, value_ptr v, std::uint64_t bytes) {
    std::lock_guard lock(mu_);
    if (!insert_locked(k, std::move(v), bytes, true)) return {};
    return pin(this, k, map_.at(k).pin_id);
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
        touch_locked(it->second);
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
      insert_locked(k, v, bytes, false);
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

  // Removes k's value and returns it when the cache is its only holder (nothing outside has a
  // copy, and once it is out nobody can get one) and it is not pinned; otherwise nullptr and the
  // cache is unchanged. For a caller that replaces the value and may reuse its memory.
  value_ptr take_unshared(const Key& k) {
    std::lock_guard lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end() || it->second.pinned || it->second.value.use_count() != 1) return nullptr;
    // use_count() is a relaxed load: the fence orders the caller's writes into the value after
    // the last other holder's reads (which came before its release of the count).
    std::atomic_thread_fence(std::memory_order_acquire);
    value_ptr v = std::move(it->second.value);
    remove_locked(it);
    return v;
  }

  void erase(const Key& k) {
    std::lock_guard lock(mu_);
    if (auto it = map_.find(k); it != map_.end()) remove_locked(it);
  }

  // Drops every value not pinned (a pinned one is still being filled: its filler's charge stays).
  void clear() {
    std::lock_guard lock(mu_);
    while (!order_.empty()) remove_locked(map_.find(order_.back()));
  }

  std::uint64_t bytes() const {
    std::lock_guard lock(mu_);
    return bytes_;
  }
  // What the cache may hold now: the budget less the reserve.
  std::uint64_t budget() const {
    std::lock_guard lock(mu_);
    return budget_ - reserved_;
  }
  // Reserves `bytes` of the budget (at most all of it) for memory held elsewhere, replacing the
  // previous reserve; values that no longer fit are evicted now, oldest first (pinned ones stay,
  // and inserts are refused until they fit beside them).
  void reserve(std::uint64_t bytes) {
    std::lock_guard lock(mu_);
    reserved_ = std::min(bytes, budget_);
    while (bytes_ > budget_ - reserved_ && !order_.empty()) remove_locked(map_.find(order_.back()));
  }
  std::uint64_t reserved() const {
    std::lock_guard lock(mu_);
    return reserved_;
  }
  // Of bytes(): values pinned by their fillers.
  std::uint64_t pinned_bytes() const {
    std::lock_guard lock(mu_);
    return pinned_bytes_;
  }

 private:
  // A pinned entry's key is in pinned_, not in order_: eviction walks order_ alone. Its node moves
  // between the two lists by splice, which never allocates (unpin runs in a pin's destructor).
  struct entry {
    value_ptr value;
    std::uint64_t bytes;
    typename std::list<Key>::iterator pos;  // in order_, or in pinned_ while pinned
    bool pinned = false;
    std::uint64_t pin_id = 0;  // set when pinned: a pin releases its own pinning only
  };
  using map_iterator = typename std::unordered_map<Key, entry, Hash>::iterator;

  void touch_locked(entry& e) {
    if (!e.pinned) order_.splice(order_.begin(), order_, e.pos);
  }

  void remove_locked(map_iterator it) {
    bytes_ -= it->second.bytes;
    if (it->second.pinned) {
      pinned_bytes_ -= it->second.bytes;
      pinned_.erase(it->second.pos);
    } else {
      order_.erase(it->second.pos);
    }
    map_.erase(it);
  }

  // False: not kept (the value was larger than the budget less what is pinned). An allocation
  // failure throws with the counts as they were (values evicted for it stay evicted).
  bool insert_locked(const Key& k, value_ptr v, std::uint64_t bytes, bool pinned) {
    if (auto it = map_.find(k); it != map_.end()) remove_locked(it);
    const std::uint64_t limit = budget_ - reserved_;
    if (bytes > limit || pinned_bytes_ + bytes > limit) return false;
    // Unpinned values exist while bytes_ + bytes > limit: pinned ones alone leave room.
    while (bytes_ + bytes > limit) remove_locked(map_.find(order_.back()));
    auto& list = pinned ? pinned_ : order_;
    list.push_front(k);
    try {
      map_.emplace(k, entry{std::move(v), bytes, list.begin(), pinned, pinned ? pins_ + 1 : 0});
    } catch (...) {
      list.pop_front();
      throw;
    }
    if (pinned) {
      ++pins_;
      pinned_bytes_ += bytes;
    }
    bytes_ += bytes;
    return true;
  }

  // The pin's key may since have been erased, or pinned again for another value (which may even
  // sit at the freed value's address): only the pinning it made is released.
  void unpin(const Key& k, std::uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end() || !it->second.pinned || it->second.pin_id != id) return;
    it->second.pinned = false;
    pinned_bytes_ -= it->second.bytes;
    order_.splice(order_.begin(), pinned_, it->second.pos);  // pos stays valid: now in order_
  }

  const std::uint64_t budget_;
  mutable std::mutex mu_;
  std::uint64_t reserved_ = 0;
  std::list<Key> order_;   // most recently used first
  std::list<Key> pinned_;  // keys of pinned entries, in no order that matters
  std::unordered_map<Key, entry, Hash> map_;
  std::unordered_map<Key, std::shared_future<value_ptr>, Hash> loading_;
  std::uint64_t bytes_ = 0;
  std::uint64_t pinned_bytes_ = 0;
  std::uint64_t pins_ = 0;  // pinnings so far
};

}  // namespace ckpt::cache
