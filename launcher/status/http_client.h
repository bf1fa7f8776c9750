// A minimal blocking HTTP/1.1 client for dlaunch's own endpoints (`dlaunch status|stop|...`,
// tests): one request per connection ("Connection: close"), the whole exchange bounded by a
// deadline. Not a general client: no TLS, no redirects, no chunked bodies (dlaunch's server
// always sends Content-Length).
//
// Throws ConnectionError (cannot connect, reset, or the deadline passed: the message names the
// address) and ProtocolError (the reply is not HTTP).
#pragma once

#include <map>
#include <string>

#include "common/clock.h"

namespace dlaunch {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// `address`: "host:port" or "[v6]:port". `target`: "/status".
HttpReply http_request(const std::string& address, const std::string& method,
                       const std::string& target,
                       const std::map<std::string, std::string>& headers = {},
                       const std::string& body = "", Duration timeout = std::chrono::seconds(5));

}  // namespace dlaunch
