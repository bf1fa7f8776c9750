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

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "rendezvous/tcp/store_codec.h"

namespace dlaunch {

// The token from DLAUNCH_JOB_TOKEN, or else from `token_file` when non-empty (first line,
// surrounding whitespace trimmed). nullopt: no token configured. Throws UsageError when the
// file cannot be read or the token is empty.
std::optional<std::string> load_job_token(const std::string& token_file = "");

// Clients this process's store servers refused for a job token that differs from theirs
// (counted by TcpStoreServer), so a rendezvous that times out can say why nodes never joined.
void note_job_token_refusal();
int64_t job_token_refusals();

// The handshake's primitives come from OpenSSL's libcrypto (RAND_bytes, HMAC with SHA-256,
// CRYPTO_memcmp) rather than our own code: crypto is where a subtle slip costs the most and
// review catches the least. None of them blocks.

// 32 bytes from OpenSSL's CSPRNG (seeded from the kernel); throws SystemError if it fails.
wire::Digest random_nonce();

// HMAC-SHA-256 over the label, then the client nonce, then the server nonce, keyed with the
// token (the table above). Throw InternalError only if OpenSSL itself cannot compute it.
wire::Digest server_proof(const std::string& token, const wire::Digest& client_nonce,
                          const wire::Digest& server_nonce);
wire::Digest client_proof(const std::string& token, const wire::Digest& client_nonce,
                          const wire::Digest& server_nonce);

// Compares in time independent of where the first difference is, so a client cannot learn a
// proof byte by byte from how fast the server refuses it.
bool constant_time_equal(const uint8_t* a, const uint8_t* b, size_t size);

}  // namespace dlaunch
