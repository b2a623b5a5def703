/* SOCK_OPS program: on every established connection to or from a MinIO port in its
 * cgroup, sets TCP_NODELAY and caps the delayed-ACK timer with TCP_BPF_DELACK_MAX.
 * TCP_QUICKACK cannot be set from BPF (the kernel answers -EINVAL), so it is not tried.
 * Each option's successes and failures are counted; a failure is never hidden. */
#include <uapi/linux/bpf.h>
#include "fasterfs.h"

#define FFS_SOL_TCP 6
#define FFS_TCP_NODELAY 1
#define FFS_TCP_BPF_DELACK_MAX 1003

BPF_HASH(tune_ports, u16, u8, 256);
BPF_ARRAY(sockopt_stats, struct ffs_opt_stats, FFS_OPT_MAX);
BPF_ARRAY(sock_counters, u64, FFS_S_MAX);

static __always_inline void sock_bump(u32 idx) {
    u64 *v = sock_counters.lookup(&idx);
    if (v) __sync_fetch_and_add(v, 1);
}

static __always_inline void record(u32 opt, int rc) {
    struct ffs_opt_stats *s = sockopt_stats.lookup(&opt);
    if (!s) return;
    if (rc == 0) {
        __sync_fetch_and_add(&s->ok, 1);
    } else {
        __sync_fetch_and_add(&s->fail, 1);
        s->last_error = rc;
    }
}

int ffs_sockops(struct bpf_sock_ops *skops) {
    u32 op = skops->op;
    if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) return 1;
    sock_bump(FFS_S_SEEN);
    u16 lport = skops->local_port;
    u16 rport = bpf_ntohl(skops->remote_port);
    if (!tune_ports.lookup(&lport) && !tune_ports.lookup(&rport)) return 1;
    sock_bump(FFS_S_MATCHED);

    int one = 1;
    record(FFS_OPT_NODELAY, bpf_setsockopt(skops, FFS_SOL_TCP, FFS_TCP_NODELAY, &one, sizeof(one)));
    u32 zero = 0;
    struct ffs_config *cfg = config.lookup(&zero);
    if (cfg && cfg->delack_max_us) {
        int delack = cfg->delack_max_us;
        record(FFS_OPT_DELACK_MAX, bpf_setsockopt(skops, FFS_SOL_TCP, FFS_TCP_BPF_DELACK_MAX, &delack, sizeof(delack)));
    }
    return 1;
}
