// OpenSSL's libcrypto, loaded when the job token first needs it rather than linked.
// Why: only jobs with a job token use it, and linking it cost every dlaunch start about 0.7 ms
// of dynamic relocations and 1.4 MiB of RSS (docs/benchmarks.md, "Launch"). The types come
// from OpenSSL's headers, so a signature change is a compile error, not a crash.
#pragma once

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace dlaunch {

struct LibCrypto {
  decltype(&::HMAC) hmac;
  decltype(&::EVP_sha256) evp_sha256;
  decltype(&::RAND_bytes) rand_bytes;
  decltype(&::CRYPTO_memcmp) crypto_memcmp;
  decltype(&::ERR_get_error) err_get_error;
  decltype(&::ERR_clear_error) err_clear_error;
  decltype(&::ERR_error_string_n) err_error_string_n;
};

// The library, loaded once (thread-safe) from the soname these headers belong to
// (libcrypto.so.3). Throws SystemError naming the library and the package to install when it
// cannot be loaded or lacks a function.
const LibCrypto& libcrypto();

}  // namespace dlaunch
