"""GPU tests (marked ``gpu``); a package so their module names never clash with tests/."""
