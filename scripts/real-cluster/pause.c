/* The pod sandbox's process (containerd's sandbox_image, built by scripts/real-cluster.sh):
 * waits, reaps what it inherits as PID 1, and exits 0 on SIGTERM or SIGINT. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction action = {0};
  action.sa_handler = stop;
  sigaction(SIGTERM, &action, 0);
  sigaction(SIGINT, &action, 0);
  action.sa_handler = reap;
  action.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &action, 0);
  for (;;) pause();
}
