// oombd's subcommand registry. Each file that adds subcommands defines one Register function,
// declared here and called from main.cc; a command reports failure by throwing
// CLI::RuntimeError(exit_code) from its callback.
//
//   serve_command.cc  serve, config print, version
//   run_command.cc    run JOB.yaml [--set k=v]...
//   model_commands.cc model inspect, model eval, tokenize
//   data_commands.cc  data build
#ifndef OOMB_SERVER_COMMANDS_H_
#define OOMB_SERVER_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace oomb::server {

// `oombd serve`, `oombd config print`, `oombd version`.
void RegisterServeCommands(CLI::App& app);
// `oombd run`: one job in the foreground, without the service.
void RegisterRunCommands(CLI::App& app);
// `oombd model inspect|eval`, `oombd tokenize`.
void RegisterModelCommands(CLI::App& app);
// `oombd data build`.
void RegisterDataCommands(CLI::App& app);

}  // namespace oomb::server

#endif  // OOMB_SERVER_COMMANDS_H_
