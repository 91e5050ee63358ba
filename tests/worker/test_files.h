// Path-based access for tests: the code under test takes opened files and directories
// (worker/common/file_access.h); tests name theirs by path, unconfined.
#ifndef OOMB_TESTS_WORKER_TEST_FILES_H_
#define OOMB_TESTS_WORKER_TEST_FILES_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "worker/common/file_access.h"

namespace oomb::testing {

// The directory at `path`; a missing one fails the test at once.
inline Dir OpenDir(const std::string& path) {
  absl::StatusOr<Dir> d = FileAccess::Unconfined()->OpenDir(path);
  if (!d.ok()) {
    ADD_FAILURE() << d.status();
    std::abort();
  }
  return *std::move(d);
}

// The directory at `path`, created (with its parents) when missing.
inline Dir MakeDirs(const std::string& path) {
  absl::StatusOr<Dir> d = FileAccess::Unconfined()->MakeDirs(path);
  if (!d.ok()) {
    ADD_FAILURE() << d.status();
    std::abort();
  }
  return *std::move(d);
}

inline absl::StatusOr<File> OpenFile(const std::string& path) { return FileAccess::Unconfined()->OpenFile(path); }

}  // namespace oomb::testing

#endif  // OOMB_TESTS_WORKER_TEST_FILES_H_
