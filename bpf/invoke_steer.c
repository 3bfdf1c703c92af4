/* invoke_steer: the XDP program of zerolayer's fast path (docs/PROTOCOL.md §10).
 *
 * For every frame on the interface:
 *   1. parse Ethernet (+ one VLAN tag), IPv4 / IPv6, UDP (pckt_parsing.h); anything that is
 *      not UDP to an invoke port (map zl_ports) passes to the kernel untouched;
 *   2. check the zerolayer header at fixed offsets (invoke_validate.h) and drop what fails;
 *   3. check what the daemon would: key id known, the XDP tag, the timestamp window
 *      (invoke_auth.h), and drop what fails, so forgeries never cost the daemon a wake-up;
 *   4. charge the source's token bucket, then, for a request without the XDP tag, the
 *      untagged requests' bucket (rate_limit.h), and drop past either budget (after 3, so
 *      forgeries from a spoofed source do not spend its budget, nor tagged ones the other);
 *   5. redirect to the AF_XDP socket of this RX queue (map zl_xsks), or XDP_PASS when the
 *      queue has none, so the daemon's UDP socket gets the datagram instead.
 * Every outcome is counted under one reason in the per-CPU array zl_stats.
 *
 * Built by BCC (bpf/loader.py), which pastes the local headers into one text; settings in
 * invoke_consts.h, overridable with -D. Only UAPI headers are included, on purpose: with
 * <linux/ip.h> and friends (kernel-internal headers) the same 404-instruction program took
 * ~4 s and ~215 MB to compile here, with <uapi/linux/...> ~0.7 s and ~140 MB.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>

#include "zl_wire_consts.h"
#include "invoke_consts.h"
#include "invoke_structs.h"
#include "invoke_maps.h"
#include "pckt_parsing.h"
#include "invoke_validate.h"
#include "invoke_auth.h"
#include "rate_limit.h"

static __always_inline void zl_count(__u32 reason)
{
	__u64 *cnt = zl_stats.lookup(&reason);

	if (cnt)
		*cnt += 1;  /* per-CPU slot: no atomic needed */
}

int invoke_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 frame_len = ctx->data_end - ctx->data;
	struct zl_pkt pkt = {};
	int rc;

	rc = zl_parse_eth(data, data_end, frame_len, &pkt);
	if (rc == ZL_PARSE_OK)
		rc = zl_validate(pkt.payload, pkt.payload_len, data_end);
	if (rc == ZL_PARSE_OK)
		rc = zl_authenticate(pkt.payload, data_end);
	if (rc != ZL_PARSE_OK) {
		zl_count(rc);
		return rc == ZL_STAT_PASS_OTHER ? XDP_PASS : XDP_DROP;
	}
	if (!zl_rate_admit(&pkt)) {
		zl_count(ZL_STAT_DROP_RATE_LIMITED);
		return XDP_DROP;
	}
	if (!zl_untagged_admit(&pkt, data_end)) {
		zl_count(ZL_STAT_DROP_UNTAGGED_BUDGET);
		return XDP_DROP;
	}
	/* Flags' low bits are the action when the queue has no socket (kernel >= 5.6). */
	rc = zl_xsks.redirect_map(ctx->rx_queue_index, XDP_PASS);
	zl_count(rc == XDP_REDIRECT ? ZL_STAT_REDIRECT : ZL_STAT_PASS_NO_XSK);
	return rc;
}
