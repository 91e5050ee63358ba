// oomb: the command-line client of oombd. See client/README.md for the commands and exit codes.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <string>

#include "client/cli.h"
#include "client/commands.h"

namespace oomb::client {
namespace {

// host:port with a port in [1, 65535] (a bracketed IPv6 host too), or unix:/path; the empty
// string when it is one, else why not.
std::string CheckEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("unix:", 0) == 0) return endpoint.size() > 5 ? "" : "unix: needs a path";
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return "expected host:port or unix:/path, got '" + endpoint + "'";
  const std::string port = endpoint.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return "the port must be a number in [1, 65535], got '" + port + "'";
  }
  return colon == 0 ? "expected a host before ':" + port + "'" : "";
}

void AddGlobalOptions(CLI::App& app, Globals& g) {
  app.add_option("--endpoint", g.endpoint, "Server: host:port or unix:/path (env OOMB_ENDPOINT)")
      ->envname("OOMB_ENDPOINT")
      ->check(CLI::Validator(CheckEndpoint, "host:port or unix:/path", "ENDPOINT"))
      ->capture_default_str();
  app.add_option("--token-file", g.token_file, "File holding the bearer token (else env OOMB_TOKEN)");
  app.add_option("--project", g.project,
                 "Project of the jobs named and created (env OOMB_PROJECT; default: your only project)")
      ->envname("OOMB_PROJECT");
  app.add_option("--ca", g.ca, "CA certificate (PEM) to verify the server: enables TLS");
  CLI::Option* cert = app.add_option("--cert", g.cert, "Client certificate (PEM) for mTLS (needs --key)");
  CLI::Option* key = app.add_option("--key", g.key, "Client private key (PEM) for mTLS (needs --cert)");
  cert->needs(key);
  key->needs(cert);
  app.add_option("-o,--output", g.output, "Output format")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();
  app.add_option("--timeout", g.timeout, "Deadline of each unary call, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"oomb: submit and watch long-context fine-tuning jobs on an oombd server"};
  app.footer(
      std::string("\nEnvironment: OOMB_ENDPOINT (host:port or unix:/path), OOMB_TOKEN, OOMB_PROJECT, NO_COLOR.\n\n") +
      kExitCodes +
      "\n\nExamples:\n  oomb submit job.yaml --set training.max_steps=5 --watch\n"
      "  oomb list --state RUNNING -o json\n  oomb watch job-abc123\n");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  app.fallthrough();  // global options may follow the subcommand: `oomb list -o json`
  Globals g;
  AddGlobalOptions(app, g);
  std::unique_ptr<Client> client;
  const Cli cli{g, [&client, &g]() -> Client& {
                  if (!client) client = std::make_unique<Client>(g);
                  return *client;
                }};
  AddJobCommands(app, cli);
  AddServerCommands(app, cli);
  AddTransferCommands(app, cli);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : int{kUsage};
  } catch (const std::exception& e) {  // a bug or a library's failure: say so, never abort
    std::cerr << "oomb: error: " << e.what() << "\n";
    return kError;
  }
  return 0;
}

}  // namespace oomb::client

int main(int argc, char** argv) { return oomb::client::Main(argc, argv); }
