/* The C tests' way to try a setting read once per process (an environment
 * knob): run this same program again with it. */
#ifndef VG_TEST_RERUN_H
#define VG_TEST_RERUN_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs this program again as `env PROGRAM arg` (arg may carry a shell
 * redirection); its exit status, 128 + the signal when one ended it. */
static inline int rerun(const char *env, const char *arg)
{
    char self[4096], cmd[8192];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0)
        return -1;
    self[len] = 0;
    snprintf(cmd, sizeof cmd, "env %s '%s' %s", env, self, arg);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#endif
