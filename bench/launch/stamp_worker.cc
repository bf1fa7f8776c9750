// A worker for the launch benchmarks: prints "stamp <CLOCK_MONOTONIC ns> rank <R> restart <N>"
// as its first act (the time its main() began, right after exec and dynamic loading), then:
//   exit        exit 0
//   sleep S     sleep S seconds, exit 0 (for RSS sampling)
//   crash-once  restart 0: rank 0 exits 1 at once, other ranks wait to be stopped;
//               later restarts: exit 0
// CLOCK_MONOTONIC is system-wide, so the benchmark compares these stamps with its own.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const char* rank = std::getenv("RANK");
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  std::printf("stamp %lld rank %s restart %s\n",
              static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec, rank ? rank : "?",
              restart ? restart : "?");
  std::fflush(stdout);
  const char* mode = argc > 1 ? argv[1] : "exit";
  if (std::strcmp(mode, "sleep") == 0) {
    usleep(static_cast<useconds_t>(std::atof(argc > 2 ? argv[2] : "1") * 1e6));
    return 0;
  }
  if (std::strcmp(mode, "crash-once") == 0 && restart && std::strcmp(restart, "0") == 0) {
    if (rank && std::strcmp(rank, "0") == 0) return 1;
    while (true) pause();
  }
  return 0;
}
