// oombd: the oomb daemon's entry point. Subcommands come from the Register functions of
// server/commands.h.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // the exit code a command set
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {  // a usage error, printed; --help and --version exit 0
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::bad_alloc&) {  // sizes the machine cannot hold: said, never an abort
    std::cerr << "oombd: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "oombd: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
