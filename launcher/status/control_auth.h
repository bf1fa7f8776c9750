// Proof of the job token for the agents' control endpoints (agent_monitor.h), on both sides:
// the agent issues one-use nonces bound to an action and checks proofs; `dlaunch stop|restart|
// dump` (job_control.h) computes them. The HMAC is the store handshake's own
// (rendezvous/tcp/job_token.h), so the token never crosses the wire.
//
// Not thread-safe (the agent uses it from its loop thread); never blocks; never throws but for
// SystemError from the random source.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {

std::string to_hex(const wire::Digest& d);
// nullopt unless `text` is exactly 64 hex digits.
std::optional<wire::Digest> digest_from_hex(const std::string& text);

class ControlNonces {
 public:
  static constexpr auto kLifetime = std::chrono::seconds(30);
  static constexpr size_t kMaxOutstanding = 256;

  // A fresh nonce (hex) for `action`; the oldest is forgotten past kMaxOutstanding.
  std::string issue(const std::string& action, std::chrono::steady_clock::time_point now);
  // Checks a proof for `action` and uses the nonce up. Returns "" when accepted, else why not
  // (for the refusal and the log).
  std::string check(const std::string& token, const std::string& action,
                    const std::string& nonce_hex, const std::string& client_nonce_hex,
                    const std::string& proof_hex, std::chrono::steady_clock::time_point now);

 private:
  struct Issued {
    std::string action;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Issued> issued_;
};

struct ControlProof {
  std::string client_nonce_hex;
  std::string proof_hex;
};
ControlProof prove_control(const std::string& token, const std::string& nonce_hex);

}  // namespace dlaunch
