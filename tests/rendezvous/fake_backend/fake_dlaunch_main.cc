// dlaunch with the test-only fake rendezvous backend (fake_backend.h) registered: the one line
// that adds a backend, then dlaunch's own program.
#include "launcher/dlaunch_main.h"
#include "tests/rendezvous/fake_backend/fake_backend.h"

int main(int argc, char** argv) {
  dlaunch::register_rendezvous_backend(dlaunch::testing::fake_rendezvous_backend());
  return dlaunch::dlaunch_main(argc, argv);
}
