// Persisted execution plans: a directory of files, one per built graph, that a new process loads
// instead of building again (a build costs 40 ms to 1 s; loading a plan a few ms). Nothing here knows
// cuDNN: a file holds opaque bytes under a key (the graph cache's) and a context (everything else
// that makes a plan valid: cuDNN, GPU, driver, the code that builds graphs), and a file is trusted
// only if both match and its checksum holds. Missing, truncated, corrupt, stale or foreign files
// read as "not stored" (and are removed, so the next save replaces them). Writes go to a temporary
// file renamed over the name, so concurrent writers of one key (several processes of a job) leave
// one whole file; the directory is kept under a size bound, least recently used files first.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace stridedfa {

struct PlanStoreStats {
  int64_t loads = 0;            // plans read and trusted
  int64_t load_rejections = 0;  // files found but not trusted (truncated, corrupt, other key or context)
  int64_t saves = 0;
  int64_t save_failures = 0;  // could not write (read-only or full disk, ...): the call went on without
  int64_t evictions = 0;      // files removed to keep the directory under its size bound
};

class PlanStore {
 public:
  // An empty directory disables the store (load finds nothing, save writes nothing). max_bytes
  // bounds the plan files' total size (0: unbounded).
  PlanStore(std::string directory, int64_t max_bytes);

  bool enabled() const { return !directory_.empty(); }
  const std::string& directory() const { return directory_; }
  int64_t max_bytes() const { return max_bytes_; }

  // The payload saved under (key, context), or nothing. Never throws.
  std::optional<std::vector<uint8_t>> load(const std::vector<int64_t>& key, const std::string& context);
  // Writes the payload under (key, context); false if it could not. Never throws.
  bool save(const std::vector<int64_t>& key, const std::string& context, const std::vector<uint8_t>& payload);
  // Removes the file of (key, context) whose payload load returned but could not be used (cuDNN
  // refused the plan): counted as a rejection instead of a load. Never throws.
  void reject(const std::vector<int64_t>& key, const std::string& context);
  // Removes every plan file (and leftover temporary files) of the directory; returns how many.
  // Never throws.
  int64_t clear();
  // Plan files now in the directory and their total size. Never throws.
  void usage(int64_t* files, int64_t* bytes) const;
  PlanStoreStats stats() const;

 private:
  std::string path_of(const std::vector<int64_t>& key, const std::string& context) const;
  bool evict_beyond_bound(const std::string& keep);  // false when `keep` itself had to go

  std::string directory_;
  int64_t max_bytes_;
  mutable std::mutex mutex_;  // guards stats_
  PlanStoreStats stats_;
};

// The process-wide store. Directory: STRIDEDFA_CACHE_DIR, else $XDG_CACHE_HOME/stridedfa/plans,
// else ~/.cache/stridedfa/plans; STRIDEDFA_PERSISTENT_CACHE=0 disables it. Size bound:
// STRIDEDFA_CACHE_MAX_BYTES, a plain byte count (default 1 GiB). Read once, at the first use. A
// directory the store makes is readable by its owner only: cuDNN executes what a plan holds.
PlanStore& plan_store();

}  // namespace stridedfa
