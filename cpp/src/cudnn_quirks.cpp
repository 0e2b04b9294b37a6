// The quirks table's lookups (cudnn_quirks.hpp).
#include "stridedfa/cudnn_quirks.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace stridedfa {
namespace {

// The quirks STRIDEDFA_LIFT_QUIRKS names, read at the first question.
struct Lifted {
  bool quirk[static_cast<int>(Quirk::kCount)] = {};
  Lifted() {
    const char* env = std::getenv("STRIDEDFA_LIFT_QUIRKS");
    if (env == nullptr) return;
    const std::string list = std::string(",") + env + ",";
    for (const QuirkInfo& q : kQuirks) {
      if (list.find(std::string(",") + q.name + ",") != std::string::npos) quirk[static_cast<int>(q.id)] = true;
    }
  }
};

}  // namespace

const QuirkInfo& quirk_info(Quirk q) { return kQuirks[static_cast<int>(q)]; }

std::string quirk_tag(Quirk q) { return std::string(" [cuDNN quirk ") + quirk_info(q).name + "]"; }

bool quirk_applies(Quirk q, int64_t cudnn_version) {
  static const Lifted lifted;
  const QuirkInfo& info = quirk_info(q);
  if (lifted.quirk[static_cast<int>(q)]) return false;
  return info.fixed_in == 0 || cudnn_version == 0 || cudnn_version < info.fixed_in;
}

bool quirk_applies_named(const char* name, int64_t cudnn_version) {
  for (const QuirkInfo& q : kQuirks) {
    if (std::strcmp(q.name, name) == 0) return quirk_applies(q.id, cudnn_version);
  }
  throw std::invalid_argument(std::string("no cuDNN quirk named ") + name);
}

}  // namespace stridedfa
