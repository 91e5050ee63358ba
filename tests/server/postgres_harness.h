// A throwaway PostgreSQL server for tests: `initdb` into a fresh temporary directory, then
// `postgres` on 127.0.0.1 and a free port (no Unix socket, trust authentication, fsync off), as
// a child of the test process that dies with it (PR_SET_PDEATHSIG) and is stopped by the
// destructor. PostgreSQL refuses to run as root: as root, initdb and the server run as the
// `postgres` user (the Debian package creates it), as CI does.
//
// Binaries: $OOMB_PG_BINDIR, else the newest /usr/lib/postgresql/<version>/bin (Debian), else
// `pg_config --bindir`, else the PATH. Tests skip only when no `initdb` and `postgres` exist at
// all (PostgresServer::BinDir() is empty); any other failure to start is a test failure.
#ifndef OOMB_TESTS_SERVER_POSTGRES_HARNESS_H_
#define OOMB_TESTS_SERVER_POSTGRES_HARNESS_H_

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace oomb::testing {

class PostgresServer {
 public:
  // The directory holding initdb, postgres and psql; empty when PostgreSQL is not installed.
  static std::string BinDir() {
    namespace fs = std::filesystem;
    auto has = [](const fs::path& d) { return fs::exists(d / "initdb") && fs::exists(d / "postgres"); };
    if (const char* d = std::getenv("OOMB_PG_BINDIR"); d != nullptr && *d != '\0') return has(d) ? d : "";
    std::string best;
    int best_version = -1;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
      const int version = std::atoi(e.path().filename().c_str());
      if (version > best_version && has(e.path() / "bin")) {
        best_version = version;
        best = (e.path() / "bin").string();
      }
    }
    if (!best.empty()) return best;
    if (FILE* p = ::popen("pg_config --bindir 2>/dev/null", "r"); p != nullptr) {
      char buf[4096] = {};
      std::string out = std::fgets(buf, sizeof buf, p) != nullptr ? buf : "";
      ::pclose(p);
      while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
      if (!out.empty() && has(out)) return out;
    }
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path != nullptr ? path : "");
    for (std::string d; std::getline(dirs, d, ':');) {
      if (!d.empty() && has(d)) return d;
    }
    return "";
  }

  // Starts a server in a new directory under `parent`; on failure, `error` says why and the
  // result is null.
  static std::unique_ptr<PostgresServer> Start(const std::filesystem::path& parent, std::string* error) {
    std::unique_ptr<PostgresServer> s(new PostgresServer());
    s->bin_ = BinDir();
    if (s->bin_.empty()) {
      *error = "no PostgreSQL binaries (initdb, postgres)";
      return nullptr;
    }
    s->dir_ = parent / "postgres";
    std::filesystem::remove_all(s->dir_);
    std::filesystem::create_directories(s->dir_);
    if (::geteuid() == 0) {
      const struct passwd* pw = ::getpwnam("postgres");
      if (pw == nullptr) {
        *error = "running as root and there is no `postgres` user to run PostgreSQL as";
        return nullptr;
      }
      s->uid_ = pw->pw_uid;
      s->gid_ = pw->pw_gid;
      // The server's user must reach its directory (`parent` is the test's own temporary one).
      std::error_code ec;
      std::filesystem::permissions(parent, std::filesystem::perms::others_exec, std::filesystem::perm_options::add, ec);
      if (::chown(s->dir_.c_str(), s->uid_, s->gid_) != 0) {
        *error = "chown " + s->dir_.string() + " failed";
        return nullptr;
      }
    }
    const std::string log = (s->dir_ / "initdb.log").string();
    const int rc = s->RunAndWait({s->bin_ + "/initdb", "-D", (s->dir_ / "data").string(), "-U", "postgres",
                                  "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"},
                                 log);
    if (rc != 0) {
      *error = "initdb failed (exit " + std::to_string(rc) + "): " + Slurp(log);
      return nullptr;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      s->port_ = FreePort();
      if (s->Launch()) return s;
    }
    *error = "postgres did not start: " + Slurp(s->dir_ / "postgres.log");
    return nullptr;
  }

  ~PostgresServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGQUIT);  // immediate shutdown
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int port() const { return port_; }
  std::string Url(const std::string& database) const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/" + database;
  }

  // Runs SQL with psql against the `postgres` database; returns psql's exit code.
  int Psql(const std::string& sql) const {
    const std::string log = (dir_ / "psql.log").string();
    return RunAndWait({bin_ + "/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                       std::to_string(port_), "-U", "postgres", "-d", "postgres", "-c", sql},
                      log);
  }

  // A new empty database; returns its URL (empty on failure, after a test failure).
  std::string CreateDatabase(const std::string& name) const {
    if (Psql("CREATE DATABASE " + name) != 0) return "";
    return Url(name);
  }

  std::string log() const { return Slurp(dir_ / "postgres.log"); }

 private:
  PostgresServer() = default;

  static std::string Slurp(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
  }

  // Forks and execs `argv` (as the postgres user when root), stdout and stderr to `log`; the
  // child gets SIGKILL when the test process dies.
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) const {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    if (std::freopen(log.c_str(), "a", stdout) == nullptr || std::freopen(log.c_str(), "a", stderr) == nullptr) {
      ::_exit(126);
    }
    if (uid_ != 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(gid_) != 0 || ::setuid(uid_) != 0) ::_exit(125);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // after setuid, which clears it
    if (::chdir(dir_.c_str()) != 0) ::_exit(124);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }

  int RunAndWait(const std::vector<std::string>& argv, const std::string& log) const {
    const pid_t pid = Spawn(argv, log);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Starts postgres on port_ and waits until it accepts connections.
  bool Launch() {
    const std::string log = (dir_ / "postgres.log").string();
    pid_ = Spawn({bin_ + "/postgres", "-D", (dir_ / "data").string(), "-p", std::to_string(port_), "-c",
                  "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off", "-c",
                  "full_page_writes=off", "-c", "max_connections=100"},
                 log);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: the port was taken, or worse
        pid_ = -1;
        return false;
      }
      if (RunAndWait({bin_ + "/pg_isready", "-q", "-h", "127.0.0.1", "-p", std::to_string(port_)},
                     (dir_ / "pg_isready.log").string()) == 0) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return false;
  }

  std::string bin_;
  std::filesystem::path dir_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace oomb::testing

#endif  // OOMB_TESTS_SERVER_POSTGRES_HARNESS_H_
