// A bare TCP connection for speaking the store's protocol by hand (the server's and the proxy's
// byte-for-byte tests): connect, send bytes, read exactly n bytes or until the peer closes.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "rendezvous/store/store.h"

namespace dlaunch::test {

class RawConnection {
 public:
  explicit RawConnection(uint16_t port, const char* addr = "127.0.0.1") {
    const bool v6 = std::string(addr).find(':') != std::string::npos;
    fd_ = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc;
    if (v6) {
      sockaddr_in6 sa{};
      sa.sin6_family = AF_INET6;
      sa.sin6_port = htons(port);
      inet_pton(AF_INET6, addr, &sa.sin6_addr);
      rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    } else {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(port);
      inet_pton(AF_INET, addr, &sa.sin_addr);
      rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    }
    if (rc != 0) {
      close();
      throw std::runtime_error("connect failed");
    }
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const Bytes& b) {
    ASSERT_EQ(::send(fd_, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size()));
  }
  // Exactly n bytes, or fewer if the peer closed or `timeout_ms` of silence passed.
  Bytes recv(size_t n, int timeout_ms = 10000) {
    Bytes out;
    while (out.size() < n && read_some(out, n - out.size(), timeout_ms)) {
    }
    return out;
  }
  // Everything until the peer closes (or 10 s of silence).
  Bytes recv_until_closed() {
    Bytes out;
    while (read_some(out, SIZE_MAX, 10000)) {
    }
    return out;
  }
  bool closed_by_peer(int timeout_ms = 10000) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    uint8_t b;
    return ::recv(fd_, &b, 1, 0) <= 0;
  }
  bool silent(int ms) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, ms) == 0;
  }

 private:
  // Appends up to `most` bytes; false when the peer closed or nothing came within the timeout.
  bool read_some(Bytes& out, size_t most, int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    uint8_t buf[4096];
    ssize_t r = ::recv(fd_, buf, std::min(sizeof(buf), most), 0);
    if (r <= 0) return false;
    out.insert(out.end(), buf, buf + r);
    return true;
  }

  int fd_ = -1;
};

}  // namespace dlaunch::test
