/* Shared between the kernel programs (requests.bpf.c, sockops.bpf.c) and user space,
 * which mirrors these structs once, in fasterfs/bpf/events.py. Change both together. */
#ifndef FASTERFS_H
#define FASTERFS_H

#define FFS_MAX_PATH 160       /* path bytes hashed and carried in an event */
#define FFS_LINE 256           /* request-line bytes read from a packet (power of two) */
#define FFS_LAT_SLOTS 32       /* log2(microseconds) latency buckets */
#define FFS_FNV_OFFSET 0xcbf29ce484222325ULL
#define FFS_FNV_PRIME 0x100000001b3ULL

/* STALE: a write's request line was seen; COMMITTED: its response left MinIO (the write is
 * done, so a fill that began before this saw the old bytes). */
enum ffs_event_type { FFS_EVENT_HOT = 1, FFS_EVENT_STALE = 2, FFS_EVENT_COMMITTED = 3 };
/* POST: CompleteMultipartUpload (/bucket/key?uploadId=) and DeleteObjects (/bucket?delete). */
enum ffs_method { FFS_GET = 1, FFS_PUT = 2, FFS_DELETE = 3, FFS_POST = 4 };

/* Global counters (array map `counters`). */
enum ffs_counter {
    FFS_C_PACKETS = 0,     /* TCP packets with payload to or from a watched endpoint */
    FFS_C_REQUESTS,        /* object requests parsed (GET/PUT/DELETE /bucket/key) */
    FFS_C_NOT_REQUEST,     /* payload toward an endpoint that is not a request line we track */
    FFS_C_TRUNCATED,       /* request line cut short in its packet: not counted */
    FFS_C_HOT,             /* HOT events emitted */
    FFS_C_STALE,           /* stale marks (PUT/DELETE) emitted */
    FFS_C_FILLER,          /* requests of the cache filler (socket mark), skipped */
    FFS_C_RINGBUF_DROPS,   /* events lost because the ring buffer was full */
    FFS_C_RESPONSES,       /* first response packets matched to a request */
    FFS_C_COMMITS,         /* responses to writes: stale marks moved to the commit */
    FFS_C_MAX,
};

/* SOCK_OPS option slots (array map `sockopt_stats`). */
enum ffs_sockopt { FFS_OPT_NODELAY = 0, FFS_OPT_DELACK_MAX, FFS_OPT_MAX };
enum ffs_sock_counter { FFS_S_SEEN = 0, FFS_S_MATCHED, FFS_S_MAX };

struct ffs_config {
    __u64 hot_threshold;   /* GETs of one key that make it hot */
    __u32 fill_mark;       /* skb mark of the cache filler's sockets (0: none) */
    __u32 epoch;           /* bump to let every key become hot again */
    __u32 delack_max_us;   /* TCP_BPF_DELACK_MAX for MinIO connections */
    __u32 pad;
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

struct ffs_inflight {       /* a request waiting for its first response byte */
    __u64 start_ns;
    __u64 key;
    __u32 method;
    __u32 pad;
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
