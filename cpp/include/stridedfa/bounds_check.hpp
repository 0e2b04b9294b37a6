// The opt-in bounds check (STRIDEDFA_CHECK_BOUNDS=1): the values on the device that index other
// tensors -- padding lengths, cu_seqlens, a paged call's lengths and block ids -- are read back
// and checked before the call launches anything, so that out-of-contract values raise
// BoundsError naming the entry instead of being clamped on the device (which keeps every read
// inside the caller's tensors but computes on the wrong keys). It costs a device-to-host copy and
// a synchronisation of the caller's stream per call: a debugging switch, not a default. A stream
// being captured into a CUDA graph cannot be read: the check is skipped there.
#pragma once

#include <cstdint>

#include "stridedfa/sdpa.hpp"

namespace stridedfa {

// Whether STRIDEDFA_CHECK_BOUNDS is set to something other than "" or "0" (read once).
bool bounds_check_enabled();

// Throws BoundsError for the first out-of-contract value of `call`. The device's context must be
// current (driver calls).
void check_bounds(const PreparedCall& call, std::uintptr_t stream);

}  // namespace stridedfa
