#include "stridedfa/split_kv.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

namespace stridedfa {
namespace {

// Thread blocks a split aims at: cuDNN's decode kernel runs one per (sequence, query head), and two
// waves of a 132-SM H100/H200 keep every SM busy while the slowest chunk finishes.
constexpr int64_t kSplitTargetBlocks = 256;
constexpr int64_t kSplitMinKeys = 256;  // below this a chunk's fixed cost outweighs its keys
constexpr int64_t kSplitMaxChunks = 64;

// -1: not read yet from STRIDEDFA_SPLIT_KV; then 0 (off, the default) or 1 (auto).
std::atomic<int> split_kv_mode{-1};
// Chunks every split call is cut into whatever the heuristic says (0: the heuristic's): benchmarks'
// sweeps, which tune the heuristic.
std::atomic<int64_t> forced_chunks{0};

int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool split_kv_enabled() {
  int mode = split_kv_mode.load(std::memory_order_relaxed);
  if (mode < 0) {
    const char* value = std::getenv("STRIDEDFA_SPLIT_KV");
    int expected = -1;
    split_kv_mode.compare_exchange_strong(expected, value && std::string(value) == "auto" ? 1 : 0);
    mode = split_kv_mode.load(std::memory_order_relaxed);
  }
  return mode == 1;
}

void set_split_kv_enabled(bool enabled) { split_kv_mode.store(enabled ? 1 : 0); }

void set_split_kv_chunks(int64_t chunks) { forced_chunks.store(chunks > 0 ? chunks : 0); }

int64_t split_kv_chunks(int64_t batch, int64_t heads_q, int64_t keys) {
  if (const int64_t forced = forced_chunks.load(std::memory_order_relaxed)) return forced;
  int64_t chunks = 1;
  while (chunks < kSplitMaxChunks && batch * heads_q * chunks < kSplitTargetBlocks &&
         keys / (2 * chunks) >= kSplitMinKeys) {
    chunks *= 2;
  }
  return chunks;
}

int64_t SplitKv::lengths_pitch() const { return (sequences() + 3) / 4 * 4; }

int64_t split_kv_bytes(const SplitKv& s) {
  const int64_t n = s.sequences() * s.heads;
  return aligned(n * s.d_qk * 2) + aligned(n * s.d_v * 2) + aligned(n * 4) + aligned(2 * s.lengths_pitch() * 4);
}

void* split_kv_part(const SplitKv& s, void* scratch, SplitPart part) {
  const int64_t n = s.sequences() * s.heads;
  int64_t offset = 0;
  if (part == SplitPart::queries) return scratch;
  offset += aligned(n * s.d_qk * 2);
  if (part == SplitPart::outputs) return static_cast<char*>(scratch) + offset;
  offset += aligned(n * s.d_v * 2);
  if (part == SplitPart::statistics) return static_cast<char*>(scratch) + offset;
  offset += aligned(n * 4);
  if (part == SplitPart::lengths_kv) offset += s.lengths_pitch() * 4;  // 16-byte aligned, as cuDNN reads it
  return static_cast<char*>(scratch) + offset;
}

}  // namespace stridedfa
