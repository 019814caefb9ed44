/* sl_limits: the open-file limit raised to what the settings need (see sl_limits.h). */
#include "common/sl_limits.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include "common/sl_log.h"

static uint64_t as_u64(rlim_t v)
{
    return v == RLIM_INFINITY ? UINT64_MAX : (uint64_t)v;
}

uint64_t sl_nofile_ensure(uint64_t need, const char *mod, const char *setting, int64_t value)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        sl_warn(mod, "nofile_unknown", "could not read the open-file limit: %s", strerror(errno));
        return 0;
    }
    if (as_u64(rl.rlim_cur) >= need)
        return as_u64(rl.rlim_cur);
    rlim_t want = as_u64(rl.rlim_max) >= need ? (rlim_t)need : rl.rlim_max;
    if (want > rl.rlim_cur) {
        struct rlimit raised = {want, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            rl.rlim_cur = want;
    }
    if (as_u64(rl.rlim_cur) < need)
        SL_LOGKV(SL_LOG_WARN, mod, "nofile_limited",
                 ((struct sl_log_kv[]){SL_KV_I("nofile", as_u64(rl.rlim_cur)),
                                       SL_KV_I("nofile_hard", as_u64(rl.rlim_max)),
                                       SL_KV_I("needed", need), SL_KV_S("setting", setting),
                                       SL_KV_I("value", value)}),
                 "the open-file limit is below what %s needs: connections beyond it fail; raise "
                 "the hard limit (LimitNOFILE=, ulimit -Hn) or lower the setting",
                 setting);
    return as_u64(rl.rlim_cur);
}
