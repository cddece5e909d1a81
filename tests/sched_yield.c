/* Preloaded into the suite's subprocesses (tests/conftest.py). Horovod's torch ops wait for a
 * handle by spinning on sched_yield; with 2-6 ranks on 2 cores the spinning main threads take the
 * cores from the background threads that do the work. A short sleep hands the core over instead.
 * sched_yield promises nothing but a hint, so the ranks' results cannot change. */
#include <sched.h>
#include <time.h>

int sched_yield(void) {
  struct timespec pause = {0, 20000};
  nanosleep(&pause, 0);
  return 0;
}
