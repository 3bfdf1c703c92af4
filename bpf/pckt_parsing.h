/* invoke_steer: Ethernet (+ one VLAN tag), IPv4 / IPv6 and UDP parsing.
 *
 * Policy: the program only ever drops packets it can identify as UDP to an invoke port.
 * Anything else, including malformed L2/L3 headers, passes to the kernel unchanged, which
 * has its own checks. Each helper returns ZL_PARSE_OK with `pkt` filled in, or the stats
 * reason to count (ZL_STAT_PASS_OTHER means XDP_PASS, every other reason XDP_DROP).
 */
#ifndef __PCKT_PARSING_H
#define __PCKT_PARSING_H

#include "invoke_consts.h"
#include "invoke_structs.h"
#include "invoke_maps.h"

#define ZL_PARSE_OK (-1)

static __always_inline int zl_is_invoke_port(__be16 dport)
{
	__u16 port = zl_ntohs(dport);
	return zl_ports.lookup(&port) != NULL;
}

/* The UDP length checks shared by IPv4 and IPv6. `l3_room` is how many bytes the IP header
 * declares after itself (IPv4 tot_len - ihl*4, IPv6 payload_len), `frame_room` how many the
 * frame really has after the UDP header's start; a UDP length beyond either is truncation. */
static __always_inline int zl_parse_udp(struct udphdr *udph, __u32 l3_room, __u32 frame_room,
					struct zl_pkt *pkt)
{
	__u32 udp_len = zl_ntohs(udph->len);

	if (udp_len > l3_room || udp_len > frame_room)
		return ZL_STAT_DROP_TRUNCATED;
	if (udp_len < sizeof(*udph) + ZL_COMMON_LEN)
		return ZL_STAT_DROP_TRUNCATED;
	pkt->payload = (void *)(udph + 1);
	pkt->payload_len = udp_len - sizeof(*udph);
	return ZL_PARSE_OK;
}

static __always_inline int zl_parse_ipv4(void *data, void *data_end, __u32 frame_len,
					 __u32 off, struct zl_pkt *pkt)
{
	struct iphdr *iph = data + off;
	struct udphdr *udph;
	__u32 ihl_bytes, tot_len, frag;

	if ((void *)(iph + 1) > data_end)
		return ZL_STAT_PASS_OTHER;
	if (iph->version != 4 || iph->ihl < 5 || iph->protocol != ZL_IPPROTO_UDP)
		return ZL_STAT_PASS_OTHER;
	frag = zl_ntohs(iph->frag_off);
	/* A non-first fragment has no UDP header, so its port is unknown: the kernel gets it,
	 * and its reassembly times out because the first fragment (below) never arrives. */
	if (frag & ZL_IP_OFFMASK)
		return ZL_STAT_PASS_OTHER;
	ihl_bytes = (iph->ihl & 0xF) * 4;   /* 20..60: a bounded variable offset */
	udph = (void *)iph + ihl_bytes;
	if ((void *)(udph + 1) > data_end)
		return ZL_STAT_PASS_OTHER;
	if (!zl_is_invoke_port(udph->dest))
		return ZL_STAT_PASS_OTHER;
	/* Ours from here on. An invoke datagram (<= 1400 B) is never fragmented. IPv4 options
	 * are legal (RFC 791) and carry nothing we need: they are stepped over, like the
	 * kernel does, and the reply goes back without them (daemon/carriers/xdp_frames.py). */
	if (frag & ZL_IP_MF)
		return ZL_STAT_DROP_IP_FRAGMENT;
	tot_len = zl_ntohs(iph->tot_len);
	if (tot_len < ihl_bytes || off + tot_len > frame_len)
		return ZL_STAT_DROP_TRUNCATED;
	pkt->src[0] = 0;
	pkt->src[1] = 0;
	pkt->src[2] = 0xFFFF0000u;  /* ::ffff:0:0/96 in memory order (bytes 00 00 ff ff) */
	pkt->src[3] = iph->saddr;
	return zl_parse_udp(udph, tot_len - ihl_bytes, frame_len - off - ihl_bytes, pkt);
}

static __always_inline int zl_parse_ipv6(void *data, void *data_end, __u32 frame_len,
					 __u32 off, struct zl_pkt *pkt)
{
	struct ipv6hdr *ip6h = data + off;
	struct udphdr *udph;
	__u32 room;

	if ((void *)(ip6h + 1) > data_end)
		return ZL_STAT_PASS_OTHER;
	if (ip6h->version != 6)
		return ZL_STAT_PASS_OTHER;
	room = zl_ntohs(ip6h->payload_len);
	udph = (void *)(ip6h + 1);
	if (ip6h->nexthdr == ZL_IPV6_FRAG) {
		/* Only the first fragment shows the port; to an invoke port it is dropped like an
		 * IPv4 fragment. Other extension headers are not walked: those packets pass. */
		struct zl_ip6_frag *fh = (void *)(ip6h + 1);

		if ((void *)(fh + 1) > data_end)
			return ZL_STAT_PASS_OTHER;
		if (fh->nexthdr != ZL_IPPROTO_UDP || (zl_ntohs(fh->frag_off) & ZL_IP6_OFFMASK))
			return ZL_STAT_PASS_OTHER;
		udph = (void *)(fh + 1);
		if ((void *)(udph + 1) > data_end)
			return ZL_STAT_PASS_OTHER;
		return zl_is_invoke_port(udph->dest) ? ZL_STAT_DROP_IP_FRAGMENT : ZL_STAT_PASS_OTHER;
	}
	if (ip6h->nexthdr != ZL_IPPROTO_UDP)
		return ZL_STAT_PASS_OTHER;
	if ((void *)(udph + 1) > data_end)
		return ZL_STAT_PASS_OTHER;
	if (!zl_is_invoke_port(udph->dest))
		return ZL_STAT_PASS_OTHER;
	if (off + sizeof(*ip6h) + room > frame_len)
		return ZL_STAT_DROP_TRUNCATED;
	__builtin_memcpy(pkt->src, &ip6h->saddr, sizeof(pkt->src));
	return zl_parse_udp(udph, room, frame_len - off - sizeof(*ip6h), pkt);
}

/* Ethernet, then at most one 802.1Q/802.1ad tag, then IPv4 or IPv6. */
static __always_inline int zl_parse_eth(void *data, void *data_end, __u32 frame_len,
					struct zl_pkt *pkt)
{
	struct ethhdr *eth = data;
	__u32 off = sizeof(*eth);
	__u16 proto;

	if ((void *)(eth + 1) > data_end)
		return ZL_STAT_PASS_OTHER;
	proto = zl_ntohs(eth->h_proto);
	if (proto == ZL_ETH_P_8021Q || proto == ZL_ETH_P_8021AD) {
		struct zl_vlan_hdr *vh = data + off;

		if ((void *)(vh + 1) > data_end)
			return ZL_STAT_PASS_OTHER;
		proto = zl_ntohs(vh->encap_proto);
		off += sizeof(*vh);
	}
	if (proto == ZL_ETH_P_IP)
		return zl_parse_ipv4(data, data_end, frame_len, off, pkt);
	if (proto == ZL_ETH_P_IPV6)
		return zl_parse_ipv6(data, data_end, frame_len, off, pkt);
	return ZL_STAT_PASS_OTHER;
}

#endif /* __PCKT_PARSING_H */
