#include "rendezvous/tcp/libcrypto.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>

#include "common/error.h"

namespace dlaunch {
namespace {

const std::string kSoname = fmt::format("libcrypto.so.{}", OPENSSL_VERSION_MAJOR);

template <typename Fn>
void bind(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (fn == nullptr) {
    throw SystemError(fmt::format(
        "{} has no function {} (a different OpenSSL than the one dlaunch was built with?); "
        "install Debian's libssl3 or rebuild dlaunch against the OpenSSL you have",
        kSoname, name));
  }
}

LibCrypto load() {
  // RTLD_LOCAL: nothing else in the process resolves symbols against it by accident.
  void* handle = ::dlopen(kSoname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw SystemError(fmt::format(
        "the job token needs OpenSSL's {} for HMAC-SHA-256, and it cannot be loaded ({}); "
        "install it (Debian: apt-get install libssl3) or run without a job token",
        kSoname, ::dlerror()));
  }
  LibCrypto c{};
  bind(handle, "HMAC", c.hmac);
  bind(handle, "EVP_sha256", c.evp_sha256);
  bind(handle, "RAND_bytes", c.rand_bytes);
  bind(handle, "CRYPTO_memcmp", c.crypto_memcmp);
  bind(handle, "ERR_get_error", c.err_get_error);
  bind(handle, "ERR_clear_error", c.err_clear_error);
  bind(handle, "ERR_error_string_n", c.err_error_string_n);
  return c;  // the handle stays open for the life of the process
}

}  // namespace

const LibCrypto& libcrypto() {
  static const LibCrypto loaded = load();
  return loaded;
}

}  // namespace dlaunch
