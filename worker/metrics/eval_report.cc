#include "worker/metrics/eval_report.h"

#include <utility>

namespace oomb {

nlohmann::json EvalReportJson(const EvalReport& report) {
  nlohmann::json j = nlohmann::json::object();
  for (const PositionLoss& p : report.positions) {
    j["positions"].push_back(
        {{"begin", p.begin}, {"end", p.end}, {"loss", p.loss}, {"tokens", p.tokens}, {"hits", p.hits}});
  }
  for (const auto& [name, cells] : {std::pair{"passkey", &report.passkey}, std::pair{"needle", &report.needle}}) {
    if (cells->empty()) continue;
    nlohmann::json out = nlohmann::json::array();
    for (const RetrievalScore& c : *cells) {
      out.push_back({{"length", c.length}, {"depth", c.depth}, {"correct", c.correct}, {"trials", c.trials}});
    }
    j[name] = {{"accuracy", Accuracy(*cells).value_or(0.0)}, {"cells", out}};
  }
  return j;
}

}  // namespace oomb
