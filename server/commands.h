// oombd's subcommand registry. Each file that adds subcommands defines one Register function,
// declared here and called from main.cc; a command reports failure by throwing
// CLI::RuntimeError(exit_code) from its callback.
//
//   serve_command.cc  serve, config print, openapi, version
//   run_command.cc    run JOB.yaml [--set k=v]...
//   model_commands.cc model inspect, model eval, model generate, tokenize
//   data_commands.cc  data build, data retrieval
// Path flags take the transform AbsolutePath(): the engine's file access refuses relative paths.
#ifndef OOMB_SERVER_COMMANDS_H_
#define OOMB_SERVER_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

namespace oomb::server {

// A CLI11 transform making a path flag's value absolute (against the current directory).
inline CLI::Validator AbsolutePath() {
  return CLI::Validator(
      [](std::string& path) {
        if (!path.empty()) path = std::filesystem::absolute(path).lexically_normal().string();
        return std::string();
      },
      "PATH");
}

// `oombd serve`, `oombd config print`, `oombd openapi`, `oombd version`.
void RegisterServeCommands(CLI::App& app);
// `oombd run`: one job in the foreground, without the service.
void RegisterRunCommands(CLI::App& app);
// `oombd model inspect|eval|generate`, `oombd tokenize`.
void RegisterModelCommands(CLI::App& app);
// `oombd data build|retrieval`.
void RegisterDataCommands(CLI::App& app);

}  // namespace oomb::server

#endif  // OOMB_SERVER_COMMANDS_H_
