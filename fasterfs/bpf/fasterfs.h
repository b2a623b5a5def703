/* Shared between the kernel programs (requests.bpf.c, sockops.bpf.c) and user space,
 * which mirrors these structs once, in fasterfs/bpf/events.py. Change both together. */
#ifndef FASTERFS_H
#define FASTERFS_H

#define FFS_MAX_PATH 160       /* path bytes hashed and carried in an event */
#define FFS_LINE 256           /* request-line bytes read from a packet (power of two) */
#define FFS_LAT_SLOTS 32       /* log2(microseconds) latency buckets */
#define FFS_FNV_OFFSET 0xcbf29ce484222325ULL
#define FFS_FNV_PRIME 0x100000001b3ULL
/* Sizes set from the configuration (kernel.stale_marks, kernel.ring_pages, kernel.count_keys,
 * kernel.seen_bits) at load. */
#ifndef FFS_KEY_COUNTS
#define FFS_KEY_COUNTS 262144  /* keys whose GETs are counted (an LRU: past it, the least recent go) */
#endif
#ifndef FFS_STALE_MARKS
#define FFS_STALE_MARKS 65536  /* keys whose last write is remembered */
#endif
#ifndef FFS_RING_PAGES
#define FFS_RING_PAGES 64      /* the event ring buffer, in pages (a power of two) */
#endif
#ifndef FFS_SEEN_WORDS
#define FFS_SEEN_WORDS 262144  /* the second-chance filter, in 64-bit words per generation (a power
                                  of two; 0: none) */
#endif

/* Both are sent when MinIO answers 2xx, never on the request alone: MinIO authenticates first.
 * HOT: a key's successful GETs reached the threshold; STALE: a write of it was accepted (a fill
 * that began before this may hold the old bytes). */
enum ffs_event_type { FFS_EVENT_HOT = 1, FFS_EVENT_STALE = 2 };
/* POST: CompleteMultipartUpload (/bucket/key?uploadId=) and DeleteObjects (/bucket?delete). */
enum ffs_method { FFS_GET = 1, FFS_PUT = 2, FFS_DELETE = 3, FFS_POST = 4 };

/* Global counters (array map `counters`). */
enum ffs_counter {
    FFS_C_PACKETS = 0,     /* TCP packets with payload to or from a watched endpoint */
    FFS_C_REQUESTS,        /* object requests parsed (GET/PUT/DELETE /bucket/key) */
    FFS_C_NOT_REQUEST,     /* payload toward an endpoint that is not a request line we track */
    FFS_C_TRUNCATED,       /* request line cut short in its packet: not counted */
    FFS_C_HOT,             /* HOT events emitted */
    FFS_C_STALE,           /* stale marks of accepted writes (PUT, DELETE, POST answered 2xx) */
    FFS_C_FILLER,          /* requests of the cache filler (socket mark), skipped */
    FFS_C_RINGBUF_DROPS,   /* events lost because the ring buffer was full */
    FFS_C_RESPONSES,       /* final response lines matched to a request */
    FFS_C_COMMITS,         /* writes MinIO answered 2xx */
    FFS_C_REFUSED,         /* requests MinIO did not answer 2xx (unauthenticated, missing...): ignored */
    FFS_C_MARKS_FULL,      /* accepted writes whose key found the stale-mark map full */
    FFS_C_SUSPECT,         /* times the suspect key was marked: a write not marked under its own key */
    FFS_C_PIPELINED,       /* client payload while an answer is awaited (a body, or pipelined): not parsed */
    FFS_C_KEYS_NEW,        /* keys that got a count entry (first counted, or again after theirs went) */
    FFS_C_SECOND_CHANCE,   /* of those, keys the second-chance filter had seen: started at one GET */
    FFS_C_SEEN_SET,        /* bits set in the filter (user space ages it by this count) */
    FFS_C_MAX,
};

/* SOCK_OPS option slots (array map `sockopt_stats`). */
enum ffs_sockopt { FFS_OPT_NODELAY = 0, FFS_OPT_DELACK_MAX, FFS_OPT_MAX };
enum ffs_sock_counter { FFS_S_SEEN = 0, FFS_S_MATCHED, FFS_S_MAX };

struct ffs_config {
    __u64 hot_threshold;   /* GETs of one key that make it hot */
    /* The cluster bucket's key (FNV-1a of "/bucket"), present in stale_keys from load on. Marked
     * for a write no reader could see under its own key: a STALE event lost to a full ring, a
     * key that found the map full, a multi-object delete. Every entry fetched before it is
     * suspect until user space has checked the entries and set it back to 0. */
    __u64 suspect_key;
    __u32 fill_mark;       /* skb mark of the cache filler's sockets (0: none) */
    __u32 epoch;           /* bump to let every key become hot again */
    __u32 delack_max_us;   /* TCP_BPF_DELACK_MAX for MinIO connections */
    __u32 seen_gen;        /* the second-chance filter's current generation (0 or 1) */
};

/* A MinIO endpoint to watch: IPv4 address in addr[0] or IPv6 in addr[0..3], network
 * order; all-zero address matches any address on that port. Port in host order. */
struct ffs_endpoint {
    __u32 addr[4];
    __u16 port;
    __u16 pad;
};

struct ffs_key_stat {
    __u64 count;           /* GETs in the current epoch */
    __u64 last_ns;
    __u32 epoch;
    __u32 pad;
};

struct ffs_port_stats {
    __u64 requests;
    __u64 gets;
    __u64 puts;
    __u64 deletes;
    __u64 lat_sum_ns;
    __u64 lat_count;
};

struct ffs_lat_key {
    __u16 port;
    __u16 slot;
};

struct ffs_conn {           /* client -> server direction */
    __u32 caddr[4];
    __u32 saddr[4];
    __u16 cport;
    __u16 sport;
};

struct ffs_inflight {       /* a request waiting for its final response line */
    __u64 start_ns;
    __u64 key;
    __u32 method;
    __u32 path_len;
    char path[FFS_MAX_PATH]; /* for the event sent when MinIO answers */
};

struct ffs_opt_stats {
    __u64 ok;
    __u64 fail;
    __s64 last_error;
};

struct ffs_event {
    __u64 ts_ns;
    __u64 key;             /* FNV-1a 64 of the path */
    __u64 count;
    __u32 type;            /* enum ffs_event_type */
    __u16 port;
    __u16 path_len;        /* bytes hashed (<= FFS_MAX_PATH) */
    __u32 method;          /* enum ffs_method */
    __u32 pad;
    char path[FFS_MAX_PATH];
};

#endif
