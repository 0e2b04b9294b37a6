// The persisted-plan store (plan_store.hpp): a file is trusted only whole, intact and of its own
// key and context; anything else reads as "not stored" and is removed, and the directory stays
// under its size bound.
#include <doctest/doctest.h>

#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stridedfa/plan_store.hpp"

using namespace stridedfa;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system's temporary one, removed with its files at scope exit.
struct ScratchDirectory {
  fs::path path;
  ScratchDirectory() {
    std::string pattern = (fs::temp_directory_path() / "stridedfa-plans-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~ScratchDirectory() { fs::remove_all(path); }
};

std::vector<fs::path> files_in(const fs::path& directory) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(directory)) files.push_back(entry.path());
  return files;
}

const std::vector<int64_t> kKey = {1, 2, 3, 90100};
const std::string kContext = "cudnn 91900 sm 90";
const std::vector<uint8_t> kPayload(300, 7);

}  // namespace

TEST_CASE("a saved plan loads back in the same key and context, and in no other") {
  ScratchDirectory dir;
  PlanStore store(dir.path.string(), 0);
  REQUIRE(store.save(kKey, kContext, kPayload));
  CHECK(store.load(kKey, kContext) == kPayload);
  CHECK_FALSE(store.load({1, 2, 4, 90100}, kContext).has_value());
  CHECK_FALSE(store.load(kKey, "cudnn 92000 sm 90").has_value());
  CHECK(store.stats().loads == 1);
  CHECK(store.stats().saves == 1);
}

TEST_CASE("a truncated or corrupted file is not trusted, and is removed") {
  for (const bool truncate : {true, false}) {
    ScratchDirectory dir;
    PlanStore store(dir.path.string(), 0);
    REQUIRE(store.save(kKey, kContext, kPayload));
    const fs::path file = files_in(dir.path).at(0);
    if (truncate) {
      fs::resize_file(file, fs::file_size(file) - 5);
    } else {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put(char(42));  // one byte of the payload
    }
    CHECK_FALSE(store.load(kKey, kContext).has_value());
    CHECK(store.stats().load_rejections == 1);
    CHECK(files_in(dir.path).empty());
  }
}

TEST_CASE("the directory is kept under its size bound, least recently used first") {
  ScratchDirectory dir;
  PlanStore store(dir.path.string(), 1000);  // room for two 300-byte plans and their headers
  for (int64_t i = 0; i < 4; ++i) REQUIRE(store.save({i}, kContext, kPayload));
  int64_t files = 0, bytes = 0;
  store.usage(&files, &bytes);
  CHECK(bytes <= 1000);
  CHECK(files < 4);
  CHECK(store.load({3}, kContext).has_value());  // the newest stays
  CHECK(store.stats().evictions >= 1);
  CHECK(store.clear() == files);
  store.usage(&files, &bytes);
  CHECK(files == 0);
}

TEST_CASE("an empty directory disables the store") {
  PlanStore store("", 0);
  CHECK_FALSE(store.enabled());
  CHECK_FALSE(store.save(kKey, kContext, kPayload));
  CHECK_FALSE(store.load(kKey, kContext).has_value());
}
