#include "rendezvous/sha256.h"

#include <gtest/gtest.h>

#include "rendezvous/job_token.h"

namespace dlaunch {
namespace {

std::string hex(const Sha256Digest& d) { return to_hex(d.data(), d.size()); }
std::string hmac_hex(const std::string& key, const std::string& data) {
  return hex(hmac_sha256(key.data(), key.size(), data.data(), data.size()));
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(hex(sha256("", 0)),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc", 3)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(hex(sha256(two_blocks.data(), two_blocks.size())),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  Sha256 s;  // fed in odd-sized pieces
  for (size_t i = 0; i < million.size(); i += 997) {
    s.update(million.data() + i, std::min<size_t>(997, million.size() - i));
  }
  EXPECT_EQ(hex(s.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, HmacRfc4231Vectors) {
  // Test case 1.
  EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2.
  EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3.
  EXPECT_EQ(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 6: a key longer than the block is hashed first.
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'),
                     "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Test case 7.
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'),
                     "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the HMAC "
                     "algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(JobToken, ProofsDependOnTokenNoncesAndDirection) {
  auto cn = random_nonce(), sn = random_nonce();
  EXPECT_NE(cn, sn);
  EXPECT_EQ(client_proof("t", cn, sn), client_proof("t", cn, sn));
  EXPECT_NE(client_proof("t", cn, sn), client_proof("u", cn, sn));
  EXPECT_NE(client_proof("t", cn, sn), server_proof("t", cn, sn));
  EXPECT_NE(client_proof("t", cn, sn), client_proof("t", sn, cn));
}

}  // namespace
}  // namespace dlaunch
