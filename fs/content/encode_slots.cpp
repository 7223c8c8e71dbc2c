#include "fs/content/encode_slots.hpp"

namespace ckpt::fs {

encode_slots::encode_slots(std::size_t count, std::size_t slab_bytes)
    : slab_bytes_(slab_bytes),
      sets_(count ? count : 1),
      busy_(sets_.size()),
      enc_capacity_(sets_.size()) {}

encode_slots::lease encode_slots::acquire() {
  std::unique_lock lock(mu_);
  std::size_t i = 0;
  free_cv_.wait(lock, [&] {
    for (i = 0; i < busy_.size(); ++i)
      if (!busy_[i]) return true;
    return false;
  });
  busy_[i] = true;
  slabs& s = sets_[i];
  if (!s.cur.data()) {  // made on first use, under the lock: a set is made once
    try {
      s.cur = store::page_buffer(slab_bytes_);
      s.base = store::page_buffer(slab_bytes_);
      s.recon = store::page_buffer(slab_bytes_);
    } catch (...) {
      s = slabs{};
      busy_[i] = false;
      throw;
    }
  }
  return lease(this, i);
}

void encode_slots::give_back(std::size_t index) {
  {
    std::lock_guard lock(mu_);
    sets_[index].enc.clear();
    enc_capacity_[index] = sets_[index].enc.capacity();
    busy_[index] = false;
  }
  free_cv_.notify_one();
}

encode_slots::lease::~lease() {
  if (owner_) owner_->give_back(index_);
}

encode_slots::slabs& encode_slots::lease::get() const {
  return owner_->sets_[index_];
}

std::size_t encode_slots::in_use() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (bool b : busy_) n += b;
  return n;
}

std::uint64_t encode_slots::resident_bytes() const {
  std::lock_guard lock(mu_);
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < sets_.size(); ++i)
    n += sets_[i].cur.capacity() + sets_[i].base.capacity() + sets_[i].recon.capacity() +
         enc_capacity_[i];
  return n;
}

}  // namespace ckpt::fs
