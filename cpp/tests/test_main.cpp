// The core's C++ tests (doctest): rules that need no GPU and no cuDNN -- layouts, overlap,
// validation, the call plan, the plan store. Built and run by tests/tooling/test_cpp_core.py.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
