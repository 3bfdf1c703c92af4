/* invoke_steer: compile-time settings and the stats index.
 *
 * Every setting is a default that `-DNAME=value` overrides (bpf/loader.py passes them as
 * cflags). The stats reasons are the per-CPU array's indices; bpf/loader.py's REASONS lists
 * the same names in the same order (a test checks it).
 */
#ifndef __INVOKE_CONSTS_H
#define __INVOKE_CONSTS_H

#ifndef ZL_MAX_PORTS
#define ZL_MAX_PORTS        16           /* entries of the invoke port set */
#endif
#ifndef ZL_MAX_QUEUES
#define ZL_MAX_QUEUES       64           /* XSKMAP size: RX queues that can have a socket */
#endif
#ifndef ZL_RATE_SOURCES
#define ZL_RATE_SOURCES     65536        /* LRU entries of the per-source token buckets */
#endif
#ifndef ZL_RATE_LIMIT
#define ZL_RATE_LIMIT       1            /* 0 compiles the rate limiters out */
#endif
#ifndef ZL_VALIDATE_FRAGMENT
#define ZL_VALIDATE_FRAGMENT 1           /* 0 skips the INVOKE fragment arithmetic */
#endif
#ifndef ZL_MAX_KEYS
#define ZL_MAX_KEYS         4096         /* key ids of the keys file the kernel can hold */
#endif
#ifndef ZL_AUTH
#define ZL_AUTH             1            /* 0 compiles the key, tag and timestamp checks out */
#endif

/* zl_rate_cfg entries (rate_limit.h). */
#define ZL_RATE_PER_SOURCE  0            /* each source address's bucket */
#define ZL_RATE_UNTAGGED    1            /* the untagged requests' bucket, per CPU */
#define ZL_RATE_CFGS        2

/* zl_auth_cfg.flags: which of invoke_auth.h's checks the daemon turned on. */
#define ZL_AUTH_KEYS        1            /* zl_keys is complete: other key ids are unknown */
#define ZL_AUTH_REQUIRE_TAG 2            /* a request without the XDP tag is refused */

/* Stats: one u64 packet counter per reason, per CPU. Order is ABI (loader.REASONS). */
enum zl_stat {
	ZL_STAT_PASS_OTHER = 0,      /* not UDP to an invoke port: left to the kernel */
	ZL_STAT_REDIRECT,            /* valid request, redirected to the queue's AF_XDP socket */
	ZL_STAT_PASS_NO_XSK,         /* valid request, no socket on this queue: UDP path */
	ZL_STAT_DROP_TRUNCATED,      /* headers or payload shorter than declared / than 32 B */
	ZL_STAT_DROP_IP_FRAGMENT,    /* first IP fragment to an invoke port (invokes never fragment) */
	ZL_STAT_DROP_BAD_MAGIC,
	ZL_STAT_DROP_BAD_VERSION,
	ZL_STAT_DROP_BAD_TYPE,       /* not a request type (0x01..0x04) */
	ZL_STAT_DROP_BAD_LENGTH,     /* datagram_len != UDP payload, > 1400, or control != 112 */
	ZL_STAT_DROP_BAD_HEADER_LEN, /* header_len wrong for the type, or no room for the tag */
	ZL_STAT_DROP_BAD_FLAGS,      /* request flags != 0 */
	ZL_STAT_DROP_BAD_FRAGMENT,   /* INVOKE chunk/total/count/index/body inconsistent */
	ZL_STAT_DROP_BAD_FIELD,      /* a reserved field, or a CANCEL/PING arg, not zero */
	ZL_STAT_DROP_RATE_LIMITED,   /* per-source token bucket empty */
	ZL_STAT_DROP_UNKNOWN_KEY,    /* key id not held (or retired, for an INVOKE or PING) */
	ZL_STAT_DROP_BAD_TAG,        /* XDP tag wrong under its key id's derived key */
	ZL_STAT_DROP_UNTAGGED,       /* no XDP tag, and the daemon requires one */
	ZL_STAT_DROP_STALE_TIMESTAMP, /* timestamp outside the daemon's window */
	ZL_STAT_DROP_UNTAGGED_BUDGET, /* no XDP tag, and the untagged requests' bucket is empty */
	ZL_STAT_MAX,
};

/* Network byte order helpers (BPF targets here are little-endian, like the wire format). */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "invoke_steer assumes a little-endian target"
#endif
#define zl_ntohs(x) __builtin_bswap16(x)
#define zl_htons(x) __builtin_bswap16(x)

#define ZL_ETH_P_IP     0x0800
#define ZL_ETH_P_IPV6   0x86DD
#define ZL_ETH_P_8021Q  0x8100
#define ZL_ETH_P_8021AD 0x88A8
#define ZL_IPPROTO_UDP  17
#define ZL_IPV6_FRAG    44          /* IPv6 fragment extension header */
#define ZL_IP_MF        0x2000      /* IPv4 "more fragments", host order */
#define ZL_IP_OFFMASK   0x1FFF
#define ZL_IP6_OFFMASK  0xFFF8      /* IPv6 fragment offset bits, host order */

#define ZL_NSEC_PER_SEC 1000000000ULL

#endif /* __INVOKE_CONSTS_H */
