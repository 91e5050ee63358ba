// A minimal HTTP/1.0 GET against a loopback port, for tests of /metrics and of Prometheus' HTTP
// API (both answer HTTP/1.0 without chunking), and URL query encoding.
#ifndef OOMB_TESTS_SERVER_HTTP_GET_H_
#define OOMB_TESTS_SERVER_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace oomb::testing {

struct HttpResponse {
  int status = 0;  // 0: no response (connection refused, timeout)
  std::string body;
};

// GET http://127.0.0.1:`port``path_and_query`, waiting at most `timeout_s` for the answer.
inline HttpResponse HttpGet(int port, const std::string& path_and_query, int timeout_s = 10) {
  HttpResponse r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{.tv_sec = timeout_s, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string raw;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path_and_query + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[1 << 16];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) raw.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t header_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/", 0) != 0 || header_end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  r.body = raw.substr(header_end + 4);
  return r;
}

// Percent-encodes everything but RFC 3986's unreserved characters.
inline std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_SERVER_HTTP_GET_H_
