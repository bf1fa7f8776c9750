// launcher/hang/hang_diagnosis.h: telling the stuck rank from the ranks that wait for it, on the
// stacks Debian's PyTorch 1.13 DDP (gloo, CPU) workers really showed under faulthandler and
// eu-stack (trimmed), plus gdb's thread header.
#include "launcher/hang/hang_diagnosis.h"

#include <gtest/gtest.h>

#include "launcher/hang/hang_investigation.h"

namespace dlaunch {
namespace {

const char kVictimPython[] = R"(--- dlaunch: Python stacks requested (signal 37) of pid(s) 26492
Thread 0x00007f2c70bfe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap

Current thread 0x00007f2c891e02c0 (most recent call first):
  File "/usr/lib/python3/dist-packages/torch/autograd/__init__.py", line 197 in backward
  File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 488 in backward
  File "/work/tests/compat/ddp_hang.py", line 43 in main
  File "/work/tests/compat/ddp_hang.py", line 52 in <module>
)";

const char kVictimNative[] = R"(PID 26492 - process
TID 26492:
#0  0x00007f2c89266f16 __futex_abstimed_wait_common
#1  0x00007f2c892695d8 pthread_cond_wait@@GLIBC_2.3.2
#2  0x00007f2c84ca5023 c10d::Reducer::finalize_backward()
#3  0x00007f2c84338bca torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)
#4  0x000000000052b9e0 _PyEval_EvalFrameDefault
TID 26501:
#0  0x00007f2c89266f16 epoll_wait
#1  0x00007f2c84ca0000 gloo::transport::tcp::Loop::run()
)";

const char kStuckPython[] = R"(dlaunch-python-stacks pid=26493 signal=37
--- dlaunch: Python stacks requested (signal 37) of pid(s) 26493
Current thread 0x00007f77d5b242c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait
  File "/work/tests/compat/ddp_hang.py", line 22 in wait_for_a_batch_that_never_comes
  File "/work/tests/compat/ddp_hang.py", line 40 in main
  File "/work/tests/compat/ddp_hang.py", line 52 in <module>
)";

// The stuck rank's gloo threads idle in gloo:: too: only the main thread counts.
const char kStuckNative[] = R"(PID 26493 - process
TID 26493:
#0  0x00007f77d5baaf16 __futex_abstimed_wait_common
#1  0x00007f77d5bb5d90 __new_sem_wait_slow64.constprop.0
#2  0x00000000004f905f PyThread_acquire_lock_timed
TID 26510:
#0  0x00007f2c89266f16 epoll_wait
#1  0x00007f2c84ca0000 gloo::transport::tcp::Loop::run()
)";

TEST(HangDiagnosis, ParsesEveryThreadOfAFaulthandlerDumpInnermostFirst) {
  auto threads = parse_faulthandler_dump(kVictimPython);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_FALSE(threads[0].current);
  EXPECT_TRUE(threads[1].current);
  ASSERT_EQ(threads[1].frames.size(), 4u);
  EXPECT_EQ(threads[1].frames[0].function, "backward");
  EXPECT_EQ(threads[1].frames[0].line, 197);
  EXPECT_EQ(threads[1].frames[3].function, "<module>");
  EXPECT_TRUE(parse_faulthandler_dump("no dump here\n").empty());
}

TEST(HangDiagnosis, NativeFramesOfOneThreadFromEuStackAndGdb) {
  auto frames = native_thread_frames(kVictimNative, 26492);
  ASSERT_EQ(frames.size(), 5u);
  EXPECT_NE(frames[2].find("c10d::Reducer::finalize_backward"), std::string::npos);
  EXPECT_EQ(native_thread_frames(kVictimNative, 26501).size(), 2u);
  EXPECT_TRUE(native_thread_frames(kVictimNative, 1).empty());

  const char gdb[] =
      "Thread 2 (Thread 0x7f (LWP 51) \"python3\"):\n#0  0x1 in epoll_wait ()\n"
      "Thread 1 (Thread 0x7e (LWP 50) \"python3\"):\n#0  0x2 in __futex ()\n"
      "#1  0x3 in gloo::transport::tcp::Pair::recv() ()\n";
  auto main_frames = native_thread_frames(gdb, 50);
  ASSERT_EQ(main_frames.size(), 2u);
  EXPECT_NE(main_frames[1].find("gloo::"), std::string::npos);
}

TEST(HangDiagnosis, DdpVictimWaitsInACollectiveAndTheStuckRankDoesNot) {
  HangFinding victim = diagnose_hang(kVictimPython, kVictimNative, 26492);
  EXPECT_TRUE(victim.in_collective);
  EXPECT_TRUE(victim.have_python);
  EXPECT_TRUE(victim.have_native);
  EXPECT_NE(victim.where.find("c10d::Reducer::finalize_backward()"), std::string::npos)
      << victim.where;

  HangFinding stuck = diagnose_hang(kStuckPython, kStuckNative, 26493);
  EXPECT_FALSE(stuck.in_collective);
  // The script's own frame names the place, not threading.py.
  EXPECT_EQ(stuck.where.rfind("wait_for_a_batch_that_never_comes (ddp_hang.py:22)", 0), 0u)
      << stuck.where;
  EXPECT_NE(stuck.python_stack.find("line 22 in wait_for_a_batch_that_never_comes"),
            std::string::npos);

  EXPECT_EQ(pick_hang_root({victim, stuck}), 1u);
  EXPECT_EQ(pick_hang_root({stuck, victim}), 0u);
}

// dtrain (C++, no Python): the victim's main thread waits for its comm thread in
// dlaunch::comm (a futex, not gloo); the stuck rank is in compute. Both stacks hold
// run_training(..., dlaunch::comm::ProcessGroup&, ...): an argument type must not count.
const char kDtrainVictim[] = R"(PID 26121 - process
TID 26121:
#0  0x00007f16a271f829 syscall
#1  0x00007f16a28d1c09 std::__atomic_futex_unsigned_base::_M_futex_wait_until(unsigned int*, unsigned int, bool, std::chrono::duration<long, std::ratio<1l, 1l> >, std::chrono::duration<long, std::ratio<1l, 1000000000l> >)
#2  0x00005641d9741664 dlaunch::comm::(anonymous namespace)::FutureWork::wait()
#3  0x00005641d9722502 dlaunch::ddp::GradReducer::finish()
#4  0x00005641d96e4a0e dlaunch::train::run_training(dlaunch::train::TrainConfig const&, dlaunch::WorkerEnv const&, dlaunch::comm::ProcessGroup&, dlaunch::kernels::Backend&, dlaunch::train::FaultInjection const&)
#5  0x00005641d96bdad0 main
)";
const char kDtrainStuck[] = R"(PID 26122 - process
TID 26122:
#0  0x00005641d9800000 dlaunch::kernels::cpu::conv2d_forward(float const*, float*)
#1  0x00005641d96f4bf3 dlaunch::ddp::DataParallel::train_step(dlaunch::Tensor const&, int const*)
#2  0x00005641d96e4a0e dlaunch::train::run_training(dlaunch::train::TrainConfig const&, dlaunch::WorkerEnv const&, dlaunch::comm::ProcessGroup&, dlaunch::kernels::Backend&, dlaunch::train::FaultInjection const&)
#3  0x00005641d96bdad0 main
)";

TEST(HangDiagnosis, DtrainVictimWaitsForItsCommThreadAndTheStuckRankComputes) {
  HangFinding victim = diagnose_hang("", kDtrainVictim, 26121);
  HangFinding stuck = diagnose_hang("", kDtrainStuck, 26122);
  EXPECT_TRUE(victim.in_collective) << victim.where;
  EXPECT_FALSE(stuck.in_collective) << stuck.where;
  EXPECT_EQ(pick_hang_root({victim, stuck}), 1u);
  // A stopped process is the root even when it was stopped inside a collective.
  HangFinding stopped = victim;
  stopped.stopped = true;
  EXPECT_EQ(pick_hang_root({stuck, stopped}), 1u);
}

TEST(HangDiagnosis, PythonFramesAloneShowACollective) {
  const char dump[] =
      "Current thread 0x1 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line "
      "1536 in all_reduce\n"
      "  File \"train.py\", line 9 in step\n";
  HangFinding f = diagnose_hang(dump, "", 1);
  EXPECT_TRUE(f.in_collective);
  EXPECT_EQ(f.where, "step (train.py:9), in all_reduce (distributed_c10d.py:1536)");
}

TEST(HangDiagnosis, RootIsTheFirstWithStacksOutsideACollectiveElseTheFirst) {
  HangFinding none;  // no stacks read
  HangFinding waiting;
  waiting.in_collective = true;
  waiting.have_native = true;
  HangFinding elsewhere;
  elsewhere.have_native = true;
  EXPECT_EQ(pick_hang_root({none, waiting, elsewhere}), 2u);
  EXPECT_EQ(pick_hang_root({waiting, none}), 1u);
  EXPECT_EQ(pick_hang_root({waiting, waiting}), 0u);
  EXPECT_FALSE(pick_hang_root({}).has_value());
}

// The agent's verdict: rank 0 (hung first, waiting in DDP's all-reduce) is a victim; rank 1
// (silent, stuck in the script) is named, with its Python stack; rank 2 was still beating.
TEST(HangDiagnosis, JudgeHangNamesTheStuckSuspectAndLogsEveryWorker) {
  auto result = [](int64_t lr, int pid, const char* py, const char* native) {
    HangInvestigation::Result r;
    r.target = {lr, 10 + lr, pid, "/logs/" + std::to_string(lr)};
    r.python_requested = true;
    r.finding = diagnose_hang(py, native, pid);
    return r;
  };
  std::vector<HangInvestigation::Result> results{result(0, 26492, kVictimPython, kVictimNative),
                                                 result(1, 26493, kStuckPython, kStuckNative),
                                                 result(2, 7, "", "")};
  HangVerdict v = judge_hang({0, 1}, results);
  EXPECT_EQ(v.root, 1);
  ASSERT_EQ(v.log.size(), 5u);
  EXPECT_EQ(v.log[0].rfind("local rank 0 (rank 10, silent): waits in a collective: ", 0), 0u)
      << v.log[0];
  EXPECT_EQ(v.log[1].rfind("local rank 1 (rank 11, silent): is not in a collective: "
                           "wait_for_a_batch_that_never_comes (ddp_hang.py:22)",
                           0),
            0u)
      << v.log[1];
  EXPECT_EQ(v.log[2],
            "local rank 2 (rank 12, beating): no stack was read; stacks in "
            "/logs/2/stack.txt and py_stack.txt");
  EXPECT_EQ(v.log[3].rfind("root cause of the hang: local rank 1 (rank 11, pid 26493), stuck in "
                           "wait_for_a_batch_that_never_comes",
                           0),
            0u)
      << v.log[3];
  EXPECT_NE(v.log[4].find("line 22 in wait_for_a_batch_that_never_comes"), std::string::npos);
  // Nothing to tell them apart: the first suspect (a hung one).
  EXPECT_EQ(judge_hang({2, 0}, {}).root, 2);
}

}  // namespace
}  // namespace dlaunch
