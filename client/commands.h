// The `oomb` subcommands, registered on the CLI11 app by area.
#ifndef OOMB_CLIENT_COMMANDS_H_
#define OOMB_CLIENT_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "client/cli.h"

namespace oomb::client {

// submit, list, get, watch, events, logs, plot, cancel, pause, resume, delete, checkpoints.
void AddJobCommands(CLI::App& app, const Cli& cli);
// estimate, health, server-info, version.
void AddServerCommands(CLI::App& app, const Cli& cli);
// datasets (upload, list, get, delete) and download: data in, models out (client/transfer_commands.cc).
void AddTransferCommands(CLI::App& app, const Cli& cli);

// Streams a job's events after `after` until it ends: a live progress line on a terminal
// (client/progress.h) with other events printed above it, one line per event off a terminal,
// one JSON object per message with -o json. The exit code follows the job's final state.
int Watch(Client& c, const std::string& name, int64_t after);

// "  SEQ TIME what happened": how `watch` and `events` print an event.
std::string EventLine(const v1::JobEvent& e);

// Every event of job `name`, ListJobEvents page by page (logs, plot, get's sparkline).
grpc::Status ReadAllEvents(Client& c, const std::string& name, std::vector<v1::JobEvent>* out);

// Prints what the daemon said about a job: every event but its steps (LOG lines, warnings,
// state changes, checkpoints) as "TIME LEVEL message", one JSON event a line with -o json;
// with `follow`, then the new ones until the job ends, exiting as Watch does.
int Logs(Client& c, const std::string& name, bool follow);

}  // namespace oomb::client

#endif  // OOMB_CLIENT_COMMANDS_H_
