// Reclaiming: versions that nothing needs any more (no name, no dependent delta, not a lineage
// head) are dropped, and their objects removed once no decode that started earlier can still
// read them and the journal records that stopped needing them are durable.
#include "fs/content/content_impl.hpp"

namespace ckpt::fs {

// Removes versions that nothing needs any more; caller holds mu. Returns objects to delete.
void content_store::impl::collect(std::uint64_t v, std::vector<std::uint64_t>& objects_to_remove) {
  std::vector<std::uint64_t> work{v};
  while (!work.empty()) {
    v = work.back();
    work.pop_back();
    auto it = versions.find(v);
    if (it == versions.end()) continue;
    version_rec& r = it->second;
    if (!r.refs && !r.donors.empty()) {
      // Without a name nobody reads this version whole: its donors were only for that.
      for (const std::uint64_t d : r.donors) {
        auto b = versions.find(d);
        if (b == versions.end() || b->second.dependents == 0) continue;
        --b->second.dependents;
        work.push_back(d);
      }
      r.donors.clear();
      r.donors_released = true;
    }
    if (r.refs || r.dependents || is_head(r)) continue;
    objects_to_remove.push_back(r.obj.id);
    std::vector<std::uint64_t> needed = r.donors;  // what it kept alive
    if (r.base) needed.push_back(r.base);
    graveyard.insert_or_assign(v, r);
    versions.erase(it);
    for (const std::uint64_t n : needed) {
      auto b = versions.find(n);
      if (b == versions.end() || b->second.dependents == 0) continue;
      --b->second.dependents;
      work.push_back(n);
    }
  }
}

// Removes objects once no decode that started before this call can read them (see
// read_guard). The ids must be in `removing` (take_unneeded) or otherwise unreferenced.
void content_store::impl::remove_objects(const std::vector<std::uint64_t>& ids) {
  if (ids.empty()) return;
  {
    std::lock_guard lock(epoch_mu);
    deferred.emplace_back(++epoch, ids);
  }
  drain();
}

// Carries out the deferred removals no active guard can still need.
void content_store::impl::drain() {
  std::vector<std::uint64_t> ready;
  {
    std::lock_guard lock(epoch_mu);
    if (deferred.empty()) return;
    const std::uint64_t oldest = active_epochs.empty() ? UINT64_MAX : *active_epochs.begin();
    auto keep = std::stable_partition(deferred.begin(), deferred.end(),
                                      [&](const auto& d) { return d.first > oldest; });
    for (auto it = keep; it != deferred.end(); ++it)
      ready.insert(ready.end(), it->second.begin(), it->second.end());
    deferred.erase(keep, deferred.end());
  }
  if (ready.empty()) return;
  for (auto id : ready) {
    try {
      objects.remove(id);
    } catch (...) {
      // Left for gc: an unreferenced object is garbage, never a dangling reference.
    }
  }
  std::lock_guard lock(mu);
  const std::set<std::uint64_t> gone(ready.begin(), ready.end());
  for (auto id : ready) removing.erase(id);
  std::erase_if(graveyard, [&](const auto& g) { return gone.count(g.second.obj.id) != 0; });
}

std::vector<std::uint64_t> content_store::take_unneeded_objects() {
  std::lock_guard lock(impl_->mu);
  impl_->removing.insert(impl_->unneeded.begin(), impl_->unneeded.end());
  return std::exchange(impl_->unneeded, {});
}

void content_store::return_unneeded_objects(const std::vector<std::uint64_t>& ids) {
  std::lock_guard lock(impl_->mu);
  for (auto id : ids) impl_->removing.erase(id);
  impl_->unneeded.insert(impl_->unneeded.end(), ids.begin(), ids.end());
}

bool content_store::has_unneeded_objects() const {
  std::lock_guard lock(impl_->mu);
  return !impl_->unneeded.empty();
}

void content_store::remove_objects(const std::vector<std::uint64_t>& ids) {
  impl_->remove_objects(ids);
}

std::uint64_t content_store::impl::image_unpaid(std::uint64_t lineage) {
  if (!lineage || !heads || opt.heads_always) return 0;
  const auto l = lineages.find(lineage);
  if (l == lineages.end()) return 0;
  const auto h = versions.find(l->second.head);
  // Checkpoints below head_min have no image: no need to look (image_pays walks the store).
  if (h == versions.end() || h->second.size < opt.head_min || image_pays(lineage, h->first))
    return 0;
  l->second.single = true;  // its next save makes no image either (lineage_rec::single)
  return h->first;
}

void content_store::unref(const content_ref& ref) {
  if (!ref.version) return;
  std::uint64_t drop_image = 0;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->versions.find(ref.version);
    if (it == impl_->versions.end() || it->second.refs == 0) return;
    const bool unnamed = --it->second.refs == 0;  // else a pin or another name still holds it
    const std::uint64_t lineage = it->second.lineage;
    // Removed after the next journal sync: collecting a base chain may also take a superseded
    // head whose successor's record is not durable yet.
    impl_->collect(ref.version, impl_->unneeded);
    impl_->hint_chain(ref.version);  // kept without a name: its chain may be worth freeing
    // The last other live file of the lineage went (a save over it, its directory rotated
    // away): its head's image would now be a second copy of the one file left. A reader's pin
    // let go, or one of several names, changes no file's life: a lineage's first version, the
    // only file, keeps its image through the reads of it. The head itself losing its last name
    // (truncated at open by a save over it, removed) leaves an image only a save in progress
    // may still read (it retired it already: head_store::retire), so it goes too.
    if (unnamed) drop_image = impl_->image_unpaid(lineage);
  }
  // Outside mu: the head store takes its own lock. Reads of the head decode its chain from now
  // on, and its next save reads its base through the chain (as with heads=off).
  if (drop_image) impl_->heads->drop(drop_image);
}

}  // namespace ckpt::fs
