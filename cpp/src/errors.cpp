#include "stridedfa/errors.hpp"

namespace stridedfa {

ErrorKind classify_current_exception(std::string& message) noexcept {
  try {
    throw;
  } catch (const BoundsError& e) {
    message = e.what();
    return ErrorKind::bounds;
  } catch (const LayoutError& e) {
    message = e.what();
    return ErrorKind::layout;
  } catch (const UnsupportedError& e) {
    message = e.what();
    return ErrorKind::unsupported;
  } catch (const BackendError& e) {
    message = e.what();
    return ErrorKind::backend;
  } catch (const std::exception& e) {
    message = e.what();
    return ErrorKind::other;
  } catch (...) {
    message = "unknown C++ exception";
    return ErrorKind::other;
  }
}

}  // namespace stridedfa
