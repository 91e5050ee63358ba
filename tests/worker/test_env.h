// Locations the worker/model tests need: the test data directory, the Python virtual
// environment used for reference runs, and a scratch directory.
#ifndef OOMB_TESTS_WORKER_TEST_ENV_H_
#define OOMB_TESTS_WORKER_TEST_ENV_H_

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace oomb::testing {

// $OOMB_DATA_DIR, else $HOME/.cache/oomb/data (filled by scripts/fetch_test_data.sh).
inline std::string DataDir() {
  if (const char* d = std::getenv("OOMB_DATA_DIR"); d != nullptr && *d != '\0') return d;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") + "/.cache/oomb/data";
}

// The venv's python ($OOMB_VENV/bin/python, else $HOME/.cache/oomb/venv/bin/python), or "" if
// it does not exist.
inline std::string VenvPython() {
  std::string venv;
  if (const char* v = std::getenv("OOMB_VENV"); v != nullptr && *v != '\0') {
    venv = v;
  } else {
    const char* home = std::getenv("HOME");
    venv = std::string(home != nullptr ? home : "") + "/.cache/oomb/venv";
  }
  const std::string py = venv + "/bin/python";
  return std::filesystem::exists(py) ? py : "";
}

// The source tree (for tests/python scripts).
inline std::string SourceDir() {
  if (const char* d = std::getenv("OOMB_SOURCE_DIR"); d != nullptr && *d != '\0') return d;
  return OOMB_TEST_SOURCE_DIR;
}

// A fresh, empty directory under the system temp dir, unique to this process and `name`.
inline std::string ScratchDir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / ("oomb_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Runs `cmd` through the shell; returns its exit status (-1 if it could not run).
inline int RunCommand(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc == -1) return -1;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_WORKER_TEST_ENV_H_
