#include "tests/support/private_dns.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dlaunch::testing {
namespace {

constexpr const char* kDnsmasq = "/usr/sbin/dnsmasq";

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

void fail(const std::string& what) {
  throw std::runtime_error("private DNS: " + what + ": " + std::strerror(errno));
}

void bind_over(const std::string& source, const char* target) {
  if (::mount(source.c_str(), target, nullptr, MS_BIND, nullptr) != 0) {
    fail(std::string("bind-mounting over ") + target);
  }
}

}  // namespace

std::string PrivateDns::unavailable() {
  if (::geteuid() != 0) return "needs root (network and mount namespaces, port 53)";
  if (::access(kDnsmasq, X_OK) != 0) {
    return "needs Debian's dnsmasq (package dnsmasq-base: scripts/setup.sh --test installs it)";
  }
  if (::access("/usr/sbin/ip", X_OK) != 0 && ::access("/sbin/ip", X_OK) != 0) {
    return "needs iproute2's ip";
  }
  return "";
}

std::string resolve_now(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return "";
  std::string out;
  for (addrinfo* a = found; a; a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
    out += (out.empty() ? "" : " ") + std::string(text);
  }
  ::freeaddrinfo(found);
  return out;
}

PrivateDns::PrivateDns(const std::string& domain) : records_(dir_.file("records")) {
  if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) fail("unshare(CLONE_NEWNET | CLONE_NEWNS)");
  // Nothing mounted here may reach the host's mount namespace.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("making / private");
  if (std::system("ip link set lo up") != 0) fail("ip link set lo up");
  write_file(dir_.file("resolv.conf"), "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n");
  write_file(dir_.file("nsswitch.conf"), "hosts: files dns\n");
  bind_over(dir_.file("resolv.conf"), "/etc/resolv.conf");
  bind_over(dir_.file("nsswitch.conf"), "/etc/nsswitch.conf");
  write_file(records_, "");
  // A record served from the start tells when the server answers.
  const std::string ready = "ready." + domain;
  std::vector<std::string> argv = {kDnsmasq,
                                    "--keep-in-foreground",
                                    "--no-resolv",
                                    "--no-hosts",
                                    "--local=/" + domain + "/",
                                    "--listen-address=127.0.0.1",
                                    "--bind-interfaces",
                                    "--port=53",
                                    "--user=root",
                                    "--pid-file=" + dir_.file("dnsmasq.pid"),
                                    "--log-facility=" + dir_.file("dnsmasq.log"),
                                    "--host-record=" + ready + ",127.0.0.9",
                                    "--addn-hosts=" + records_};
  server_ = ::fork();
  if (server_ < 0) fail("fork");
  if (server_ == 0) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(kDnsmasq, args.data());
    ::_exit(127);
  }
  if (!wait_until([&] { return !resolve_now(ready).empty(); }, std::chrono::seconds(20))) {
    throw std::runtime_error("private DNS: dnsmasq did not answer within 20 s; its log:\n" +
                             read_file(dir_.file("dnsmasq.log")));
  }
}

PrivateDns::~PrivateDns() {
  if (server_ > 0) {
    ::kill(server_, SIGTERM);
    ::waitpid(server_, nullptr, 0);
  }
  // The files go with dir_: a later PrivateDns of this process (all tests in one run) mounts
  // its own over the host's files again.
  ::umount2("/etc/nsswitch.conf", MNT_DETACH);
  ::umount2("/etc/resolv.conf", MNT_DETACH);
}

void PrivateDns::reload() {
  if (::kill(server_, SIGHUP) != 0) fail("SIGHUP to dnsmasq");
}

std::chrono::steady_clock::time_point PrivateDns::publish(const std::string& name,
                                                          const std::string& address) {
  // Whole-file replace, so dnsmasq never reads half a file.
  write_file(records_ + ".new", address + " " + name + "\n");
  if (std::rename((records_ + ".new").c_str(), records_.c_str()) != 0) fail("renaming records");
  reload();
  std::chrono::steady_clock::time_point seen{};
  if (!wait_until(
          [&] {
            if (resolve_now(name) != address) return false;
            seen = std::chrono::steady_clock::now();
            return true;
          },
          std::chrono::seconds(20))) {
    throw std::runtime_error("private DNS: " + name + " did not resolve to " + address +
                             " within 20 s of the reload; dnsmasq's log:\n" +
                             read_file(dir_.file("dnsmasq.log")));
  }
  return seen;
}

}  // namespace dlaunch::testing
