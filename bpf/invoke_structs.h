/* invoke_steer: on-wire layouts and map value types. */
#ifndef __INVOKE_STRUCTS_H
#define __INVOKE_STRUCTS_H

/* 802.1Q / 802.1ad tag, after the MAC addresses. */
struct zl_vlan_hdr {
	__be16 tci;
	__be16 encap_proto;
};

/* IPv6 fragment extension header (RFC 8200 §4.5). */
struct zl_ip6_frag {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 ident;
};

/* docs/PROTOCOL.md §2: the common header, little-endian, at the start of the UDP payload. */
struct zl_common_hdr {
	__u32 magic;
	__u8  version;
	__u8  type;
	__u16 header_len;
	__u16 datagram_len;
	__u16 flags;
	__u32 key_id;
	__u8  request_id[16];
};

/* §4.1: the INVOKE fragment header, right after the common header. */
struct zl_invoke_hdr {
	struct zl_common_hdr c;
	__u64 timestamp_us;
	__u8  nonce[32];
	__u8  body_sha256[32];
	__u32 total_len;
	__u16 frag_index;
	__u16 frag_count;
	__u16 chunk_len;
	__u16 reserved;
};

/* §4.2: the control header (CANCEL, RESEND, PING), right after the common header. */
struct zl_control_hdr {
	struct zl_common_hdr c;
	__u64 timestamp_us;
	__u8  nonce[32];
	__u32 arg;              /* RESEND: from_seq; zero for CANCEL and PING */
	__u32 reserved;
};

/* What the parser hands to the checks: where the datagram is and where it came from. */
struct zl_pkt {
	void *payload;          /* first byte of the UDP payload */
	__u32 payload_len;      /* from the UDP length field (checked against the packet) */
	__u32 src[4];           /* source address; IPv4 as ::ffff:a.b.c.d */
};

/* Rate limiter configuration: array entry ZL_RATE_PER_SOURCE (each source address's bucket)
 * and ZL_RATE_UNTAGGED (one bucket per CPU that every untagged request draws on). rate_pps
 * = 0 turns that limiter off. */
struct zl_rate_cfg {
	__u32 rate_pps;         /* sustained datagrams per second */
	__u32 burst;            /* bucket depth in datagrams (0 counts as 1) */
};

/* A bucket's state: GCRA's theoretical arrival time, equivalent to a token bucket. */
struct zl_rate_state {
	__u64 tat_ns;
};

struct zl_src_key {
	__u32 addr[4];
};

/* zl_keys value: a key id's SipHash key (docs/PROTOCOL.md §6.6), and while its secret is
 * being replaced the previous one, which verifies too until the daemon has switched.
 * `retired`: the keys file no longer has the id, but a request admitted under it still runs,
 * so its CANCEL and RESEND are honoured (§6.1) while new INVOKEs and PINGs are not. */
struct zl_tag_key {
	__u64 k0;
	__u64 k1;
	__u64 prev_k0;
	__u64 prev_k1;
	__u32 has_prev;
	__u32 retired;
};

/* zl_auth_cfg entry 0, written by the daemon (invoke_auth.h). All zero: no checks. */
struct zl_auth_cfg {
	__u64 clock_offset_ns;  /* CLOCK_REALTIME - CLOCK_MONOTONIC (bpf_ktime_get_ns), in ns */
	__u64 skew_us;          /* timestamps further than this from now are dropped; 0 = off */
	__u32 flags;            /* ZL_AUTH_KEYS | ZL_AUTH_REQUIRE_TAG */
	__u32 pad;
};

#endif /* __INVOKE_STRUCTS_H */
