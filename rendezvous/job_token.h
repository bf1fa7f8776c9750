// The job token: a shared secret that keeps strangers out of a job's store. Agents and dtrain
// workers prove they know it at connect with a challenge-response over HMAC-SHA-256; the token
// itself never crosses the wire. docs/rendezvous.md has the handshake and the threat model.
//
//   client                                     server
//   AUTH_BEGIN  client_nonce[32]       ->
//                                      <-      mode u8 (1 = token required, 0 = none)
//                                              server_nonce[32]
//                                              server_proof = HMAC(token, "dlaunch-server" | cn | sn)
//   AUTH_PROOF  client_proof[32]       ->      client_proof = HMAC(token, "dlaunch-client" | cn | sn)
//                                      <-      u8 0 = accepted (else the server closes)
//
// Both sides prove the token, so a client also knows it reached its own job's store and not
// another job's on the same port.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rendezvous/store_codec.h"

namespace dlaunch {

// The token from DLAUNCH_JOB_TOKEN, or else from `token_file` when non-empty (first line,
// surrounding whitespace trimmed). nullopt: no token configured. Throws UsageError when the
// file cannot be read or the token is empty.
std::optional<std::string> load_job_token(const std::string& token_file = "");

// Clients this process's store servers refused for a job token that differs from theirs
// (counted by TcpStoreServer), so a rendezvous that times out can say why nodes never joined.
void note_job_token_refusal();
int64_t job_token_refusals();

// 32 random bytes from the kernel (getrandom); throws SystemError if it fails.
wire::Digest random_nonce();

wire::Digest server_proof(const std::string& token, const wire::Digest& client_nonce,
                          const wire::Digest& server_nonce);
wire::Digest client_proof(const std::string& token, const wire::Digest& client_nonce,
                          const wire::Digest& server_nonce);

}  // namespace dlaunch
