/* TC program: watches S3 requests to MinIO endpoints and MinIO's answers. Per object key
 * (FNV-1a of the request path) it counts GETs MinIO answered 2xx and emits a HOT event on a ring
 * buffer when a key reaches the threshold; a write MinIO answered 2xx marks the key stale (the
 * time, in a map readers check on every cache hit) and emits STALE. A request MinIO refused
 * (unauthenticated, malformed) changes nothing: MinIO authenticates before it acts, so the
 * kernel waits for its verdict. It times request -> final response line too. It never changes a
 * packet and always returns TC_ACT_UNSPEC, so other filters run too. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include "fasterfs.h"

#define FFS_IPPROTO_TCP 6

/* struct tcphdr as the kernel lays it out on a little-endian machine (BPF's byte order here):
 * <uapi/linux/tcp.h> itself adds 0.6 s of CPU to each compile, a third of a StorageNode's
 * kernel set-up. */
struct ffs_tcphdr {
    __u16 source;
    __u16 dest;
    __u32 seq;
    __u32 ack_seq;
    __u16 res1:4, doff:4, flags:8;  /* doff: the header's length in 32-bit words */
    __u16 window;
    __u16 check;
    __u16 urg_ptr;
};

/* Per-CPU scratch: the request line, plus the path's slash counts. The counts live in
 * map memory so the verifier treats them as unknown values instead of exploring every
 * combination of them across the loop's iterations. `req` is built here, not on the stack
 * (it carries the path). */
struct ffs_line {
    char b[FFS_LINE];
    u32 slashes;
    u32 after_second;
    u32 len;
    u32 end;
    struct ffs_inflight req;
};

BPF_ARRAY(config, struct ffs_config, 1);
BPF_HASH(endpoints, struct ffs_endpoint, u8, 256);
/* key -> its GETs in this epoch. An LRU: past FFS_KEY_COUNTS keys the least recently counted
 * go (a key then counts from 0 again); keys_new against the capacity and user space's own
 * deletions says how many went. */
BPF_TABLE("lru_hash", u64, struct ffs_key_stat, key_counts, FFS_KEY_COUNTS);
BPF_HASH(port_stats, u16, struct ffs_port_stats, 256);
BPF_HASH(latency_hist, struct ffs_lat_key, u64, 256 * FFS_LAT_SLOTS);
BPF_TABLE("lru_hash", struct ffs_conn, struct ffs_inflight, inflight, 16384);
/* key -> time of its last accepted write (CLOCK_MONOTONIC ns). Pinned, so readers check it on
 * every cache hit: an entry filled before that time is stale, even before the STALE event
 * has reached user space. A plain hash, not an LRU: a mark is never dropped to make room
 * (user space removes marks it has acted on); a write that finds the map full marks the
 * suspect key instead. */
BPF_HASH(stale_keys, u64, u64, FFS_STALE_MARKS);
BPF_PERCPU_ARRAY(scratch, struct ffs_line, 1);
BPF_ARRAY(counters, u64, FFS_C_MAX);
BPF_RINGBUF_OUTPUT(events, FFS_RING_PAGES);

static __always_inline void bump(u32 idx) {
    u64 *v = counters.lookup(&idx);
    if (v) __sync_fetch_and_add(v, 1);
}

#if FFS_SEEN_WORDS > 0
/* The second chance: one bit per key ever given a count (two generations of FFS_SEEN_WORDS
 * words), so that a key whose count the LRU let go is known again. A key new to key_counts whose
 * bit is set starts at one GET: a chunk re-read after more other chunks than the map holds still
 * becomes hot. User space ages the filter (programs.py): once the current generation has taken
 * its share of keys, the old one is zeroed and becomes the current (cfg->seen_gen). Another
 * key's bit (a false positive, about keys set / bits) makes one chunk hot at its first GET. */
BPF_ARRAY(seen, u64, 2 * FFS_SEEN_WORDS);

/* Whether `key`'s bit is set in either generation; it is set in the current one. */
static __always_inline int seen_and_set(struct ffs_config *cfg, u64 key) {
    u64 h = key ^ (key >> 29);  /* FNV-1a's low bits alone mix poorly */
    u32 word = (u32)(h >> 6) & (FFS_SEEN_WORDS - 1);
    u64 bit = 1ULL << (h & 63);
    u32 cur = (cfg->seen_gen & 1) * FFS_SEEN_WORDS + word;
    u32 old = ((cfg->seen_gen + 1) & 1) * FFS_SEEN_WORDS + word;
    u64 *c = seen.lookup(&cur);
    u64 *o = seen.lookup(&old);
    if (!c || !o) return 0;
    int was = ((*c | *o) & bit) != 0;
    if (!(*c & bit)) {
        __sync_fetch_and_or(c, bit);
        bump(FFS_C_SEEN_SET);
    }
    return was;
}
#endif

static __always_inline int watched(u32 *addr, u16 port) {
    struct ffs_endpoint ep = {};
    __builtin_memcpy(ep.addr, addr, sizeof(ep.addr));
    ep.port = port;
    if (endpoints.lookup(&ep)) return 1;
    __builtin_memset(ep.addr, 0, sizeof(ep.addr));
    return endpoints.lookup(&ep) != 0;
}

static __always_inline struct ffs_port_stats *port_entry(u16 port) {
    struct ffs_port_stats zero = {};
    return port_stats.lookup_or_try_init(&port, &zero);
}

/* A write no reader can see under its own key: every entry fetched before now is suspect
 * until user space has checked them. The counter moves first, so user space, which reads it
 * after clearing the mark, never misses a mark made after its check. */
static __always_inline void mark_suspect(struct ffs_config *cfg, u64 now) {
    bump(FFS_C_SUSPECT);
    u64 key = cfg->suspect_key;
    stale_keys.update(&key, &now);  /* present since load: succeeds in a full map */
}

static __always_inline void emit(struct ffs_config *cfg, u32 type, struct ffs_inflight *req, u64 count, u16 port,
                                 u64 now) {
    struct ffs_event *e = events.ringbuf_reserve(sizeof(struct ffs_event));
    if (!e) {
        bump(FFS_C_RINGBUF_DROPS);
        if (type == FFS_EVENT_STALE) mark_suspect(cfg, now);  /* nobody would drop the old copies */
        return;
    }
    e->ts_ns = now;
    e->key = req->key;
    e->count = count;
    e->type = type;
    e->method = req->method;
    e->port = port;
    e->path_len = req->path_len;
    e->pad = 0;
    __builtin_memcpy(e->path, req->path, FFS_MAX_PATH);
    events.ringbuf_submit(e, 0);
}

/* What the client sent, when no answer was awaited, that FasterFS does not act on (HEAD, a
 * health check, a request line cut across segments, anything) still takes the next answer: a
 * request pipelined behind it (a PUT behind an anonymous health check) never gets its 200. */
static __always_inline void wait_untracked(struct ffs_conn *conn, struct ffs_line *line) {
    struct ffs_inflight *req = &line->req;
    req->start_ns = bpf_ktime_get_ns();
    req->key = 0;
    req->method = 0;
    req->path_len = 0;
    inflight.update(conn, req);
}

/* ingress: requests arriving from other hosts, on a host's own interface. Only their
 * writes matter here (stale marks for this host's cache); their GETs are the other
 * host's to count, so this host does not cache what only others read. */
static __always_inline void on_request(struct __sk_buff *skb, struct ffs_conn *conn, u32 off, u32 paylen, u16 port,
                                       int ingress) {
    u32 zero = 0;
    struct ffs_config *cfg = config.lookup(&zero);
    struct ffs_line *line = scratch.lookup(&zero);
    if (!cfg || !line) return;
    /* One answer per request: while one is awaited, what the client sends (its body, or a
     * request pipelined behind it) is never paired with that answer. */
    if (inflight.lookup(conn)) {
        bump(FFS_C_PIPELINED);
        return;
    }

    /* At most FFS_LINE - 1 bytes; the opaque mask makes the verifier see 0 <= n < FFS_LINE
     * before the lower bound is checked, which a variable-length load needs. */
    u64 n = paylen < FFS_LINE - 1 ? paylen : FFS_LINE - 1;
    asm volatile("%[n] &= 0xff" : [n] "+r"(n));
    if (n < 6) { wait_untracked(conn, line); bump(FFS_C_NOT_REQUEST); return; }
    /* Zero first, so a short packet reads as NULs past its end, never as an earlier
     * packet's bytes. Loopback payloads sit in paged fragments: only
     * bpf_skb_load_bytes reaches them. */
    __builtin_memset(line->b, 0, FFS_LINE);
    if (bpf_skb_load_bytes(skb, off, line->b, n) < 0) {
        wait_untracked(conn, line);
        bump(FFS_C_TRUNCATED);
        return;
    }
    u32 method, start;
    if (line->b[0] == 'G' && line->b[1] == 'E' && line->b[2] == 'T' && line->b[3] == ' ') {
        method = FFS_GET; start = 4;
    } else if (line->b[0] == 'P' && line->b[1] == 'U' && line->b[2] == 'T' && line->b[3] == ' ') {
        method = FFS_PUT; start = 4;
    } else if (line->b[0] == 'P' && line->b[1] == 'O' && line->b[2] == 'S' && line->b[3] == 'T' && line->b[4] == ' ') {
        method = FFS_POST; start = 5;
    } else if (line->b[0] == 'D' && line->b[1] == 'E' && line->b[2] == 'L' && line->b[3] == 'E' &&
               line->b[4] == 'T' && line->b[5] == 'E' && line->b[6] == ' ') {
        method = FFS_DELETE; start = 7;
    } else {
        method = 0; start = 0;  /* HEAD, a request line cut in two segments, not HTTP... */
    }
    if (!method || (ingress && method == FFS_GET)) {
        wait_untracked(conn, line);
        bump(FFS_C_NOT_REQUEST);
        return;
    }
    if (cfg->fill_mark && skb->mark == cfg->fill_mark) {  /* the cache filler's own GET */
        bump(FFS_C_FILLER);
        return;
    }
    /* /bucket/key: FNV-1a up to a space or '?', over at most FFS_MAX_PATH bytes. The slash
     * counts go through volatile map memory: kept in registers, the verifier would track
     * every combination of their values across the iterations and give up. */
    volatile u32 *slashes = &line->slashes, *after_second = &line->after_second;
    volatile u32 *plen = &line->len, *pend = &line->end;  /* so every exit looks alike after the loop */
    *slashes = 0;
    *after_second = 0;
    *plen = FFS_MAX_PATH;
    *pend = 0;
    u64 h = FFS_FNV_OFFSET;
    for (u32 i = 0; i < FFS_MAX_PATH; i++) {
        char ch = line->b[(start + i) & (FFS_LINE - 1)];
        if (ch == ' ' || ch == '?' || ch == 0) { *plen = i; *pend = ch; break; }
        h ^= (u8)ch;
        h *= FFS_FNV_PRIME;
        if (ch == '/') *slashes += 1;
        else if (*slashes >= 2) *after_second += 1;
    }
    u32 len = *plen;
    if (len < FFS_MAX_PATH && *pend == 0) {  /* packet ends mid-path */
        wait_untracked(conn, line);
        bump(FFS_C_TRUNCATED);
        return;
    }
    /* a POST to the bucket itself is DeleteObjects (keys in its body): a mark on "/bucket",
     * the suspect key when it is the cluster's bucket */
    int bucket_write = method == FFS_POST && *slashes == 1;
    if (line->b[start & (FFS_LINE - 1)] != '/' || ((*slashes < 2 || *after_second == 0) && !bucket_write)) {
        wait_untracked(conn, line);
        bump(FFS_C_NOT_REQUEST);  /* bucket-level or service request, not an object */
        return;
    }
    if (line->b[(start + 1) & (FFS_LINE - 1)] == 'm' && line->b[(start + 2) & (FFS_LINE - 1)] == 'i' &&
        line->b[(start + 3) & (FFS_LINE - 1)] == 'n' && line->b[(start + 4) & (FFS_LINE - 1)] == 'i' &&
        line->b[(start + 5) & (FFS_LINE - 1)] == 'o' && line->b[(start + 6) & (FFS_LINE - 1)] == '/') {
        wait_untracked(conn, line);
        bump(FFS_C_NOT_REQUEST);  /* /minio/health/... and other admin paths */
        return;
    }
    bump(FFS_C_REQUESTS);
    /* Nothing counts or marks until MinIO answers: wait for the response line. */
    struct ffs_inflight *req = &line->req;
    req->start_ns = bpf_ktime_get_ns();
    req->key = h;
    req->method = method;
    req->path_len = len;
    /* start is 4 ("GET ", "PUT "), 5 ("POST ") or 7 ("DELETE "): constant offsets keep the copy simple */
    if (start == 4) __builtin_memcpy(req->path, &line->b[4], FFS_MAX_PATH);
    else if (start == 5) __builtin_memcpy(req->path, &line->b[5], FFS_MAX_PATH);
    else __builtin_memcpy(req->path, &line->b[7], FFS_MAX_PATH);
    inflight.update(conn, req);
}

/* MinIO accepted a write: entries fetched before now are stale. */
static __always_inline void on_write(struct ffs_config *cfg, struct ffs_inflight *req, u16 port, u64 now,
                                     struct ffs_port_stats *ps) {
    if (ps) {
        if (req->method == FFS_DELETE) __sync_fetch_and_add(&ps->deletes, 1);
        else __sync_fetch_and_add(&ps->puts, 1);  /* PUT, or POST (multipart completion, DeleteObjects) */
    }
    bump(FFS_C_COMMITS);
    u64 key = req->key;
    if (key == cfg->suspect_key) bump(FFS_C_SUSPECT);  /* a multi-object delete in the cluster's bucket */
    if (stale_keys.update(&key, &now) != 0) {
        bump(FFS_C_MARKS_FULL);
        mark_suspect(cfg, now);
    }
    bump(FFS_C_STALE);
    emit(cfg, FFS_EVENT_STALE, req, 0, port, now);
}

/* MinIO served a GET: count it toward HOT. */
static __always_inline void on_read(struct ffs_config *cfg, struct ffs_inflight *req, u16 port, u64 now,
                                    struct ffs_port_stats *ps) {
    if (ps) __sync_fetch_and_add(&ps->gets, 1);
    struct ffs_key_stat fresh = {};
    fresh.epoch = cfg->epoch;
    u64 key = req->key;
    struct ffs_key_stat *st = key_counts.lookup_or_try_init(&key, &fresh);
    if (!st) return;
    if (st->last_ns == 0) {  /* the entry just made (every GET sets last_ns) */
        bump(FFS_C_KEYS_NEW);
#if FFS_SEEN_WORDS > 0
        if (seen_and_set(cfg, key) && st->epoch == cfg->epoch) {
            bump(FFS_C_SECOND_CHANCE);
            __sync_fetch_and_add(&st->count, 1);
        }
#endif
    }
    if (st->epoch != cfg->epoch) {  /* a new epoch: every key starts cold again */
        st->epoch = cfg->epoch;
        st->count = 0;
    }
    st->last_ns = now;
    u64 count = __sync_fetch_and_add(&st->count, 1) + 1;
    if (count == cfg->hot_threshold) {  /* exactly one GET sees the threshold reached */
        bump(FFS_C_HOT);
        emit(cfg, FFS_EVENT_HOT, req, count, port, now);
    }
}

/* The first bytes MinIO sends after a request: its status line. "HTTP/1.1 100 Continue" (boto3
 * asks before a body) is not the answer yet: the request keeps waiting. */
static __always_inline void on_response(struct __sk_buff *skb, struct ffs_conn *conn, u32 off, u32 paylen,
                                        u16 port) {
    u32 zero = 0;
    struct ffs_config *cfg = config.lookup(&zero);
    struct ffs_inflight *req = inflight.lookup(conn);
    if (!cfg || !req) return;
    char st[12];
    if (paylen < sizeof(st) || bpf_skb_load_bytes(skb, off, st, sizeof(st)) < 0) return;
    if (st[0] != 'H' || st[1] != 'T' || st[2] != 'T' || st[3] != 'P' || st[4] != '/' || st[8] != ' ') return;
    if (st[9] == '1') return;
    if (!req->method) {  /* the answer to a request not acted on: it only frees the connection */
        inflight.delete(conn);
        return;
    }
    u64 now = bpf_ktime_get_ns();
    u64 delta = now - req->start_ns;
    bump(FFS_C_RESPONSES);
    struct ffs_port_stats *ps = port_entry(port);
    if (ps) {
        __sync_fetch_and_add(&ps->lat_sum_ns, delta);
        __sync_fetch_and_add(&ps->lat_count, 1);
    }
    if (st[9] != '2') bump(FFS_C_REFUSED);
    else if (req->method == FFS_GET) on_read(cfg, req, port, now, ps);
    else on_write(cfg, req, port, now, ps);
    inflight.delete(conn);  /* after the event has copied the path out of it */
    struct ffs_lat_key lk = {.port = port, .slot = bpf_log2l(delta / 1000 + 1)};
    if (lk.slot >= FFS_LAT_SLOTS) lk.slot = FFS_LAT_SLOTS - 1;
    u64 one = 1;
    u64 *v = latency_hist.lookup(&lk);
    if (v) __sync_fetch_and_add(v, 1);
    else latency_hist.update(&lk, &one);
}

static __always_inline int on_packet(struct __sk_buff *skb, int ingress) {
    u32 src[4] = {}, dst[4] = {};
    u32 l4;
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        struct iphdr ip;
        if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0) return TC_ACT_UNSPEC;
        if (ip.protocol != FFS_IPPROTO_TCP || ip.ihl < 5) return TC_ACT_UNSPEC;
        src[0] = ip.saddr;
        dst[0] = ip.daddr;
        l4 = ETH_HLEN + ip.ihl * 4;
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr ip6;
        if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0) return TC_ACT_UNSPEC;
        if (ip6.nexthdr != FFS_IPPROTO_TCP) return TC_ACT_UNSPEC;  /* extension headers: not MinIO traffic we track */
        __builtin_memcpy(src, &ip6.saddr, 16);
        __builtin_memcpy(dst, &ip6.daddr, 16);
        l4 = ETH_HLEN + sizeof(struct ipv6hdr);
    } else {
        return TC_ACT_UNSPEC;
    }
    struct ffs_tcphdr tcp;
    if (bpf_skb_load_bytes(skb, l4, &tcp, sizeof(tcp)) < 0) return TC_ACT_UNSPEC;
    if (tcp.doff < 5) return TC_ACT_UNSPEC;
    u32 off = l4 + tcp.doff * 4;
    if (skb->len <= off) return TC_ACT_UNSPEC;  /* no payload: handshake or bare ACK */
    u32 paylen = skb->len - off;
    u16 sport = bpf_ntohs(tcp.source), dport = bpf_ntohs(tcp.dest);

    struct ffs_conn conn = {};
    if (watched(dst, dport)) {
        bump(FFS_C_PACKETS);
        __builtin_memcpy(conn.caddr, src, 16);
        __builtin_memcpy(conn.saddr, dst, 16);
        conn.cport = sport;
        conn.sport = dport;
        on_request(skb, &conn, off, paylen, dport, ingress);
    } else if (watched(src, sport)) {
        bump(FFS_C_PACKETS);
        __builtin_memcpy(conn.caddr, dst, 16);
        __builtin_memcpy(conn.saddr, src, 16);
        conn.cport = dport;
        conn.sport = sport;
        on_response(skb, &conn, off, paylen, sport);
    }
    return TC_ACT_UNSPEC;
}

int ffs_tc(struct __sk_buff *skb) { return on_packet(skb, 0); }
int ffs_tc_ingress(struct __sk_buff *skb) { return on_packet(skb, 1); }
