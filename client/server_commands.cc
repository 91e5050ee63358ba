// The server subcommands: estimate, health, server-info, version.
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "client/commands.h"

namespace oomb::client {
namespace {

// How EstimateJob's `rates` begins while the server measures (server/engine_rates_store.h).
constexpr std::string_view kMeasuringRates = "not estimated: measuring";

void PrintEstimate(const v1::EstimateJobResponse& r) {
  std::cout << fmt::format("device              {}\n", r.device())
            << fmt::format("fits                {}\n", r.fits() ? "yes" : "no")
            << fmt::format("sequence length     {} tokens\n", r.seq_len())
            << fmt::format("peak device memory  {} of {} usable\n", Bytes(r.peak_device_bytes()),
                           Bytes(r.device_capacity_bytes()))
            << fmt::format("  weights           {}\n", Bytes(r.weights_bytes()))
            << fmt::format("  trainable state   {}\n", Bytes(r.trainable_state_bytes()))
            << fmt::format("  KV pages          {} ({} bytes per token)\n", Bytes(r.kv_bytes()), r.kv_bytes_per_token())
            << fmt::format("  activations       {}\n", Bytes(r.activation_bytes()))
            << fmt::format("peak host memory    {} of {}\n", Bytes(r.peak_host_bytes()), Bytes(r.host_capacity_bytes()))
            << fmt::format("placement           {}\n", r.placement())
            << fmt::format("longest context     {} tokens\n", r.max_seq_len_that_fits());
  for (const std::string& c : r.choices()) std::cout << fmt::format("chosen              {}\n", c);
  if (!r.fits()) std::cout << "limit: " << r.limit() << "\n";
  if (r.step_seconds() > 0) {
    std::cout << fmt::format("step time           {:.3g} s\n", r.step_seconds());
    if (r.total_steps() > 0) {
      std::cout << fmt::format("job                 {} steps, {:.3g} device-hours\n", r.total_steps(),
                               r.device_hours());
    }
  }
  std::cout << fmt::format("rates               {}\n", r.rates());
}

void AddEstimate(CLI::App& app, const Cli& cli) {
  struct Args {
    std::string file;
    std::vector<std::string> sets;
    double rates_wait = 120;
  };
  auto a = std::make_shared<Args>();
  auto* estimate = app.add_subcommand("estimate", "Ask the server whether a job fits, and how long its steps take")
                       ->footer("Example:\n  oomb estimate job.yaml --set data.max_seq_len=1048576");
  estimate->add_option("file", a->file, "Job spec (YAML)")->required();
  estimate->add_option("--set", a->sets, "Override a field: dotted.key=value (repeatable)");
  estimate
      ->add_option("--rates-wait", a->rates_wait,
                   "While the server measures a new model shape's rates, ask again for up to this many seconds "
                   "(0: answer at once)")
      ->capture_default_str();
  OnRun(estimate, [cli, a] {
    v1::EstimateJobRequest req;
    if (int rc = LoadSpec(a->file, a->sets, req.mutable_spec()); rc) return rc;
    req.set_parent(Parent(cli.globals));
    v1::EstimateJobResponse resp;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(a->rates_wait);
    for (bool told = false;; told = true) {
      const grpc::Status s = cli.client().Call(&v1::JobService::Stub::EstimateJob, req, &resp);
      if (!s.ok()) return Fail(s);
      if (!resp.rates().starts_with(kMeasuringRates) || std::chrono::steady_clock::now() >= deadline) break;
      if (!told) std::cerr << "oomb: the server is measuring this model shape's rates; asking again\n";
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    if (!PrintStructured(cli.globals, resp)) PrintEstimate(resp);
    return resp.fits() ? 0 : int{kError};
  });
}

void AddHealth(CLI::App& app, const Cli& cli) {
  auto* health = app.add_subcommand("health", "Check the server's health (grpc.health.v1; no token needed)")
                     ->footer("Example:\n  oomb health --endpoint unix:/run/oomb/oombd.sock");
  OnRun(health, [cli] {
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = cli.client().Context();
    const grpc::Status s = cli.client().health().Check(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, resp)) {
      std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    }
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : int{kUnavailable};
  });
}

void AddServerInfo(CLI::App& app, const Cli& cli) {
  auto* info = app.add_subcommand("server-info", "Show the server's versions and devices")
                   ->footer("Example:\n  oomb server-info -o json");
  OnRun(info, [cli] {
    v1::GetServerInfoRequest req;
    v1::ServerInfo resp;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::GetServerInfo, req, &resp);
    if (!s.ok()) return Fail(s);
    if (PrintStructured(cli.globals, resp)) return 0;
    std::cout << fmt::format(
        "version: {} ({}, torch {}, cuda {})\nhost memory: {}\nstarted: {}{}\n", resp.version(), resp.git_sha(),
        resp.torch_version(), resp.cuda_version().empty() ? "none" : resp.cuda_version(),
        Bytes(resp.host_memory_bytes()), Time(resp.start_time()), resp.draining() ? "\ndraining: yes" : "");
    for (const auto& d : resp.devices()) {
      std::cout << fmt::format("  {:<8} {} {}\n", d.name(), d.model(), d.memory_bytes() ? Bytes(d.memory_bytes()) : "");
    }
    return 0;
  });
}

// whoami: the identity the daemon sees, and the projects it may act in.
void AddWhoAmI(CLI::App& app, const Cli& cli) {
  auto* whoami = app.add_subcommand("whoami", "Show who the server takes you for, and your projects")
                     ->footer("Example:\n  oomb whoami --token-file ~/.config/oomb/token");
  OnRun(whoami, [cli] {
    v1::Caller caller;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::GetCaller, v1::GetCallerRequest(), &caller);
    if (!s.ok()) return Fail(s);
    if (PrintStructured(cli.globals, caller)) return 0;
    std::vector<std::string> groups(caller.groups().begin(), caller.groups().end());
    std::vector<std::string> projects(caller.projects().begin(), caller.projects().end());
    std::cout << fmt::format("user:      {}\n",
                             caller.user().empty() ? "(none: the server identifies nobody)" : Printable(caller.user()));
    if (!caller.uid().empty()) std::cout << fmt::format("uid:       {}\n", Printable(caller.uid()));
    std::cout << fmt::format("by:        {}\n", caller.authenticated_by());
    std::cout << fmt::format("groups:    {}\n", Printable(fmt::format("{}", fmt::join(groups, ", "))));
    std::cout << fmt::format(
        "projects:  {}{}\n", fmt::join(projects, ", "),
        caller.admin() ? (projects.empty() ? "every project (admin)" : " (and every other: admin)") : "");
    return 0;
  });
}

}  // namespace

void AddServerCommands(CLI::App& app, const Cli& cli) {
  AddWhoAmI(app, cli);
  AddEstimate(app, cli);
  AddHealth(app, cli);
  AddServerInfo(app, cli);
  app.add_subcommand("version", "Print the client version")->callback([] { std::cout << "oomb 0.1.0\n"; });
}

}  // namespace oomb::client
