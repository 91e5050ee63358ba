#include "server/serve.h"

#include <signal.h>

#include <iostream>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "server/daemon.h"

namespace oomb::server {

namespace {

// The pattern flag %*: the message as a JSON string (escaped by nlohmann::json; invalid UTF-8
// replaced), for log.format json.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string text = nlohmann::json(std::string(msg.payload.data(), msg.payload.size()))
                                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

// Logs on stderr, never stdout: text, or one JSON object a line (log.format).
void ConfigureLogging(const ServerConfig& config) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("oombd"));
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  if (config.log_format != "json") return;
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<JsonMessageFlag>('*').set_pattern(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","logger":"%n","thread":%t,"message":%*})");
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace

int Serve(const ServerConfig& config, const ServeEnvironment& env) {
  ConfigureLogging(config);
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
