// oombd: the oomb daemon's entry point. Subcommands come from the Register functions of
// server/commands.h.
#include <CLI/CLI.hpp>

#include "server/commands.h"
#include "worker/job/executor.h"

int main(int argc, char** argv) {
  oomb::InitExecutorProcess();  // before any thread starts
  CLI::App app{"oombd: long-context LLM fine-tuning daemon"};
  app.require_subcommand(1);
  oomb::server::RegisterServeCommands(app);
  oomb::server::RegisterRunCommands(app);
  oomb::server::RegisterModelCommands(app);
  oomb::server::RegisterDataCommands(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
