#include "launcher/status/control_auth.h"

#include "rendezvous/tcp/job_token.h"

namespace dlaunch {

std::string to_hex(const wire::Digest& d) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::optional<wire::Digest> digest_from_hex(const std::string& text) {
  wire::Digest d{};
  if (text.size() != d.size() * 2) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < d.size(); ++i) {
    int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}

std::string ControlNonces::issue(const std::string& action,
                                 std::chrono::steady_clock::time_point now) {
  for (auto it = issued_.begin(); it != issued_.end();) {
    it = now - it->second.at > kLifetime ? issued_.erase(it) : std::next(it);
  }
  while (issued_.size() >= kMaxOutstanding) {
    auto oldest = issued_.begin();
    for (auto it = issued_.begin(); it != issued_.end(); ++it) {
      if (it->second.at < oldest->second.at) oldest = it;
    }
    issued_.erase(oldest);
  }
  std::string nonce = to_hex(random_nonce());
  issued_[nonce] = Issued{action, now};
  return nonce;
}

std::string ControlNonces::check(const std::string& token, const std::string& action,
                                 const std::string& nonce_hex, const std::string& client_nonce_hex,
                                 const std::string& proof_hex,
                                 std::chrono::steady_clock::time_point now) {
  if (nonce_hex.empty() || proof_hex.empty()) {
    return "no proof of the job token (X-Dlaunch-Nonce/X-Dlaunch-Proof missing)";
  }
  auto it = issued_.find(nonce_hex);
  if (it == issued_.end()) return "unknown or already used nonce";
  Issued issued = it->second;
  issued_.erase(it);  // one use, whatever the outcome
  if (now - issued.at > kLifetime) return "the nonce expired";
  if (issued.action != action) {
    return "the nonce was issued for '" + issued.action + "', not '" + action + "'";
  }
  auto server_nonce = digest_from_hex(nonce_hex);
  auto client_nonce = digest_from_hex(client_nonce_hex);
  auto proof = digest_from_hex(proof_hex);
  if (!server_nonce || !client_nonce || !proof) return "malformed proof";
  wire::Digest expected = client_proof(token, *client_nonce, *server_nonce);
  if (!constant_time_equal(expected.data(), proof->data(), expected.size())) {
    return "wrong job token";
  }
  return "";
}

ControlProof prove_control(const std::string& token, const std::string& nonce_hex) {
  auto server_nonce = digest_from_hex(nonce_hex);
  wire::Digest client_nonce = random_nonce();
  ControlProof p;
  p.client_nonce_hex = to_hex(client_nonce);
  p.proof_hex = server_nonce ? to_hex(client_proof(token, client_nonce, *server_nonce)) : "";
  return p;
}

}  // namespace dlaunch
