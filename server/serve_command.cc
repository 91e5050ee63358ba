// `oombd serve`, `oombd config print`, `oombd openapi` and `oombd version`: the production wiring of the
// daemon (real devices from GetBuildInfo, the real trainer from worker/job/executor.h).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "server/commands.h"
#include "server/config.h"
#include "server/http/gateway.h"
#include "server/http/openapi.h"
#include "server/serve.h"
#include "worker/job/build_info.h"
#include "worker/job/calibration.h"
#include "worker/job/executor.h"

namespace oomb::server {
namespace {

struct ConfigFlags {
  std::string file;
  std::string data_dir;
  std::string listen;
  std::string metrics_listen;
  std::string http_listen;
  std::string token_file;
  bool unix_socket = false;
  std::vector<std::string> sets;
};

void AddConfigFlags(CLI::App* cmd, ConfigFlags* f) {
  cmd->add_option("-c,--config", f->file, "YAML configuration file (see `oombd config print`)")
      ->transform(AbsolutePath());
  cmd->add_option("--data-dir", f->data_dir, "server.data_dir: job store, checkpoints, port file")
      ->transform(AbsolutePath());
  cmd->add_option("--listen", f->listen, "server.listen: TCP host:port (port 0: any free port)");
  cmd->add_option("--metrics-listen", f->metrics_listen,
                  "metrics.listen: /metrics host:port (port 0: any free port; off: --set metrics.listen=)");
  cmd->add_option("--http-listen", f->http_listen,
                  "http.listen: HTTP/JSON host:port (port 0: any free port; off: --set http.listen=)");
  cmd->add_flag("--unix-socket", f->unix_socket, "server.unix_socket: also listen on <data_dir>/oombd.sock");
  cmd->add_option("--token-file", f->token_file, "auth.token_file: require this bearer token")
      ->transform(AbsolutePath());
  cmd->add_option("--set", f->sets, "section.key=value, any configuration key (repeatable)");
}

ServerConfig LoadOrExit(const ConfigFlags& f) {
  ConfigSources sources;
  sources.file = f.file;
  sources.env = ProcessEnvironment();
  sources.overrides = f.sets;
  if (!f.data_dir.empty()) sources.overrides.push_back("server.data_dir=" + f.data_dir);
  if (!f.listen.empty()) sources.overrides.push_back("server.listen=" + f.listen);
  if (!f.metrics_listen.empty()) sources.overrides.push_back("metrics.listen=" + f.metrics_listen);
  if (!f.http_listen.empty()) sources.overrides.push_back("http.listen=" + f.http_listen);
  if (f.unix_socket) sources.overrides.push_back("server.unix_socket=true");
  if (!f.token_file.empty()) sources.overrides.push_back("auth.token_file=" + f.token_file);
  absl::StatusOr<ServerConfig> config = LoadServerConfig(sources);
  if (!config.ok()) {
    std::cerr << "oombd: " << config.status().message() << "\n";
    throw CLI::RuntimeError(2);
  }
  return *config;
}

ServeEnvironment ProductionEnvironment() {
  const BuildInfo info = GetBuildInfo();
  ServeEnvironment env;
  env.runner = RunJob;
  env.validate_data = ValidateJobData;  // (spec, files): the scheduler's and CreateJob's scans
  env.measure_rates = MeasureEngineRates;
  env.rates_key = EngineRatesKey;
  env.server_info.set_version(info.version);
  env.server_info.set_git_sha(info.git_sha);
  env.server_info.set_torch_version(info.torch_version);
  env.server_info.set_cuda_version(info.cuda_version);
  env.build = info;
  env.device_memory = GetDeviceMemoryStats;
  env.pinned_host_bytes = GetPinnedHostBytes;
  for (const DeviceInfo& d : info.devices) {
    v1::ServerInfo::Device* out = env.server_info.add_devices();
    out->set_name(d.name);
    out->set_model(d.model);
    out->set_memory_bytes(d.memory_bytes);
    out->set_compute_capability(d.compute_capability);
    if (d.name != "cpu") env.devices.push_back(d.name);
  }
  if (env.devices.empty()) env.devices.push_back("cpu");
  env.server_info.set_host_memory_bytes(static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE));
  return env;
}

}  // namespace

void RegisterServeCommands(CLI::App& app) {
  auto flags = std::make_shared<ConfigFlags>();
  CLI::App* serve = app.add_subcommand("serve", "Run the daemon: gRPC job API, scheduler, job store");
  AddConfigFlags(serve, flags.get());
  serve->callback([flags] {
    const ServerConfig config = LoadOrExit(*flags);
    const int rc = Serve(config, ProductionEnvironment());
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  CLI::App* config = app.add_subcommand("config", "Configuration tools");
  config->require_subcommand(1);
  auto print_flags = std::make_shared<ConfigFlags>();
  CLI::App* print = config->add_subcommand(
      "print", "Print the effective configuration (defaults < file < env < flags), secrets redacted");
  AddConfigFlags(print, print_flags.get());
  print->callback([print_flags] { std::cout << ServerConfigToYaml(LoadOrExit(*print_flags)); });

  CLI::App* openapi =
      app.add_subcommand("openapi", "Print the OpenAPI document of the HTTP/JSON API (docs/openapi.json)");
  openapi->callback([] {
    absl::StatusOr<HttpRoutes> routes = ApiRoutes();
    if (!routes.ok()) {
      std::cerr << "oombd: " << routes.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << OpenApiDocument(*routes);
  });

  CLI::App* version = app.add_subcommand("version", "Print the versions oombd was built with and the devices it sees");
  version->callback([] {
    const BuildInfo info = GetBuildInfo();
    std::cout << "oombd " << info.version << " (" << info.git_sha << ", torch " << info.torch_version << ", cuda "
              << (info.cuda_compiled ? info.cuda_version : "none") << ")\n";
    for (const auto& d : info.devices)
      std::cout << "  " << d.name << " " << d.model << " " << d.memory_bytes << " bytes\n";
  });
}

}  // namespace oomb::server
