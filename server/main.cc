// oombd: the oomb daemon's entry point.
#include <CLI/CLI.hpp>
#include <iostream>

#include "worker/job/build_info.h"

int main(int argc, char** argv) {
  CLI::App app{"oombd: long-context LLM fine-tuning daemon"};
  app.require_subcommand(1);
  auto* version = app.add_subcommand("version", "Print the versions oombd was built with and the devices it sees");
  version->callback([] {
    const oomb::BuildInfo info = oomb::GetBuildInfo();
    std::cout << "oombd " << info.version << " (torch " << info.torch_version << ", cuda "
              << (info.cuda_compiled ? info.cuda_version : "none") << ")\n";
    for (const auto& d : info.devices)
      std::cout << "  " << d.name << " " << d.model << " " << d.memory_bytes << " bytes\n";
  });
  CLI11_PARSE(app, argc, argv);
  return 0;
}
