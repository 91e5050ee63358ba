#include "server/serve.h"

#include <signal.h>

#include <iostream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "server/daemon.h"

namespace oomb::server {

int Serve(const ServerConfig& config, const ServeEnvironment& env) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("oombd"));  // logs on stderr, never stdout
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  // Signals are taken by sigwait() below: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(config, env);
  if (!daemon.ok()) {
    std::cerr << "oombd: " << daemon.status().message() << "\n";
    return 1;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  (*daemon)->Shutdown(absl::Now() + absl::Seconds(config.shutdown_grace_seconds));
  daemon->reset();
  std::cerr << "oombd: stopped" << std::endl;
  return 0;
}

}  // namespace oomb::server
