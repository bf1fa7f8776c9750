#include "rendezvous/tcp/job_token.h"

#include <fmt/format.h>

#include <atomic>
#include <fstream>

#include "common/env.h"
#include "common/error.h"
#include "common/worker_env.h"
#include "rendezvous/tcp/libcrypto.h"

namespace dlaunch {
namespace {

std::atomic<int64_t> g_refusals{0};

// The reason OpenSSL queued for its last failure on this thread (and clears its queue).
std::string openssl_error() {
  const LibCrypto& crypto = libcrypto();
  unsigned long code = crypto.err_get_error();
  crypto.err_clear_error();
  if (code == 0) return "no reason given";
  char buf[256];
  crypto.err_error_string_n(code, buf, sizeof buf);
  return buf;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

wire::Digest proof(const char* label, const std::string& token, const wire::Digest& cn,
                   const wire::Digest& sn) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(cn.data()), cn.size());
  msg.append(reinterpret_cast<const char*>(sn.data()), sn.size());
  wire::Digest out{};
  unsigned int out_size = 0;
  // The one-shot HMAC() (not deprecated in OpenSSL 3) fails only when the digest cannot be
  // fetched or memory runs out; neither leaves a handshake worth continuing.
  const unsigned char* ok =
      libcrypto().hmac(libcrypto().evp_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &out_size);
  DL_CHECK(ok != nullptr && out_size == out.size())
      << "HMAC-SHA-256 failed in OpenSSL: " << openssl_error();
  return out;
}

}  // namespace

std::optional<std::string> load_job_token(const std::string& token_file) {
  if (auto env = get_env(env_names::kJobToken)) {
    std::string token = trim(*env);
    if (token.empty()) {
      throw UsageError(std::string(env_names::kJobToken) +
                       " is set but empty; set it to a secret string or unset it");
    }
    return token;
  }
  if (token_file.empty()) return std::nullopt;
  std::ifstream in(token_file);
  if (!in) {
    throw UsageError(fmt::format(
        "cannot read the job token file '{}'; check the path given in --rdzv_conf token_file= "
        "and its permissions",
        token_file));
  }
  std::string line;
  std::getline(in, line);
  std::string token = trim(line);
  if (token.empty()) {
    throw UsageError(fmt::format(
        "the job token file '{}' is empty; write the token on its first line", token_file));
  }
  return token;
}

wire::Digest random_nonce() {
  wire::Digest d;
  if (libcrypto().rand_bytes(d.data(), static_cast<int>(d.size())) != 1) {
    throw SystemError(fmt::format(
        "cannot draw a random nonce from OpenSSL's generator ({}); check that the kernel's "
        "entropy source (getrandom, /dev/urandom) is available",
        openssl_error()));
  }
  return d;
}

wire::Digest server_proof(const std::string& token, const wire::Digest& client_nonce,
                          const wire::Digest& server_nonce) {
  return proof("dlaunch-server", token, client_nonce, server_nonce);
}

wire::Digest client_proof(const std::string& token, const wire::Digest& client_nonce,
                          const wire::Digest& server_nonce) {
  return proof("dlaunch-client", token, client_nonce, server_nonce);
}

bool constant_time_equal(const uint8_t* a, const uint8_t* b, size_t size) {
  return libcrypto().crypto_memcmp(a, b, size) == 0;
}

void note_job_token_refusal() { g_refusals.fetch_add(1, std::memory_order_relaxed); }

int64_t job_token_refusals() { return g_refusals.load(std::memory_order_relaxed); }

}  // namespace dlaunch
