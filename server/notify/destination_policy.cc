#include "server/notify/destination_policy.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

constexpr char kHowToAllow[] =
    "tenants' requests reach only public addresses unless the operator allows the destination "
    "(outbound.allow in the daemon's config, or the project's outbound.allow in tenancy.projects_file)";

struct Range {
  const char* net;
  int prefix;
  const char* what;  // the class's words in a refusal
};

// Most specific first: the first range containing an address names its class.
constexpr Range kV4Ranges[] = {
    {"169.254.169.254", 32, "a cloud metadata service"},
    {"168.63.129.16", 32, "a cloud metadata service"},
    {"100.100.100.200", 32, "a cloud metadata service"},
    {"0.0.0.0", 8, "unspecified"},
    {"10.0.0.0", 8, "private"},
    {"100.64.0.0", 10, "private (CGNAT)"},
    {"127.0.0.0", 8, "loopback"},
    {"169.254.0.0", 16, "link-local"},
    {"172.16.0.0", 12, "private"},
    {"192.0.0.0", 24, "reserved"},
    {"192.0.2.0", 24, "reserved (documentation)"},
    {"192.88.99.0", 24, "reserved"},
    {"192.168.0.0", 16, "private"},
    {"198.18.0.0", 15, "reserved (benchmarking)"},
    {"198.51.100.0", 24, "reserved (documentation)"},
    {"203.0.113.0", 24, "reserved (documentation)"},
    {"224.0.0.0", 4, "multicast"},
    {"240.0.0.0", 4, "reserved"},
};
constexpr Range kV6Ranges[] = {
    {"fd00:ec2::254", 128, "a cloud metadata service"},
    {"::", 128, "unspecified"},
    {"::1", 128, "loopback"},
    {"fc00::", 7, "private"},
    {"fe80::", 10, "link-local"},
    {"fec0::", 10, "private (site-local)"},
    {"ff00::", 8, "multicast"},
    {"64:ff9b:1::", 48, "private (NAT64)"},
    {"100::", 64, "reserved"},
    {"2001:db8::", 32, "reserved (documentation)"},
    {"2001::", 23, "reserved"},
};

IpAddress MustParse(const char* text) {
  IpAddress a;
  a.v6 = std::strchr(text, ':') != nullptr;
  ::inet_pton(a.v6 ? AF_INET6 : AF_INET, text, a.bytes.data());
  return a;
}

bool Contains(const IpAddress& net, int prefix, const IpAddress& a) {
  if (net.v6 != a.v6) return false;
  for (int bit = 0; bit < prefix; ++bit) {
    const int mask = 0x80 >> (bit % 8);
    if ((net.bytes[bit / 8] & mask) != (a.bytes[bit / 8] & mask)) return false;
  }
  return true;
}

IpAddress V4(const uint8_t* b) {
  IpAddress a;
  std::copy(b, b + 4, a.bytes.begin());
  return a;
}

// The IPv4 address an IPv6 address carries (mapped, translated, NAT64, 6to4, compatible), or
// the address itself: what the connection reaches, as far as anyone here can tell.
IpAddress Normalized(const IpAddress& a) {
  if (!a.v6) return a;
  const uint8_t* b = a.bytes.data();
  const bool zero80 = std::all_of(b, b + 10, [](uint8_t x) { return x == 0; });
  if (zero80 && b[10] == 0xff && b[11] == 0xff) return V4(b + 12);  // ::ffff:a.b.c.d
  if (std::all_of(b, b + 8, [](uint8_t x) { return x == 0; }) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 &&
      b[11] == 0) {
    return V4(b + 12);  // ::ffff:0:a.b.c.d
  }
  if (Contains(MustParse("64:ff9b::"), 96, a)) return V4(b + 12);
  if (b[0] == 0x20 && b[1] == 0x02) return V4(b + 2);  // 6to4
  if (zero80 && b[10] == 0 && b[11] == 0) {            // ::a.b.c.d, but not :: or ::1
    const bool low = b[12] == 0 && b[13] == 0 && b[14] == 0 && b[15] <= 1;
    if (!low) return V4(b + 12);
  }
  return a;
}

// The class of a normalized address: nullptr for public unicast, else its words.
const Range* ClassOf(const IpAddress& a) {
  if (!a.v6) {
    for (const Range& r : kV4Ranges) {
      if (Contains(MustParse(r.net), r.prefix, a)) return &r;
    }
    return nullptr;
  }
  for (const Range& r : kV6Ranges) {
    if (Contains(MustParse(r.net), r.prefix, a)) return &r;
  }
  static constexpr Range kOutsideGlobal = {"2000::", 3, "reserved"};
  return Contains(MustParse("2000::"), 3, a) ? nullptr : &kOutsideGlobal;
}

bool IsMetadata(const Range* r) { return r != nullptr && std::strcmp(r->what, "a cloud metadata service") == 0; }

// A host name as DNS has them; its last label not a number (300.1.2.3 is no name, and no address).
bool ValidHostPattern(absl::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  absl::string_view last;
  for (absl::string_view label : absl::StrSplit(name, '.')) {
    if (label.empty() || label.size() > 63) return false;
    for (char c : label) {
      if (!absl::ascii_isalnum(c) && c != '-' && c != '_') return false;
    }
    last = label;
  }
  const bool numeric = std::all_of(last.begin(), last.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
                       absl::StartsWithIgnoreCase(last, "0x");
  return !numeric;
}

std::string NormalizedHost(absl::string_view host) { return absl::AsciiStrToLower(absl::StripSuffix(host, ".")); }

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlUrlDeleter {
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
};

std::optional<std::string> UrlPart(CURLU* u, CURLUPart part, unsigned flags = 0) {
  char* text = nullptr;
  if (curl_url_get(u, part, &text, flags) != CURLUE_OK || text == nullptr) return std::nullopt;
  std::string out(text);
  curl_free(text);
  return out;
}

// The submit-time resolution: libcurl resolves the URL's host and offers each address to this
// callback, which records it and opens nothing.
struct Probe {
  std::vector<IpAddress> addresses;
};

curl_socket_t RecordAddress(void* data, curlsocktype, curl_sockaddr* address) {
  auto* probe = static_cast<Probe*>(data);
  if (std::optional<IpAddress> a = IpAddress::FromSockaddr(&address->addr); a.has_value()) {
    probe->addresses.push_back(*a);
  }
  return CURL_SOCKET_BAD;
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};

std::vector<IpAddress> Resolve(const std::string& url, absl::Duration timeout) {
  InitCurlOnce();
  Probe probe;
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (curl == nullptr) return {};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECT_ONLY, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout)));  // NOLINT
  curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, RecordAddress);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &probe);
  curl_easy_perform(c);  // fails: every socket refused; only the addresses matter
  return probe.addresses;
}

}  // namespace

// --- IpAddress ---

std::optional<IpAddress> IpAddress::FromLiteral(const std::string& host) {
  std::string h(absl::StripSuffix(absl::StripPrefix(host, "["), "]"));
  if (const size_t zone = h.find('%'); zone != std::string::npos) h.resize(zone);
  IpAddress a;
  if (h.find(':') != std::string::npos) {
    a.v6 = true;
    if (::inet_pton(AF_INET6, h.c_str(), a.bytes.data()) == 1) return a;
    return std::nullopt;
  }
  in_addr v4{};
  if (h.empty() || ::inet_aton(h.c_str(), &v4) == 0) return std::nullopt;
  std::memcpy(a.bytes.data(), &v4.s_addr, 4);
  return a;
}

std::optional<IpAddress> IpAddress::FromSockaddr(const sockaddr* address) {
  IpAddress a;
  if (address->sa_family == AF_INET) {
    std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, 4);
    return a;
  }
  if (address->sa_family == AF_INET6) {
    a.v6 = true;
    std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, 16);
    return a;
  }
  return std::nullopt;
}

std::string IpAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), text, sizeof text);
  return text;
}

// --- URLs ---

absl::StatusOr<HttpUrl> ParseHttpUrl(const std::string& url) {
  InitCurlOnce();
  std::unique_ptr<CURLU, CurlUrlDeleter> u(curl_url());
  if (u == nullptr) return absl::InternalError("libcurl: cannot make a URL handle");
  if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
    return absl::InvalidArgumentError(absl::StrCat("not a URL: '", Excerpt(url), "'"));
  }
  HttpUrl out;
  out.scheme = absl::AsciiStrToLower(UrlPart(u.get(), CURLUPART_SCHEME).value_or(""));
  if (out.scheme != "http" && out.scheme != "https") {
    return absl::InvalidArgumentError(absl::StrCat("an http:// or https:// URL is required, got '", Excerpt(url), "'"));
  }
  out.host =
      NormalizedHost(absl::StripSuffix(absl::StripPrefix(UrlPart(u.get(), CURLUPART_HOST).value_or(""), "["), "]"));
  if (out.host.empty()) return absl::InvalidArgumentError(absl::StrCat("no host in '", Excerpt(url), "'"));
  const std::string port = UrlPart(u.get(), CURLUPART_PORT, CURLU_DEFAULT_PORT).value_or("");
  if (!absl::SimpleAtoi(port, &out.port)) out.port = 0;
  out.path = UrlPart(u.get(), CURLUPART_PATH).value_or("");
  while (!out.path.empty() && out.path.back() == '/') out.path.pop_back();
  out.has_credentials =
      UrlPart(u.get(), CURLUPART_USER).has_value() || UrlPart(u.get(), CURLUPART_PASSWORD).has_value();
  return out;
}

bool SameServer(const std::string& a, const std::string& b) {
  const absl::StatusOr<HttpUrl> x = ParseHttpUrl(a);
  const absl::StatusOr<HttpUrl> y = ParseHttpUrl(b);
  if (!x.ok() || !y.ok() || x->has_credentials || y->has_credentials) return false;
  return x->scheme == y->scheme && x->host == y->host && x->port == y->port && x->path == y->path;
}

// --- DestinationPolicy ---

DestinationPolicy DestinationPolicy::Unrestricted() {
  DestinationPolicy p;
  p.unrestricted_ = true;
  return p;
}

absl::StatusOr<DestinationPolicy> DestinationPolicy::Parse(const std::vector<std::string>& allow,
                                                           const std::vector<std::string>& deny,
                                                           const std::string& source) {
  DestinationPolicy p;
  for (const bool allowing : {true, false}) {
    for (const std::string& raw : allowing ? allow : deny) {
      const std::string entry(absl::StripAsciiWhitespace(raw));
      const std::string where =
          absl::StrCat(source, source.empty() ? "" : ".", allowing ? "allow" : "deny", ": '", Excerpt(entry), "'");
      const size_t slash = entry.find('/');
      const std::string address = entry.substr(0, slash);
      IpAddress net;
      net.v6 = address.find(':') != std::string::npos;
      if (::inet_pton(net.v6 ? AF_INET6 : AF_INET, address.c_str(), net.bytes.data()) == 1) {
        const int full = net.v6 ? 128 : 32;
        int prefix = full;
        if (slash != std::string::npos &&
            (!absl::SimpleAtoi(entry.substr(slash + 1), &prefix) || prefix < 0 || prefix > full)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": the prefix length must be 0 to ", full));
        }
        const IpAddress normalized = Normalized(net);
        if (normalized.v6 != net.v6 && prefix >= 96) prefix -= 96;  // ::ffff:10.0.0.0/104 is 10.0.0.0/8
        p.nets_.push_back({normalized.v6 == net.v6 ? net : normalized, prefix, allowing, entry});
        continue;
      }
      std::string name = NormalizedHost(entry);
      const bool wildcard = absl::StartsWith(name, "*.");
      if (wildcard) name.erase(0, 2);
      if (slash != std::string::npos || !ValidHostPattern(name) || IpAddress::FromLiteral(name).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": expected an address, a CIDR (10.0.0.0/8, fd00::/8) or a host name (mlflow.example, *.example)"));
      }
      p.hosts_.push_back({name, wildcard, allowing});
    }
  }
  return p;
}

DestinationPolicy DestinationPolicy::With(const DestinationPolicy& more) const {
  DestinationPolicy p = *this;
  p.unrestricted_ = unrestricted_ || more.unrestricted_;
  p.hosts_.insert(p.hosts_.end(), more.hosts_.begin(), more.hosts_.end());
  p.nets_.insert(p.nets_.end(), more.nets_.begin(), more.nets_.end());
  return p;
}

absl::Status DestinationPolicy::Check(const std::string& host, const IpAddress& address) const {
  if (unrestricted_) return absl::OkStatus();
  const IpAddress a = Normalized(address);
  const Range* cls = ClassOf(a);
  const std::string name = NormalizedHost(host);
  std::string shown = address.ToString();
  if (a.v6 != address.v6) absl::StrAppend(&shown, " (IPv4 ", a.ToString(), ")");
  const bool literal = IpAddress::FromLiteral(name).has_value();
  if (!literal && name != shown) shown = absl::StrCat(Excerpt(name), " (", shown, ")");
  const auto refused = [&](const std::string& why) {
    return absl::PermissionDeniedError(absl::StrCat("destination ", shown, " ", why));
  };
  // 1. Host names: the most specific entry decides; an exact name outranks every wildcard.
  const HostEntry* host_best = nullptr;
  size_t host_rank = 0;
  for (const HostEntry& e : hosts_) {
    const bool match = literal ? false : e.wildcard ? absl::EndsWith(name, absl::StrCat(".", e.name)) : name == e.name;
    const size_t rank = e.name.size() + (e.wildcard ? 0 : 1000);
    if (match && (host_best == nullptr || rank > host_rank || (rank == host_rank && !e.allow))) {
      host_best = &e;
      host_rank = rank;
    }
  }
  // 2. Addresses: the longest prefix decides.
  const NetEntry* net_best = nullptr;
  for (const NetEntry& e : nets_) {
    if (Contains(e.net, e.prefix, a) &&
        (net_best == nullptr || e.prefix > net_best->prefix || (e.prefix == net_best->prefix && !e.allow))) {
      net_best = &e;
    }
  }
  if (host_best != nullptr && !host_best->allow) {
    return refused(absl::StrCat("is denied by the operator (", host_best->wildcard ? "*." : "", host_best->name, ")"));
  }
  if (host_best == nullptr && net_best != nullptr && !net_best->allow) {
    return refused(absl::StrCat("is denied by the operator (", net_best->text, ")"));
  }
  if (IsMetadata(cls)) {
    const bool exact = net_best != nullptr && net_best->allow && net_best->prefix == (a.v6 ? 128 : 32);
    if (exact) return absl::OkStatus();
    return refused(absl::StrCat("is ", cls->what, "; only an address entry naming exactly it opens it"));
  }
  if (host_best != nullptr || (net_best != nullptr && net_best->allow) || cls == nullptr) return absl::OkStatus();
  return refused(absl::StrCat("is ", cls->what, "; ", kHowToAllow));
}

absl::Status CheckDestinationUrl(const std::string& url, const DestinationPolicy& policy, const std::string& field,
                                 absl::Duration resolve_timeout) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", parsed.status().message()));
  if (policy.unrestricted()) return absl::OkStatus();
  std::vector<IpAddress> addresses;
  if (std::optional<IpAddress> literal = IpAddress::FromLiteral(parsed->host); literal.has_value()) {
    addresses.push_back(*literal);
  } else {
    addresses = Resolve(url, resolve_timeout);
  }
  for (const IpAddress& a : addresses) {
    if (absl::Status s = policy.Check(parsed->host, a); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckJobDestinations(const v1::JobSpec& spec, const DestinationPolicy& policy,
                                  const std::string& operator_mlflow_uri) {
  const auto& webhooks = spec.notifications().webhooks();
  for (int i = 0; i < webhooks.size(); ++i) {
    OOMB_RETURN_IF_ERROR(
        CheckDestinationUrl(webhooks[i].url(), policy, absl::StrCat("notifications.webhooks[", i, "].url")));
  }
  const std::string& mlflow = spec.tracking().mlflow().uri();
  if (!mlflow.empty() && !SameServer(mlflow, operator_mlflow_uri)) {
    OOMB_RETURN_IF_ERROR(CheckDestinationUrl(mlflow, policy, "tracking.mlflow.uri"));
  }
  return absl::OkStatus();
}

}  // namespace oomb::server
