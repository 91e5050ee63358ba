// Where the daemon may send requests on a tenant's behalf: the webhook endpoints a job's spec
// names (notifications.webhooks[].url) and the MLflow server it names (tracking.mlflow.uri), and
// anything of the kind later. One policy, applied at two moments (issue 78):
//
//   at submit     CheckDestinationUrl: the URL's host as written, an address in any spelling
//                 (127.0.0.1, [::1], 2130706433, 0x7f000001, 0177.1, [::ffff:127.0.0.1]) or a
//                 name and every address it resolves to then; a refusal is CreateJob's
//                 INVALID_ARGUMENT naming the field;
//   at connect    SendHttp (server/notify/http_client.h) asks the policy about the address
//                 libcurl is about to open a socket to, after its own resolution, so a name
//                 that resolved elsewhere at submit (DNS rebinding) reaches nothing refused.
//                 Redirects are never followed; proxies from the environment are not used (a
//                 proxy would make the address checked the proxy's).
//
// By default only public unicast addresses are reached. Refused: loopback (127/8, ::1),
// unspecified (0/8, ::), private (10/8, 172.16/12, 192.168/16, fc00::/7, CGNAT 100.64/10,
// NAT64 local-use 64:ff9b:1::/48), link-local (169.254/16, fe80::/10, fec0::/10), multicast
// (224/4, ff00::/8), cloud metadata services (169.254.169.254, 168.63.129.16,
// 100.100.100.200, fd00:ec2::254), and reserved ranges (192.0.0/24, documentation and
// benchmarking ranges, 240/4, anything outside 2000::/3). IPv6 forms that carry an IPv4
// address (::ffff:a.b.c.d, 64:ff9b::/96, 6to4 2002::/16, ::a.b.c.d) are judged by that address.
//
// The operator's lists: outbound.allow and outbound.deny in the daemon's config (every
// project), and outbound: {allow, deny} per project in tenancy.projects_file (added to the
// daemon's). An entry is an address or CIDR ("10.20.0.0/16", "127.0.0.1", "fd00::/8") or a
// host name ("mlflow.corp.example"; "*.corp.example" for every name below it). The decision
// for a connection to address A named by host H:
//
//   1. the host-name entries matching H: the most specific decides (an exact name over a
//      wildcard, a longer wildcard over a shorter; deny at a tie);
//   2. else the address entries containing A: the longest prefix decides (deny at a tie);
//   3. else A's class: public is reached, anything else refused.
//
// A metadata address is reached only through an address entry naming exactly it (/32, /128):
// allowing 169.254.0.0/16, 0.0.0.0/0 or a host name does not open it.
//
// Destinations the operator configured itself (tracking.mlflow_uri, the projects' webhooks
// in tenancy.projects_file) are not tenants' and pass unchecked (DestinationPolicy::Unrestricted).
//
// Thread-safety: a policy is an immutable value; use from any thread.
#ifndef OOMB_SERVER_NOTIFY_DESTINATION_POLICY_H_
#define OOMB_SERVER_NOTIFY_DESTINATION_POLICY_H_

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "oomb/v1/job_spec.pb.h"

namespace oomb::server {

// An IPv4 or IPv6 address.
struct IpAddress {
  bool v6 = false;
  std::array<uint8_t, 16> bytes = {};  // IPv4: the first 4

  // The address a literal host spells: IPv6 ("::1", brackets allowed) or IPv4 in any form
  // inet_aton(3) takes (dotted, decimal, octal, hex, short). nullopt for a name.
  static std::optional<IpAddress> FromLiteral(const std::string& host);
  // nullopt for families other than AF_INET and AF_INET6.
  static std::optional<IpAddress> FromSockaddr(const sockaddr* address);
  std::string ToString() const;
};

// The URL parts a policy and the token binding read, as libcurl parses them (its parser is the
// one that sends): scheme and host lower case, IPv6 hosts without brackets, the port filled
// in from the scheme, the path without its trailing slashes.
struct HttpUrl {
  std::string scheme, host, path;
  int port = 0;
  bool has_credentials = false;  // user:password@
};
// INVALID_ARGUMENT when `url` is not an http:// or https:// URL with a host.
absl::StatusOr<HttpUrl> ParseHttpUrl(const std::string& url);

// Whether two URLs name the same server and path: what an operator's credential (the MLflow
// token) is bound to. False when either does not parse or carries credentials of its own.
bool SameServer(const std::string& a, const std::string& b);

class DestinationPolicy {
 public:
  // No entries: public addresses only.
  DestinationPolicy() = default;
  // Every destination: the operator's own.
  static DestinationPolicy Unrestricted();
  // The entries of one list pair; INVALID_ARGUMENT naming `source` and the list ("outbound" gives
  // "outbound.allow: 'x': ...") and the entry that is neither an address, a CIDR nor a host name.
  static absl::StatusOr<DestinationPolicy> Parse(const std::vector<std::string>& allow,
                                                 const std::vector<std::string>& deny, const std::string& source);

  // This policy's entries and `more`'s (a project's added to the daemon's).
  DestinationPolicy With(const DestinationPolicy& more) const;

  // OK, or PERMISSION_DENIED saying why, e.g. "destination localhost (127.0.0.1) is loopback;
  // tenants' requests reach only public addresses unless the operator allows the destination
  // (outbound.allow in the daemon's config, outbound.allow of the project in
  // tenancy.projects_file)". `host` is the URL's host as parsed (a name or a literal).
  absl::Status Check(const std::string& host, const IpAddress& address) const;

  bool unrestricted() const { return unrestricted_; }
  bool empty() const { return hosts_.empty() && nets_.empty(); }

 private:
  struct HostEntry {
    std::string name;  // lower case, without "*."
    bool wildcard = false;
    bool allow = false;
  };
  struct NetEntry {
    IpAddress net;
    int prefix = 0;
    bool allow = false;
    std::string text;
  };
  bool unrestricted_ = false;
  std::vector<HostEntry> hosts_;
  std::vector<NetEntry> nets_;
};

// The policy of a project's tenants: the daemon's entries with the project's.
using DestinationPolicyOf = std::function<DestinationPolicy(const std::string& project)>;

// The submit-time check of a URL a tenant named, its errors INVALID_ARGUMENT prefixed with
// `field`: not an http(s) URL; a literal host the policy refuses; a name that resolves (within
// `resolve_timeout`, by libcurl's resolver, no socket ever opened) to an address the policy
// refuses. A name that does not resolve now is accepted: the connect-time check decides.
absl::Status CheckDestinationUrl(const std::string& url, const DestinationPolicy& policy, const std::string& field,
                                 absl::Duration resolve_timeout = absl::Seconds(2));

// CreateJob's check of every destination a job's spec names: notifications.webhooks[i].url
// and tracking.mlflow.uri (unless it names the operator's server, `operator_mlflow_uri`, by
// SameServer), each as CheckDestinationUrl with its field.
absl::Status CheckJobDestinations(const v1::JobSpec& spec, const DestinationPolicy& policy,
                                  const std::string& operator_mlflow_uri);

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_DESTINATION_POLICY_H_
