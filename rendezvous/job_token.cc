#include "rendezvous/job_token.h"

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <fstream>

#include "common/env.h"
#include "common/error.h"
#include "common/worker_env.h"
#include "rendezvous/sha256.h"

namespace dlaunch {
namespace {

std::atomic<int64_t> g_refusals{0};

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
  return hmac_sha256(token.data(), token.size(), msg.data(), msg.size());
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
    throw UsageError("cannot read the job token file '" + token_file +
                     "'; check the path given in --rdzv_conf token_file= and its permissions");
  }
  std::string line;
  std::getline(in, line);
  std::string token = trim(line);
  if (token.empty()) {
    throw UsageError("the job token file '" + token_file +
                     "' is empty; write the token on its first line");
  }
  return token;
}

wire::Digest random_nonce() {
  wire::Digest d;
  size_t got = 0;
  while (got < d.size()) {
    ssize_t n = getrandom(d.data() + got, d.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SystemError(errno_message("getrandom", errno));
    }
    got += static_cast<size_t>(n);
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

void note_job_token_refusal() { g_refusals.fetch_add(1, std::memory_order_relaxed); }

int64_t job_token_refusals() { return g_refusals.load(std::memory_order_relaxed); }

}  // namespace dlaunch
