#include "stridedfa/plan_store.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <system_error>

namespace stridedfa {
namespace {

namespace fs = std::filesystem;

// A plan file: kMagic, then three u64 (context bytes, key entries, payload bytes), the context, the
// key (int64 each), the payload, and an FNV-1a checksum (u64) of everything before it. Native byte
// order: a file written on another architecture fails the checksum and is rebuilt.
constexpr char kMagic[8] = {'S', 'F', 'A', 'P', 'L', 'A', 'N', '1'};
constexpr const char* kSuffix = ".plan";
constexpr uint64_t kMaxFileBytes = uint64_t(1) << 32;  // anything larger is not one of ours

uint64_t fnv1a(const uint8_t* data, size_t n, uint64_t h = 0xCBF29CE484222325ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ data[i]) * 0x100000001B3ull;
  return h;
}

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::vector<uint8_t> encode(const std::vector<int64_t>& key, const std::string& context,
                            const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof kMagic);
  put_u64(out, context.size());
  put_u64(out, key.size());
  put_u64(out, payload.size());
  out.insert(out.end(), context.begin(), context.end());
  const auto* k = reinterpret_cast<const uint8_t*>(key.data());
  out.insert(out.end(), k, k + key.size() * sizeof(int64_t));
  out.insert(out.end(), payload.begin(), payload.end());
  put_u64(out, fnv1a(out.data(), out.size()));
  return out;
}

// The payload of a whole, intact file of this key and context; nothing otherwise.
std::optional<std::vector<uint8_t>> decode(const std::vector<uint8_t>& file, const std::vector<int64_t>& key,
                                           const std::string& context) {
  constexpr size_t kHeader = sizeof kMagic + 3 * sizeof(uint64_t);
  if (file.size() < kHeader + sizeof(uint64_t) || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) return {};
  const uint64_t n_context = get_u64(file.data() + 8), n_key = get_u64(file.data() + 16);
  const uint64_t n_payload = get_u64(file.data() + 24);
  // Each length is bounded before they are added, so a corrupt header cannot overflow the sum.
  if (n_context > kMaxFileBytes || n_key > kMaxFileBytes || n_payload > kMaxFileBytes) return {};
  if (file.size() != kHeader + n_context + n_key * sizeof(int64_t) + n_payload + sizeof(uint64_t)) return {};
  const size_t body = file.size() - sizeof(uint64_t);
  if (fnv1a(file.data(), body) != get_u64(file.data() + body)) return {};
  const uint8_t* p = file.data() + kHeader;
  if (n_context != context.size() || std::memcmp(p, context.data(), context.size()) != 0) return {};
  p += n_context;
  if (n_key != key.size() || std::memcmp(p, key.data(), key.size() * sizeof(int64_t)) != 0) return {};
  p += n_key * sizeof(int64_t);
  return std::vector<uint8_t>(p, p + n_payload);
}

bool read_file(const fs::path& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || uint64_t(size) > kMaxFileBytes) return false;
  in.seekg(0);
  out->resize(size_t(size));
  return bool(in.read(reinterpret_cast<char*>(out->data()), size));
}

struct ListedFile {
  fs::path path;
  bool plan = false;  // a plan file; else a writer's temporary file
  int64_t bytes = 0;
  fs::file_time_type used{};
};

// The plan files (and writers' temporary files) of `directory`, never throwing: a directory that
// cannot be read, or entries that vanish while it is read (another process evicting), are skipped.
std::vector<ListedFile> list_files(const std::string& directory) noexcept {
  std::vector<ListedFile> files;
  try {
    std::error_code ec;
    fs::directory_iterator it(directory, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      ListedFile f;
      f.path = it->path();
      const std::string name = f.path.filename().string();
      f.plan = f.path.extension() == kSuffix;
      if (!f.plan && name.find(".plan.tmp.") == std::string::npos) continue;
      std::error_code e1, e2, e3;
      if (!it->is_regular_file(e1) || e1) continue;
      f.bytes = int64_t(it->file_size(e2));
      f.used = it->last_write_time(e3);
      if (e2 || e3) continue;
      files.push_back(std::move(f));
    }
  } catch (const std::exception&) {  // allocation failure: what was listed so far
  }
  return files;
}

// A temporary name no other writer can pick: pid, a per-process count and 64 random bits (ranks
// in separate containers sharing one directory can have equal pids).
std::string temporary_suffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = [] {
    const auto now = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    try {
      std::random_device device;
      return (uint64_t(device()) << 32) ^ uint64_t(device()) ^ now;
    } catch (const std::exception&) {  // no entropy source: the clock and an address still differ
      return now ^ uint64_t(reinterpret_cast<uintptr_t>(&counter));
    }
  }();
  char text[64];
  std::snprintf(text, sizeof text, ".tmp.%d.%llu.%016llx", int(::getpid()), static_cast<unsigned long long>(counter++),
                static_cast<unsigned long long>(salt));
  return text;
}

std::string default_directory() {
  if (const char* off = std::getenv("STRIDEDFA_PERSISTENT_CACHE")) {
    std::string value(off);
    for (char& c : value) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (value == "0" || value == "false" || value == "off" || value == "no") return "";
  }
  if (const char* dir = std::getenv("STRIDEDFA_CACHE_DIR")) {
    if (*dir) return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) {
    if (*xdg) return (fs::path(xdg) / "stridedfa" / "plans").string();
  }
  if (const char* home = std::getenv("HOME")) {
    if (*home) return (fs::path(home) / ".cache" / "stridedfa" / "plans").string();
  }
  return "";  // nowhere to keep plans: builds as before
}

}  // namespace

PlanStore::PlanStore(std::string directory, int64_t max_bytes)
    : directory_(std::move(directory)), max_bytes_(std::max<int64_t>(max_bytes, 0)) {}

std::string PlanStore::path_of(const std::vector<int64_t>& key, const std::string& context) const {
  // The name is a hash of key and context; the file itself holds both, so a collision is caught.
  uint64_t h = fnv1a(reinterpret_cast<const uint8_t*>(key.data()), key.size() * sizeof(int64_t));
  h = fnv1a(reinterpret_cast<const uint8_t*>(context.data()), context.size(), h);
  char name[32];
  std::snprintf(name, sizeof name, "%016llx%s", static_cast<unsigned long long>(h), kSuffix);
  return (fs::path(directory_) / name).string();
}

std::optional<std::vector<uint8_t>> PlanStore::load(const std::vector<int64_t>& key, const std::string& context) {
  if (!enabled()) return {};
  try {
    const fs::path path = path_of(key, context);
    std::vector<uint8_t> file;
    if (!read_file(path, &file)) return {};  // not stored (or removed meanwhile)
    std::optional<std::vector<uint8_t>> payload = decode(file, key, context);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!payload) {
      ++stats_.load_rejections;
      std::error_code ec;
      fs::remove(path, ec);
      return {};
    }
    ++stats_.loads;
    std::error_code ec;  // a load makes the file recent: eviction goes by last use
    fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
    return payload;
  } catch (const std::exception&) {
    return {};
  }
}

bool PlanStore::save(const std::vector<int64_t>& key, const std::string& context, const std::vector<uint8_t>& payload) {
  if (!enabled()) return false;
  bool saved = false;
  try {
    const fs::path path = path_of(key, context);
    const std::vector<uint8_t> file = encode(key, context, payload);
    if (max_bytes_ > 0 && int64_t(file.size()) > max_bytes_) {
      throw std::length_error("a plan larger than the bound");  // kept from evicting every other plan
    }
    std::error_code ec;
    // cuDNN executes what a plan file holds: the directory is made its owner's alone (mode 0700 at
    // creation, so there is no moment in which others could write into it).
    const fs::path directory(directory_);
    if (directory.has_parent_path()) fs::create_directories(directory.parent_path(), ec);
    ::mkdir(directory_.c_str(), 0700);  // an existing directory is left as it is
    // Written under a temporary name, renamed over the plan's name once complete: readers see the
    // old file, the new one, or none -- never a part.
    const fs::path temporary = path.string() + temporary_suffix();
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
      out.close();
      saved = bool(out);
    }
    if (saved) {
      fs::rename(temporary, path, ec);
      saved = !ec;
    }
    if (!saved) fs::remove(temporary, ec);
    if (saved && max_bytes_ > 0) saved = evict_beyond_bound(path.string());  // false: the plan alone is too large
  } catch (const std::exception&) {
    saved = false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++(saved ? stats_.saves : stats_.save_failures);
  return saved;
}

void PlanStore::reject(const std::vector<int64_t>& key, const std::string& context) {
  if (!enabled()) return;
  try {
    std::error_code ec;
    fs::remove(path_of(key, context), ec);
  } catch (const std::exception&) {  // the file stays; its next load rejects it again
  }
  std::lock_guard<std::mutex> lock(mutex_);
  --stats_.loads;
  ++stats_.load_rejections;
}

bool PlanStore::evict_beyond_bound(const std::string& keep) {
  std::vector<ListedFile> files = list_files(directory_);
  files.erase(std::remove_if(files.begin(), files.end(), [](const ListedFile& f) { return !f.plan; }), files.end());
  int64_t total = 0;
  for (const ListedFile& f : files) total += f.bytes;
  if (total <= max_bytes_) return true;
  std::sort(files.begin(), files.end(), [](const ListedFile& a, const ListedFile& b) { return a.used < b.used; });
  // Least recently used first; the plan just written goes last (only if it alone is too large).
  std::stable_partition(files.begin(), files.end(), [&](const ListedFile& f) { return f.path.string() != keep; });
  int64_t evicted = 0;
  bool kept = true;
  std::error_code ec;
  for (const ListedFile& f : files) {
    if (total <= max_bytes_) break;
    const bool removed = fs::remove(f.path, ec);
    std::error_code exists_error;
    if (removed || !fs::exists(f.path, exists_error)) total -= f.bytes;  // gone, by us or another process
    if (!removed) continue;                                              // only what this store removed is counted
    ++evicted;
    if (f.path.string() == keep) kept = false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.evictions += evicted;
  return kept;
}

int64_t PlanStore::clear() {
  if (!enabled()) return 0;
  int64_t removed = 0;
  std::error_code ec;
  for (const ListedFile& f : list_files(directory_)) {
    if (fs::remove(f.path, ec)) ++removed;
  }
  return removed;
}

void PlanStore::usage(int64_t* files, int64_t* bytes) const {
  *files = *bytes = 0;
  if (!enabled()) return;
  for (const ListedFile& f : list_files(directory_)) {
    if (!f.plan) continue;
    ++*files;
    *bytes += f.bytes;
  }
}

PlanStoreStats PlanStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

PlanStore& plan_store() {
  static PlanStore* store = [] {
    int64_t max_bytes = int64_t(1) << 30;
    if (const char* env = std::getenv("STRIDEDFA_CACHE_MAX_BYTES")) {  // a plain byte count; else the default
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(env, &end, 10);
      if (end != env && *end == '\0' && errno == 0 && v >= 0) max_bytes = v;
    }
    return new PlanStore(default_directory(), max_bytes);  // never destroyed: used until exit
  }();
  return *store;
}

}  // namespace stridedfa
