// A program for the process-life tests (tests/integration/process_life_test.sh), over the
// simulator through libcudart. It captures a small graph and launches it in a loop, so that the
// preload traces steadily, and then does one thing to the process:
//
//   life_probe loop          prints "ready" after 20 launches, then launches until killed
//                            (it gives up after 60 s with exit status 2)
//   life_probe handler       installs its own SIGTERM handler after vaswap started, prints
//                            "ready" once vaswap's handler is back in front of it (30 s at
//                            most) and launches until its own handler ran; exits 3
//   life_probe fork N        forks N children while a second thread keeps the trace busy; each
//                            child prints "child PID" and calls exit(0); exits 0
//   life_probe exec CMD...   launches a few times, then replaces itself with CMD
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

#define CHECK(call)                                                        \
  do {                                                                     \
    const cudaError_t rc_ = (call);                                        \
    if (rc_ != cudaSuccess) {                                              \
      std::fprintf(stderr, "life_probe: %s failed with %d\n", #call, rc_); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

struct Graph {
  cudaStream_t stream = nullptr;
  void* buffer = nullptr;
  cudaGraphExec_t exec = nullptr;

  Graph() {
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&buffer, 1 << 20));
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(buffer, 7, 1 << 20, stream));
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  void launch() {
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
  }
};

void ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

void pause_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

int loop(Graph& g) {
  for (int i = 0; i < 20; ++i) g.launch();
  ready();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end) {
    g.launch();
    pause_ms(1);
  }
  return 2;
}

volatile sig_atomic_t g_handled = 0;
void on_term(int) { g_handled = 1; }

int handler(Graph& g) {
  g.launch();  // vaswap has started and opened its trace
  struct sigaction action {};
  action.sa_handler = on_term;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  // vaswap's flusher puts its handler back in front within a second or so.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  struct sigaction current {};
  do {
    g.launch();
    pause_ms(1);
    sigaction(SIGTERM, nullptr, &current);
  } while ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == on_term &&
           std::chrono::steady_clock::now() < until);
  ready();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (g_handled == 0 && std::chrono::steady_clock::now() < end) {
    g.launch();
    pause_ms(1);
  }
  if (g_handled == 0) return 2;
  std::printf("handled\n");
  return 3;
}

int fork_children(Graph& g, int children) {
  std::atomic<bool> stop{false};
  std::thread busy([&] {  // keeps the trace's lock and queue busy at every fork
    for (int i = 0; !stop.load(); ++i) {
      size_t free_bytes = 0, total_bytes = 0;
      CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      if (i % 64 == 63) pause_ms(1);  // bursts: a trace of thousands of lines, not millions
    }
  });
  int failed = 0;
  for (int i = 0; i < children; ++i) {
    g.launch();
    const pid_t pid = fork();
    if (pid == 0) {
      std::printf("child %d\n", static_cast<int>(getpid()));
      std::fflush(stdout);
      std::exit(0);  // runs the atexit handlers vaswap registered
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  stop.store(true);
  busy.join();
  g.launch();
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: life_probe loop | handler | fork N | exec CMD...\n");
    return 64;
  }
  Graph g;
  if (std::strcmp(argv[1], "loop") == 0) return loop(g);
  if (std::strcmp(argv[1], "handler") == 0) return handler(g);
  if (std::strcmp(argv[1], "fork") == 0 && argc == 3) return fork_children(g, std::atoi(argv[2]));
  if (std::strcmp(argv[1], "exec") == 0 && argc >= 3) {
    for (int i = 0; i < 5; ++i) g.launch();
    execvp(argv[2], argv + 2);
    std::perror("life_probe: exec");
    return 1;
  }
  std::fprintf(stderr, "life_probe: unknown mode %s\n", argv[1]);
  return 64;
}
