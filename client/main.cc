// oomb: the command-line client of oombd.
#include <CLI/CLI.hpp>
#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"oomb: submit and watch long-context fine-tuning jobs on an oombd server"};
  app.require_subcommand(1);
  auto* version = app.add_subcommand("version", "Print the client version");
  version->callback([] { std::cout << "oomb 0.1.0\n"; });
  CLI11_PARSE(app, argc, argv);
  return 0;
}
