// A bounded, thread-safe LRU cache of built cuDNN graphs. A graph build costs 40 ms to 1 s, so a
// call must never build twice for the same key: concurrent misses on one key wait for the first
// build. Configurations cuDNN rejects are cached too (as their UnsupportedError), so a rejected
// call fails fast every time; other build failures are not cached.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace stridedfa {

class BuiltGraph;

struct CacheStats {
  int64_t hits = 0, misses = 0, builds = 0, build_failures = 0, evictions = 0;
  int64_t size = 0, capacity = 0;
  double build_seconds = 0.0;  // summed over all builds
};

class GraphCache {
 public:
  using Key = std::vector<int64_t>;
  using Builder = std::function<std::shared_ptr<const BuiltGraph>()>;

  // Names one built entry without its key, for a caller that repeats a call: redeeming it skips
  // hashing and comparing the key. It goes stale when any entry leaves the cache.
  struct Ticket {
    const void* entry = nullptr;  // null: no ticket
    uint64_t erasures = 0;        // the cache's erasure count when issued
  };

  explicit GraphCache(size_t capacity);
  ~GraphCache();

  // The graph for `key`, built with `build` on a miss. Rethrows the build's exception. When
  // `ticket` is given, it is set to name the entry (or cleared if the graph is not cached).
  std::shared_ptr<const BuiltGraph> get_or_build(const Key& key, const Builder& build, Ticket* ticket = nullptr);

  // The graph a ticket names, counted as a hit; null when the ticket is stale.
  std::shared_ptr<const BuiltGraph> redeem(const Ticket& ticket);

  CacheStats stats() const;
  void clear();                        // drops entries and resets the counters
  void set_capacity(size_t capacity);  // evicts least recently used entries beyond it

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The process-wide cache; its capacity comes from STRIDEDFA_GRAPH_CACHE_SIZE (default 256).
GraphCache& graph_cache();

}  // namespace stridedfa
