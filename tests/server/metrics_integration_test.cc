// /metrics end to end: the real oombd (real trainer, tiny model, CPU) scraped every second by a
// real Prometheus (Debian's /usr/bin/prometheus) on loopback, loaded with
// deploy/prometheus/alerts.yml and rules.yml. While a job runs, every expression of the Grafana
// dashboard (deploy/grafana/dashboards/oomb.json) must return data; then the job is paused while
// two others run (one succeeds, one fails), resumed and cancelled: one query by job_id must give
// its curves (loss, memory) before and after the pause, the failed job must fire OombJobFailed
// naming it and its reason, the dashboard's annotations and job-end table must have data, a real
// browser must draw the job's memory curve (Prometheus' graph page in headless Chromium), and
// Prometheus' numbers must agree with the daemon's own job records and events, per-job series
// must be gone, and every metric named by the dashboard, the rules and the exposition must be in
// docs/metrics.md.
//
// Dashboard targets whose refId starts with GPU_ (need a CUDA device and NVML), DCGM_ (need
// dcgm-exporter) or OFFLOAD_ (need the host KV tier, which does not exist yet) may return no
// data; their metric names are still checked. ENDED_ targets have data once a job has ended:
// they are checked at the end. OOMB_METRICS_REQUIRE_GPU=1 (on a GPU machine)
// makes GPU_ targets required too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <ctime>
#include <map>
#include <regex>
#include <set>

#include "tests/client/daemon_harness.h"
#include "tests/server/http_get.h"
#include "tests/worker/data/test_tokenizer.h"

namespace oomb::testing {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// A port nothing listens on now (bound, read, released).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// /usr/bin/prometheus scraping one target every second, with the project's alert rules.
class Prometheus {
 public:
  Prometheus(const fs::path& dir, int target_port) : dir_(dir) {
    fs::create_directories(dir_ / "tsdb");
    WriteFile(dir_ / "prometheus.yml",
              "global:\n"
              "  scrape_interval: 1s\n"
              "  evaluation_interval: 1s\n"
              "rule_files:\n"
              "  - " +
                  SourceDir() +
                  "/deploy/prometheus/alerts.yml\n"
                  "  - " +
                  SourceDir() +
                  "/deploy/prometheus/rules.yml\n"
                  "scrape_configs:\n"
                  "  - job_name: oomb\n"
                  "    static_configs:\n"
                  "      - targets: ['127.0.0.1:" +
                  std::to_string(target_port) + "']\n");
    for (int attempt = 0; attempt < 3 && port_ == 0; ++attempt) Start();
  }
  ~Prometheus() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Prometheus(const Prometheus&) = delete;
  Prometheus& operator=(const Prometheus&) = delete;

  int port() const { return port_; }
  std::string log() const { return Slurp(dir_ / "prometheus.log"); }

  // GET /api/v1/PATH?QUERY and its "data", or null (with a test failure) on an error.
  json Api(const std::string& path, const std::map<std::string, std::string>& params) const {
    std::string q;
    for (const auto& [k, v] : params) q += (q.empty() ? "?" : "&") + k + "=" + UrlEncode(v);
    const HttpResponse r = HttpGet(port_, "/api/v1/" + path + q);
    const json body = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (r.status != 200 || !body.is_object() || body.value("status", "") != "success") {
      ADD_FAILURE() << "Prometheus /api/v1/" << path << " " << (params.count("query") ? params.at("query") : "")
                    << ": HTTP " << r.status << " " << r.body.substr(0, 500);
      return json();
    }
    return body["data"];
  }
  json Query(const std::string& expr) const { return Api("query", {{"query", expr}}); }
  json QueryRange(const std::string& expr, double start, double end) const {
    return Api("query_range",
               {{"query", expr}, {"start", std::to_string(start)}, {"end", std::to_string(end)}, {"step", "1"}});
  }
  // The value of an instant query that returns one series; NaN otherwise.
  double Scalar(const std::string& expr) const {
    const json d = Query(expr);
    if (!d.is_object() || d["result"].size() != 1) return std::nan("");
    return std::stod(d["result"][0]["value"][1].get<std::string>());
  }

 private:
  void Start() {
    const int port = FreePort();
    const std::string log = (dir_ / "prometheus.log").string();
    std::vector<std::string> args = {kPrometheus, "--config.file=" + (dir_ / "prometheus.yml").string(),
                                     "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
                                     "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"};
    pid_ = ::fork();
    if (pid_ == 0) {
      if (std::freopen(log.c_str(), "a", stderr) == nullptr || std::freopen(log.c_str(), "a", stdout) == nullptr) {
        ::_exit(126);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const bool ready =
        WaitFor([&] { return ::waitpid(pid_, nullptr, WNOHANG) != 0 || HttpGet(port, "/-/ready", 2).status == 200; },
                std::chrono::seconds(30), std::chrono::milliseconds(100));
    if (ready && HttpGet(port, "/-/ready", 2).status == 200) {
      port_ = port;
    } else {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  fs::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

double Now() { return static_cast<double>(std::time(nullptr)); }

// Every sample of a range-query result (all series) as (time, value).
std::vector<std::pair<double, double>> Points(const json& data) {
  std::vector<std::pair<double, double>> out;
  if (!data.is_object()) return out;
  for (const json& series : data["result"]) {
    for (const json& v : series["values"]) out.emplace_back(v[0].get<double>(), std::stod(v[1].get<std::string>()));
  }
  return out;
}

// Every sample value of a range-query result (all series).
std::vector<double> Values(const json& data) {
  std::vector<double> out;
  for (const auto& [t, v] : Points(data)) out.push_back(v);
  return out;
}

struct Target {
  std::string panel, ref, expr;
};

void CollectTargets(const json& panels, std::vector<Target>* out) {
  for (const json& p : panels) {
    for (const json& t : p.value("targets", json::array())) {
      if (t.contains("expr")) out->push_back({p.value("title", ""), t.value("refId", ""), t["expr"]});
    }
    if (p.contains("panels")) CollectTargets(p["panels"], out);  // collapsed rows
  }
}

// The dashboard's variables as the test sets them: every daemon, every slot; rate windows of
// five scrapes.
std::string Substitute(std::string expr) {
  static const std::vector<std::pair<std::string, std::string>> kVars = {
      {"$__rate_interval", "5s"}, {"$__interval", "5s"}, {"$__range", "5m"}, {"${instance}", ".*"},
      {"$instance", ".*"},        {"${slot}", ".*"},     {"$slot", ".*"},    {"${project}", ".*"},
      {"$project", ".*"},         {"${job}", ".*"},      {"$job", ".*"}};
  for (const auto& [var, value] : kVars) {
    for (size_t at; (at = expr.find(var)) != std::string::npos;) expr.replace(at, var.size(), value);
  }
  return expr;
}

bool Optional(const std::string& ref) {
  const char* require_gpu = std::getenv("OOMB_METRICS_REQUIRE_GPU");
  const bool gpu_required = require_gpu != nullptr && std::string(require_gpu) == "1";
  return (!gpu_required && ref.rfind("GPU_", 0) == 0) || ref.rfind("DCGM_", 0) == 0 || ref.rfind("OFFLOAD_", 0) == 0 ||
         ref.rfind("ENDED_", 0) == 0;
}

// oomb_* names in a PromQL expression, histogram suffixes removed; recording rules' names
// (job_id:oomb_tokens:rate1m) are not metrics.
std::set<std::string> MetricNames(const std::string& expr) {
  std::set<std::string> out;
  static const std::regex kName(R"(\boomb_[a-z0-9_]+)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kName); it != std::sregex_iterator(); ++it) {
    if (it->position() > 0 && expr[it->position() - 1] == ':') continue;
    std::string n = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0) n.resize(n.size() - s.size());
    }
    out.insert(n);
  }
  return out;
}

// The metrics docs/metrics.md documents: its table rows "| `oomb_...` |".
std::set<std::string> DocumentedMetrics() {
  std::set<std::string> out;
  std::istringstream in(Slurp(SourceDir() + "/docs/metrics.md"));
  static const std::regex kRow(R"(^\| `(oomb_[a-z0-9_]+)`)");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, kRow)) out.insert(m[1]);
  }
  return out;
}

// The tiny model with a byte-level tokenizer (ids 0..255, its whole vocabulary), so the
// evaluation's passkey suite can write its documents (about 250 tokens of instruction, fact and
// question in bytes: the jobs' max_seq_len is 512).
fs::path TinyModelWithTokenizer(const fs::path& dir) {
  const fs::path model = dir / "tiny-llama";
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(TinyLlama() / f, model / f);
  WriteFile(model / "tokenizer.json", ByteTokenizerJson(/*newline_merge=*/false, /*chatml=*/false));
  return model;
}

// `evaluation` (a YAML flow mapping) is the job's evaluation section, or empty for none.
std::string JobYaml(const std::string& name, const fs::path& dir, int steps, int checkpoint_every,
                    const std::string& evaluation = "", const std::string& train = "train.jsonl") {
  std::ostringstream y;
  y << "display_name: " << name << "\n"
    << "model: {path: " << (dir / "tiny-llama").string() << ", dtype: float32}\n"
    << "method: {type: lora, lora: {rank: 4, alpha: 8, target_modules: [q_proj, k_proj, v_proj, o_proj]}}\n"
    << "data: {train: " << (dir / train).string() << ", validation: " << (dir / "val.jsonl").string()
    << ", max_seq_len: 512, too_long: truncate, packing: false}\n"
    << "training: {max_steps: " << steps
    << ", learning_rate: 1.0e-3, warmup_steps: 0, lr_schedule: constant, seed: 7, eval_every_steps: 4}\n"
    << "memory: {chunk_tokens: 32, page_tokens: 16}\n"
    << "checkpoint: {every_steps: " << checkpoint_every << ", keep_last: 1}\n"
    << "resources: {device: cpu, max_retries: 0}\n";
  if (!evaluation.empty()) y << "evaluation: " << evaluation << "\n";
  return y.str();
}

int64_t Int(const json& j, const char* key) {
  return j.contains(key) ? std::stoll(j[key].get<std::string>()) : 0;  // int64 is a string in proto JSON
}

class MetricsIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) {
      GTEST_SKIP() << "no test models under " << DataDir() << " (run scripts/fetch_test_data.sh)";
    }
    if (!fs::exists(kPrometheus)) GTEST_SKIP() << "no " << kPrometheus << " (apt-get install prometheus)";
    tmp_ = std::make_unique<TempDir>();
  }
  void TearDown() override {
    prometheus_.reset();
    daemon_.reset();
    tmp_.reset();
  }

  // The daemon (with a projects file of quotas on the default project, for the Projects row) and
  // a Prometheus scraping it, once Prometheus has scraped it: counters and histograms start at 0
  // in the first scrape, so their first increments show in increase() and rate().
  void StartDaemonAndPrometheus() {
    const fs::path dir = tmp_->path();
    WriteFile(dir / "projects.yaml",
              "projects:\n  default: {max_running_devices: 4, max_device_hours_per_day: 100, max_queued_jobs: 100}\n");
    DaemonOptions options;
    options.extra = {"--set", "tenancy.projects_file=" + (dir / "projects.yaml").string()};
    daemon_ = std::make_unique<Daemon>(dir / "data", options);
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    ASSERT_GT(daemon_->metrics_port(), 0) << daemon_->log();
    EXPECT_THAT(daemon_->log(), ::testing::HasSubstr("oombd: metrics on http://127.0.0.1:"));
    prometheus_ = std::make_unique<Prometheus>(dir / "prometheus", daemon_->metrics_port());
    ASSERT_GT(prometheus_->port(), 0) << prometheus_->log();
    const Prometheus& prom = *prometheus_;
    ASSERT_TRUE(WaitFor([&] { return prom.Scalar(R"(up{job="oomb"})") == 1; }, std::chrono::seconds(20))) << prom.log();
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Prometheus> prometheus_;
};

// The exposition while a job runs: every family of the reference (docs/metrics.md) is declared
// (those without samples here too, e.g. GPU memory on the CPU) but MFU, which exists only where
// the GPU's peak is known, the attention's density, only for sparse jobs, the router's auxiliary
// loss, only for mixtures of experts trained with it, the RULER scores, only for jobs evaluating
// the ruler suite (MetricsExporterTest checks those), and job end times, once a run ended
// (checked at the end).
void ExpectTheReferencesFamilies(int metrics_port, const std::set<std::string>& documented) {
  const HttpResponse scrape = HttpGet(metrics_port, "/metrics");
  ASSERT_EQ(scrape.status, 200);
  std::set<std::string> exposed;
  static const std::regex kHelp(R"(^# HELP (oomb_[a-z0-9_]+) )");
  std::istringstream scraped(scrape.body);
  std::smatch help;
  for (std::string line; std::getline(scraped, line);) {
    if (std::regex_search(line, help, kHelp)) exposed.insert(help[1]);
  }
  for (const std::string& n : exposed)
    EXPECT_TRUE(documented.count(n)) << n << " is exported but not in docs/metrics.md";
  for (const std::string& n : documented) {
    if (n == "oomb_job_mfu_ratio" || n == "oomb_job_attention_density_ratio" || n == "oomb_job_router_aux_loss" ||
        n.starts_with("oomb_job_eval_ruler_") || n == "oomb_job_end_time_seconds") {
      continue;  // GPUs with a known peak; sparse jobs; mixtures of experts with the loss; ruler; once ended
    }
    EXPECT_TRUE(exposed.count(n)) << n << " is in docs/metrics.md but not exported";
  }
}

// Every dashboard expression and variable query, as Grafana would send them over [t0, now],
// has data (but the optional ones); adds the metrics they name to `named`.
void ExpectEveryDashboardExpressionHasData(const Prometheus& prom, double t0, std::set<std::string>* named) {
  const json dashboard = json::parse(Slurp(SourceDir() + "/deploy/grafana/dashboards/oomb.json"));
  std::vector<Target> targets;
  CollectTargets(dashboard["panels"], &targets);
  ASSERT_GT(targets.size(), 30u);
  std::vector<std::string> no_data;
  int required = 0;
  for (const Target& t : targets) {
    const std::set<std::string> names = MetricNames(t.expr);
    named->insert(names.begin(), names.end());
    const json data = prom.QueryRange(Substitute(t.expr), t0, Now());
    ASSERT_TRUE(data.is_object()) << t.panel << " " << t.ref << ": " << t.expr;  // a PromQL error
    if (Optional(t.ref)) continue;
    ++required;
    const std::vector<double> values = Values(data);
    if (std::none_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); })) {
      no_data.push_back(t.panel + " / " + t.ref + ": " + t.expr);
    }
  }
  EXPECT_THAT(no_data, ::testing::IsEmpty()) << "dashboard expressions without data";
  EXPECT_GT(required, 25);
  for (const json& v : dashboard["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    static const std::regex kLabelValues(R"(label_values\((.*),\s*(\w+)\)$)");
    std::smatch m;
    const std::string q = v["definition"];
    ASSERT_TRUE(std::regex_search(q, m, kLabelValues)) << q;
    EXPECT_FALSE(Values(prom.QueryRange(Substitute(m[1]), t0, Now())).empty()) << q;
  }
}

// The alert rules evaluate without errors on real series, and none fires; adds the metrics
// they name to `named`.
void ExpectTheAlertRulesEvaluateAndNoneFires(const Prometheus& prom, std::set<std::string>* named) {
  bool evaluated = WaitFor(
      [&] {
        const json rules = prom.Api("rules", {});
        int ok = 0, all = 0;
        for (const json& g : rules["groups"]) {
          for (const json& r : g["rules"]) {
            ++all;
            ok += r.value("health", "") == "ok";
          }
        }
        return all >= 6 && ok == all;
      },
      std::chrono::seconds(10));
  EXPECT_TRUE(evaluated) << prom.Api("rules", {}).dump(1);
  EXPECT_THAT(prom.Api("alerts", {})["alerts"], ::testing::IsEmpty());
  for (const char* file : {"alerts.yml", "rules.yml"}) {
    for (const auto& g : YAML::LoadFile(SourceDir() + "/deploy/prometheus/" + file)["groups"]) {
      for (const auto& r : g["rules"]) {
        const std::set<std::string> names = MetricNames(r["expr"].as<std::string>());
        named->insert(names.begin(), names.end());
      }
    }
  }
}

// Prometheus' numbers once it has scraped the end: the daemon's own records (job a ran, was
// paused, resumed and cancelled; b's 8 steps; c failed).
void ExpectTheDaemonsTotals(const Prometheus& prom, int64_t tokens, int64_t steps, int checkpoints) {
  const bool settled = WaitFor(
      [&] {
        return prom.Scalar("sum(oomb_tokens_total)") == static_cast<double>(tokens) &&
               prom.Scalar(R"(oomb_jobs{state="SUCCEEDED"})") == 1 && prom.Query("oomb_job_info")["result"].empty();
      },
      std::chrono::seconds(20), std::chrono::milliseconds(250));
  EXPECT_TRUE(settled);
  EXPECT_EQ(prom.Scalar("sum(oomb_tokens_total)"), static_cast<double>(tokens));
  EXPECT_EQ(prom.Scalar("sum(oomb_steps_total)"), static_cast<double>(steps));
  EXPECT_EQ(prom.Scalar(R"(sum(oomb_step_duration_seconds_count))"), static_cast<double>(steps));
  EXPECT_EQ(prom.Scalar("sum(oomb_checkpoints_total)"), static_cast<double>(checkpoints));
  EXPECT_EQ(prom.Scalar(R"(oomb_jobs{state="CANCELLED"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_jobs{state="FAILED"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_jobs{state="QUEUED"})"), 0);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="QUEUED"})"), 4);  // a, b, c, a resumed
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="RUNNING"})"), 4);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="PAUSING"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="PAUSED"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="CANCELLING"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="CANCELLED"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="SUCCEEDED"})"), 1);
  EXPECT_EQ(prom.Scalar(R"(oomb_job_transitions_total{state="FAILED"})"), 1);
  EXPECT_EQ(prom.Scalar("oomb_queue_wait_seconds_count"), 4);
  EXPECT_GT(prom.Scalar("oomb_queue_wait_seconds_sum"), 5);  // b waited while a ran 8+ scrapes
  EXPECT_EQ(prom.Scalar(R"(oomb_slot_busy{slot="cpu"})"), 0);
  // Per-job series went with their runs.
  for (const char* gone : {"oomb_job_info", "oomb_job_loss", "oomb_job_step", "oomb_job_eval_loss",
                           "oomb_job_device_memory_peak_bytes", "oomb_job_start_time_seconds"}) {
    EXPECT_THAT(prom.Query(gone)["result"], ::testing::IsEmpty()) << gone;
  }
}

// When job a was paused and when it ran again (seconds since the epoch).
struct PauseWindow {
  double paused = 0, resumed = 0;
};

// Samples of `expr` (a query by job_id) before the pause and after the resume, none between.
void ExpectBothRuns(const Prometheus& prom, double t0, const PauseWindow& w, const std::string& expr) {
  const std::vector<std::pair<double, double>> points = Points(prom.QueryRange(expr, t0, Now()));
  int before = 0, during = 0, after = 0;
  for (const auto& [t, v] : points) {
    EXPECT_TRUE(std::isfinite(v)) << expr;
    (t <= w.paused ? before : t < w.resumed ? during : after) += 1;
  }
  EXPECT_GE(before, 4) << expr;
  EXPECT_GE(after, 2) << expr;
  // The pause takes effect at a chunk's end, then the series go stale at the next scrape: a few
  // samples may fall after `paused` (a whole second, time(2)'s), not the 6+ paused seconds'.
  EXPECT_LE(during, 4) << expr;
  EXPECT_GE(w.resumed - w.paused, 6);
}

// The token counter moved step by step, never backwards, to `tokens`; every loss Prometheus saw
// for job a is one of `losses_a` (its STEP events'), from one query by its job_id across the pause.
void ExpectTheCurves(const Prometheus& prom, double t0, int64_t tokens, const std::vector<double>& losses_a,
                     const PauseWindow& w) {
  // (The range ends in the future so that its last point is the newest sample.)
  const std::vector<double> token_curve = Values(prom.QueryRange("sum(oomb_tokens_total)", t0, Now() + 2));
  ASSERT_FALSE(token_curve.empty());
  std::set<double> distinct(token_curve.begin(), token_curve.end());
  EXPECT_GE(distinct.size(), 4u);
  EXPECT_TRUE(std::is_sorted(token_curve.begin(), token_curve.end()));
  EXPECT_EQ(token_curve.back(), static_cast<double>(tokens));

  const std::string loss = R"(max by (job_id) (oomb_job_loss{job_id="metrics-a"}))";
  const std::vector<double> prom_losses = Values(prom.QueryRange(loss, t0, Now()));
  ASSERT_FALSE(prom_losses.empty());
  for (double l : prom_losses) {
    EXPECT_TRUE(
        std::any_of(losses_a.begin(), losses_a.end(), [&](double e) { return std::abs(e - l) <= 1e-9 * std::abs(e); }))
        << "loss " << l << " is not a STEP event's loss of metrics-a";
  }
  ExpectBothRuns(prom, t0, w, loss);
  // Its memory curve: the device peak of each step, and the KV pages through the recording rule.
  ExpectBothRuns(prom, t0, w, R"(max by (job_id) (oomb_job_device_memory_peak_bytes{job_id="metrics-a"}) > 0)");
  ExpectBothRuns(prom, t0, w, R"(sum by (job_id) (job_id:oomb_kv_peak_bytes:sum{job_id="metrics-a"}))");
  ExpectBothRuns(prom, t0, w, R"(job_id:oomb_tokens:rate1m{job_id="metrics-a"})");
}

// OombJobFailed fires for job c, naming it and its error's reason; no other alert fires.
void ExpectTheFailedJobsAlert(const Prometheus& prom, const std::string& reason) {
  json alerts;
  const bool fired = WaitFor(
      [&] {
        alerts = prom.Api("alerts", {})["alerts"];
        return alerts.size() == 1 && alerts[0].value("state", "") == "firing";
      },
      std::chrono::seconds(20), std::chrono::milliseconds(250));
  ASSERT_TRUE(fired) << alerts.dump(1);
  const json& a = alerts[0];
  EXPECT_EQ(a["labels"]["alertname"], "OombJobFailed");
  EXPECT_EQ(a["labels"]["job_id"], "metrics-c");
  EXPECT_EQ(a["labels"]["project"], "default");
  EXPECT_EQ(a["labels"]["reason"], reason);
  EXPECT_EQ(a["annotations"]["summary"], "Job metrics-c of project default failed: " + reason);
}

// The dashboard's annotations (job runs started and ended) and ENDED_ targets: a started twice
// and ended twice (PAUSED, then CANCELLED); b and c ended once (they may have run between two
// scrapes: their starts are not required).
void ExpectTheAnnotationsAndJobEnds(const Prometheus& prom, double t0) {
  EXPECT_TRUE(WaitFor([&] { return prom.Scalar(R"(count(oomb_job_end_time_seconds{state="CANCELLED"}))") == 1; },
                      std::chrono::seconds(10), std::chrono::milliseconds(250)));
  const json dashboard = json::parse(Slurp(SourceDir() + "/deploy/grafana/dashboards/oomb.json"));
  int annotations = 0;
  for (const json& a : dashboard["annotations"]["list"]) {
    if (!a.contains("expr")) continue;
    ++annotations;
    EXPECT_TRUE(a.value("useValueForTime", false)) << a.dump();
    const json data = prom.QueryRange(Substitute(a["expr"]), t0, Now() + 2);
    std::map<std::string, std::set<double>> times;  // job -> the distinct times its series give
    for (const json& series : data["result"]) {
      for (const json& v : series["values"]) {
        times[series["metric"]["job_id"]].insert(std::stod(v[1].get<std::string>()));
      }
    }
    EXPECT_EQ(times["metrics-a"].size(), 2u) << a["name"] << ": " << data.dump();
    if (a["name"] == "Job runs ended") {
      EXPECT_EQ(times["metrics-b"].size(), 1u) << a["name"];
      EXPECT_EQ(times["metrics-c"].size(), 1u) << a["name"];
    }
    for (const auto& [job, ts] : times) {
      for (double t : ts) EXPECT_NEAR(t / 1000, Now(), 300) << job << " " << a["name"];  // milliseconds
    }
  }
  EXPECT_EQ(annotations, 2);
  std::vector<Target> targets;
  CollectTargets(dashboard["panels"], &targets);
  int ended = 0;
  for (const Target& t : targets) {
    if (t.ref.rfind("ENDED_", 0) != 0) continue;
    ++ended;
    EXPECT_FALSE(Values(prom.QueryRange(Substitute(t.expr), t0, Now())).empty()) << t.panel;
  }
  EXPECT_GE(ended, 1);
  const json ends = prom.Query(R"(oomb_job_end_time_seconds)")["result"];
  std::map<std::string, std::string> state_of;
  for (const json& e : ends) state_of[e["metric"]["job_id"]] = e["metric"]["state"];
  EXPECT_EQ(state_of, (std::map<std::string, std::string>{
                          {"metrics-a", "CANCELLED"}, {"metrics-b", "SUCCEEDED"}, {"metrics-c", "FAILED"}}));
}

// Job a's memory curve over its life, drawn by a real browser: Prometheus' own graph page in
// headless Chromium (Grafana is neither in Debian nor on PyPI; tests/deploy/render_prometheus_graph.py
// says what it checks). Without Chromium (render_prometheus_graph.py exits 77) it fails: setup
// installs chromium-headless-shell, so a missing browser is a broken set-up, not a skip.
void ExpectABrowserDrawsTheJobsMemoryCurve(const Prometheus& prom, const fs::path& scratch) {
  const std::string expr = R"(sum by (job_id) (job_id:oomb_kv_peak_bytes:sum{job_id="metrics-a"}))";
  const Result r = Shell(VenvPython().string() + " " + SourceDir() + "/tests/deploy/render_prometheus_graph.py " +
                             "http://127.0.0.1:" + std::to_string(prom.port()) + " '" + expr + "' " +
                             (scratch / "job-memory.png").string() + " --range 5m --series 1 --points 8",
                         scratch);
  std::cout << r.out << r.err;
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
}

// Memory: the arenas existed while a ran (`capacity_during`, `peak_during`) and are gone now;
// pages were used; no host tier.
void ExpectTheKvMemory(const Prometheus& prom, double t0, const json& capacity_during, const json& peak_during) {
  const std::vector<double> capacity = Values(capacity_during);
  ASSERT_FALSE(capacity.empty());
  EXPECT_GT(*std::max_element(capacity.begin(), capacity.end()), 0);
  const std::vector<double> peak = Values(peak_during);
  ASSERT_FALSE(peak.empty());
  EXPECT_GT(*std::max_element(peak.begin(), peak.end()), 0);
  EXPECT_EQ(prom.Scalar(R"(sum(oomb_kv_capacity_bytes{tier="gpu"}))"), 0);
  const std::vector<double> host = Values(prom.QueryRange(R"(sum(oomb_kv_bytes{tier="host"}))", t0, Now()));
  ASSERT_FALSE(host.empty());
  EXPECT_THAT(host, ::testing::Each(0.0));
  EXPECT_GT(prom.Scalar(R"(sum(increase(oomb_model_flops_total[10m])))"), 0);
  EXPECT_GT(prom.Scalar(R"(sum(oomb_chunk_duration_seconds_count{stage="backward"}))"), 0);
}

// Job a trains until cancelled; job b (8 steps) and c (2 steps) wait in the queue behind it.
void SubmitThreeJobs(const std::string& endpoint, const fs::path& dir) {
  WriteIdsJsonl(dir / "train.jsonl", 8, 120);
  WriteIdsJsonl(dir / "val.jsonl", 2, 60, 256, /*seed=*/2);
  WriteIdsJsonl(dir / "c.jsonl", 2, 50);
  TinyModelWithTokenizer(dir);
  WriteFile(dir / "a.yaml", JobYaml("metrics-a", dir, 100000, 10,
                                    "{suites: [positions, passkey], every_steps: 4, lengths: [512], depths: 2}"));
  WriteFile(dir / "b.yaml", JobYaml("metrics-b", dir, 8, 100));
  WriteFile(dir / "c.yaml", JobYaml("metrics-c", dir, 2, 100, "", "c.jsonl"));
  ASSERT_EQ(OombJson(endpoint, "submit " + (dir / "a.yaml").string() + " --job-id metrics-a", dir).value("name", ""),
            "projects/default/jobs/metrics-a");
  ASSERT_EQ(OombJson(endpoint, "submit " + (dir / "b.yaml").string() + " --job-id metrics-b", dir).value("state", ""),
            "QUEUED");
  ASSERT_EQ(OombJson(endpoint, "submit " + (dir / "c.yaml").string() + " --job-id metrics-c", dir).value("state", ""),
            "QUEUED");
}

// c's data goes bad while it waits; a is paused: b runs to the end, c fails when it starts; a
// resumes, runs a few scrapes and is cancelled.
PauseWindow PauseWhileTheOthersRunThenResumeAndCancel(const Prometheus& prom, const std::string& endpoint,
                                                      const fs::path& dir) {
  WriteFile(dir / "c.jsonl", Slurp(dir / "c.jsonl") + "not json\n");
  PauseWindow window;
  window.paused = Now();
  EXPECT_EQ(OombJson(endpoint, "pause metrics-a", dir).value("state", ""), "PAUSING");
  const Result watched = Oomb(endpoint, "watch metrics-b", dir);
  EXPECT_EQ(watched.rc, 0) << watched.out << watched.err;
  EXPECT_EQ(Oomb(endpoint, "watch metrics-c", dir).rc, 6);  // FAILED
  EXPECT_EQ(OombJson(endpoint, "get metrics-a", dir).value("state", ""), "PAUSED");
  std::this_thread::sleep_for(std::chrono::seconds(6));  // scrapes while nothing runs
  // a runs again (alone) for a few scrapes, then is cancelled.
  EXPECT_EQ(OombJson(endpoint, "resume metrics-a", dir).value("state", ""), "QUEUED");
  window.resumed = Now();
  const bool resumed = WaitFor(
      [&] {
        return Now() > window.resumed + 4 &&
               Values(prom.QueryRange(R"(oomb_job_loss{job_id="metrics-a"})", window.resumed + 1, Now())).size() >= 4;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(500));
  EXPECT_TRUE(resumed) << "Prometheus never saw job metrics-a running again";
  EXPECT_EQ(OombJson(endpoint, "cancel metrics-a", dir).value("state", ""), "CANCELLING");
  EXPECT_EQ(Oomb(endpoint, "watch metrics-a", dir).rc, 7);  // CANCELLED
  return window;
}

TEST_F(MetricsIntegrationTest, PrometheusSeesEveryDashboardSeriesAndTheJobsNumbers) {
  const fs::path dir = tmp_->path();
  const double t0 = Now() - 1;
  StartDaemonAndPrometheus();
  if (HasFatalFailure()) return;
  const std::string endpoint = daemon_->tcp_endpoint();
  const Prometheus& prom = *prometheus_;

  SubmitThreeJobs(endpoint, dir);
  if (HasFatalFailure()) return;
  EXPECT_EQ(Oomb(endpoint, "get no-such-job", dir).rc, 3);  // a NOT_FOUND for the gRPC panels

  // Wait until Prometheus has seen job a running for 8 scrapes, with an evaluation and a
  // checkpoint behind it (the client's polling is gRPC traffic for the service panels).
  const bool running = WaitFor(
      [&] {
        Oomb(endpoint, "get metrics-a", dir);
        return prom.Scalar(R"(count_over_time(oomb_job_info{job_id="metrics-a"}[1m]))") >= 8 &&
               prom.Scalar("sum(oomb_checkpoints_total)") >= 1 && prom.Scalar("count(oomb_job_eval_loss)") == 1 &&
               prom.Scalar("count(oomb_job_eval_accuracy_ratio)") == 1 &&
               prom.Scalar(R"(count(job_id:oomb_tokens:rate1m{job_id="metrics-a"}))") == 1;
      },
      std::chrono::seconds(90), std::chrono::milliseconds(500));
  ASSERT_TRUE(running) << "Prometheus never saw job metrics-a running\n" << daemon_->log() << prom.log();

  const std::set<std::string> documented = DocumentedMetrics();
  ExpectTheReferencesFamilies(daemon_->metrics_port(), documented);
  std::set<std::string> named;
  ExpectEveryDashboardExpressionHasData(prom, t0, &named);
  ExpectTheAlertRulesEvaluateAndNoneFires(prom, &named);

  // KV pages while the job runs: the arenas exist, pages were used; nothing on the host tier.
  const json capacity_during = prom.QueryRange(R"(sum(oomb_kv_capacity_bytes{tier="gpu"}))", t0, Now());
  const json peak_during = prom.QueryRange(R"(sum(oomb_kv_peak_bytes{tier="gpu"}))", t0, Now());

  const PauseWindow window = PauseWhileTheOthersRunThenResumeAndCancel(prom, endpoint, dir);
  const json a = OombJson(endpoint, "get metrics-a", dir);
  const json b = OombJson(endpoint, "get metrics-b", dir);
  const json c = OombJson(endpoint, "get metrics-c", dir);
  ASSERT_EQ(a.value("state", ""), "CANCELLED");
  ASSERT_EQ(b.value("state", ""), "SUCCEEDED");
  ASSERT_EQ(c.value("state", ""), "FAILED");
  const int64_t tokens = Int(a["progress"], "tokens") + Int(b["progress"], "tokens");
  const int64_t steps = Int(a["progress"], "step") + Int(b["progress"], "step");
  EXPECT_EQ(Int(b["progress"], "step"), 8);
  EXPECT_GT(Int(a["progress"], "step"), 8);
  EXPECT_EQ(Int(c["progress"], "step"), 0);

  const std::vector<json> events_a = AllEvents(endpoint, "metrics-a", dir);
  const std::vector<json> events_b = AllEvents(endpoint, "metrics-b", dir);
  int checkpoints = 0;
  std::vector<double> losses_a;
  for (const json& e : events_a) {
    checkpoints += e["type"] == "CHECKPOINT_SAVED";
    if (e["type"] == "STEP") losses_a.push_back(e["progress"]["loss"].get<double>());
  }
  for (const json& e : events_b) checkpoints += e["type"] == "CHECKPOINT_SAVED";
  ASSERT_GE(checkpoints, 2);

  ExpectTheDaemonsTotals(prom, tokens, steps, checkpoints);
  ExpectTheCurves(prom, t0, tokens, losses_a, window);
  ExpectTheKvMemory(prom, t0, capacity_during, peak_during);
  ExpectTheFailedJobsAlert(prom, c["error"].value("reason", ""));
  ExpectTheAnnotationsAndJobEnds(prom, t0);
  ExpectABrowserDrawsTheJobsMemoryCurve(prom, dir);

  // Every metric the dashboard and the rules use is in the reference.
  for (const std::string& n : named) EXPECT_TRUE(documented.count(n)) << n << " is used but not in docs/metrics.md";
}

// The provisioning files point Grafana at a Prometheus datasource and at the dashboards, and
// every panel queries through the dashboard's datasource variable.
TEST(GrafanaProvisioningTest, DatasourceAndDashboardProvidersAreWellFormed) {
  const YAML::Node ds = YAML::LoadFile(SourceDir() + "/deploy/grafana/provisioning/datasources/prometheus.yml");
  EXPECT_EQ(ds["apiVersion"].as<int>(), 1);
  ASSERT_EQ(ds["datasources"].size(), 1u);
  EXPECT_EQ(ds["datasources"][0]["type"].as<std::string>(), "prometheus");
  const YAML::Node dash = YAML::LoadFile(SourceDir() + "/deploy/grafana/provisioning/dashboards/oomb.yml");
  ASSERT_EQ(dash["providers"].size(), 1u);
  EXPECT_EQ(dash["providers"][0]["type"].as<std::string>(), "file");

  const json d = json::parse(Slurp(SourceDir() + "/deploy/grafana/dashboards/oomb.json"));
  EXPECT_EQ(d["uid"], "oomb-overview");
  std::vector<std::string> rows;
  std::set<int> ids;
  for (const json& p : d["panels"]) {
    EXPECT_TRUE(ids.insert(p["id"].get<int>()).second) << "duplicate panel id " << p["id"];
    if (p["type"] == "row") {
      rows.push_back(p["title"]);
      continue;
    }
    EXPECT_EQ(p["datasource"]["uid"], "${datasource}") << p["title"];
    for (const json& t : p["targets"]) EXPECT_EQ(t["datasource"]["uid"], "${datasource}") << p["title"];
  }
  EXPECT_THAT(rows,
              ::testing::ElementsAre("Fleet and queue", "Projects", "Job over its life", "Job progress",
                                     "Long-context evaluation", "GPU memory", "PCIe and offload", "Service health"));
  EXPECT_EQ(d["templating"]["list"][0]["type"], "datasource");
  EXPECT_EQ(d["templating"]["list"][0]["query"], "prometheus");
}

}  // namespace
}  // namespace oomb::testing
