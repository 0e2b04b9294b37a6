#include "stridedfa/graph_cache.hpp"

#include <chrono>
#include <cstdlib>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "stridedfa/errors.hpp"

namespace stridedfa {
namespace {

struct KeyHash {
  size_t operator()(const GraphCache::Key& key) const noexcept {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ key.size();
    for (int64_t v : key) {  // splitmix64-style mixing of every field
      uint64_t x = static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      h ^= x ^ (x >> 31);
    }
    return static_cast<size_t>(h);
  }
};

using GraphFuture = std::shared_future<std::shared_ptr<const BuiltGraph>>;

}  // namespace

struct GraphCache::Impl {
  struct Entry {
    GraphFuture graph;
    std::list<Key>::iterator lru;             // position in recency order (front = most recent)
    uint64_t generation;                      // tells a re-inserted key from the entry a builder made
    std::shared_ptr<const BuiltGraph> built;  // set once the build succeeded (tickets need it)
  };
  mutable std::mutex mutex;
  std::unordered_map<Key, Entry, KeyHash> entries;
  std::list<Key> recency;
  size_t capacity;
  uint64_t next_generation = 0;
  // Entries live in the map's nodes, whose addresses survive rehashing but not erasure: a ticket
  // (an entry's address) stays valid while this count is unchanged.
  uint64_t erasures = 0;
  CacheStats counters;

  void forget(const Key& key, uint64_t generation) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = entries.find(key);
    if (it != entries.end() && it->second.generation == generation) {
      recency.erase(it->second.lru);
      entries.erase(it);
      ++erasures;
    }
  }

  void evict_beyond_capacity() {
    while (entries.size() > capacity && !recency.empty()) {
      entries.erase(recency.back());
      recency.pop_back();
      ++counters.evictions;
      ++erasures;
    }
  }

  void issue(Entry& entry, GraphCache::Ticket* ticket) const {
    if (!ticket) return;
    *ticket = entry.built ? GraphCache::Ticket{&entry, erasures} : GraphCache::Ticket{};
  }
};

GraphCache::GraphCache(size_t capacity) : impl_(new Impl) { impl_->capacity = capacity; }
GraphCache::~GraphCache() = default;

std::shared_ptr<const BuiltGraph> GraphCache::get_or_build(const Key& key, const Builder& build, Ticket* ticket) {
  if (ticket) *ticket = Ticket{};
  // Only a miss makes a promise: constructing one allocates, and destroying an unfulfilled one
  // stores a broken_promise exception -- a cost every hit would otherwise pay.
  std::unique_ptr<std::promise<std::shared_ptr<const BuiltGraph>>> promise;
  GraphFuture future;
  bool we_build = false;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->entries.find(key);
    if (it != impl_->entries.end()) {
      ++impl_->counters.hits;
      impl_->recency.splice(impl_->recency.begin(), impl_->recency, it->second.lru);
      future = it->second.graph;
      impl_->issue(it->second, ticket);
    } else {
      ++impl_->counters.misses;
      promise = std::make_unique<std::promise<std::shared_ptr<const BuiltGraph>>>();
      future = promise->get_future().share();
      impl_->recency.push_front(key);
      generation = ++impl_->next_generation;
      impl_->entries.emplace(key, Impl::Entry{future, impl_->recency.begin(), generation});
      impl_->evict_beyond_capacity();
      we_build = true;
    }
  }
  if (!we_build) return future.get();  // waits while another thread builds; rethrows its error

  const auto start = std::chrono::steady_clock::now();
  bool failed = false;
  std::shared_ptr<const BuiltGraph> built;
  try {
    built = build();
    promise->set_value(built);
  } catch (const UnsupportedError&) {
    failed = true;
    promise->set_exception(std::current_exception());  // cached: the answer will not change
  } catch (...) {
    failed = true;
    promise->set_exception(std::current_exception());
    impl_->forget(key, generation);  // not cached: the next call tries again
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ++impl_->counters.builds;
    impl_->counters.build_failures += failed ? 1 : 0;
    impl_->counters.build_seconds += seconds;
    if (built) {
      auto it = impl_->entries.find(key);  // evicted already if the cache is that small
      if (it != impl_->entries.end() && it->second.generation == generation) {
        it->second.built = built;
        impl_->issue(it->second, ticket);
      }
    }
  }
  return future.get();
}

std::shared_ptr<const BuiltGraph> GraphCache::redeem(const Ticket& ticket) {
  if (!ticket.entry) return nullptr;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (ticket.erasures != impl_->erasures) return nullptr;
  auto& entry = *static_cast<Impl::Entry*>(const_cast<void*>(ticket.entry));
  ++impl_->counters.hits;
  impl_->recency.splice(impl_->recency.begin(), impl_->recency, entry.lru);
  return entry.built;
}

CacheStats GraphCache::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  CacheStats s = impl_->counters;
  s.size = static_cast<int64_t>(impl_->entries.size());
  s.capacity = static_cast<int64_t>(impl_->capacity);
  return s;
}

void GraphCache::clear() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->entries.clear();
  impl_->recency.clear();
  impl_->counters = CacheStats{};
  ++impl_->erasures;
}

void GraphCache::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->capacity = capacity;
  impl_->evict_beyond_capacity();
}

GraphCache& graph_cache() {
  static GraphCache* cache = [] {
    size_t capacity = 256;
    if (const char* env = std::getenv("STRIDEDFA_GRAPH_CACHE_SIZE")) {
      char* end = nullptr;
      long long v = std::strtoll(env, &end, 10);
      if (end != env && v > 0) capacity = static_cast<size_t>(v);
    }
    return new GraphCache(capacity);  // never destroyed: graphs may be in use during exit
  }();
  return *cache;
}

}  // namespace stridedfa
