/* invoke_steer: rate limits, token buckets kept as GCRA state.
 *
 * GCRA (the "virtual scheduling" form of a token bucket) needs one u64 per bucket, the
 * theoretical arrival time `tat`: each admitted datagram pushes it one emission interval
 * (1 s / rate) into the future, and a datagram is refused when `tat` is more than
 * (burst - 1) intervals ahead of now. That admits `burst` back to back, then `rate` per second.
 *
 * Two kinds of bucket, each with its zl_rate_cfg entry:
 * - per source address (ZL_RATE_PER_SOURCE), in an LRU hash shared by all CPUs; the
 *   read-modify-write is not atomic, so two CPUs racing on one source can each admit a
 *   datagram the other would have charged. RSS keeps a source on one queue in practice; the
 *   error is one datagram per race, toward admitting.
 * - untagged requests (ZL_RATE_UNTAGGED), one bucket per CPU: a request without the XDP tag
 *   cannot be told from a forgery here, and spoofed sources each get a fresh per-source
 *   bucket, so together they get this budget, and a flood of them costs the daemon at most
 *   that many verifications a second per receiving CPU. Tagged requests (the SDK's default)
 *   never draw on it.
 */
#ifndef __RATE_LIMIT_H
#define __RATE_LIMIT_H

#include "invoke_consts.h"
#include "invoke_structs.h"
#include "invoke_maps.h"

/* Charge one datagram to the bucket `st` under `cfg`: 1 = admit, 0 = over budget. */
static __always_inline int zl_gcra_admit(struct zl_rate_cfg *cfg, struct zl_rate_state *st,
					 __u64 now)
{
	__u64 interval = ZL_NSEC_PER_SEC / cfg->rate_pps;
	__u32 burst = cfg->burst ? cfg->burst : 1;
	__u64 tat = st->tat_ns > now ? st->tat_ns : now;

	if (tat - now > interval * (burst - 1))
		return 0;
	st->tat_ns = tat + interval;
	return 1;
}

/* The source's bucket: 1 = admit, 0 = over budget. */
static __always_inline int zl_rate_admit(struct zl_pkt *pkt)
{
#if ZL_RATE_LIMIT
	struct zl_rate_cfg *cfg;
	struct zl_rate_state *st, fresh = {};
	struct zl_src_key key = {};
	__u32 idx = ZL_RATE_PER_SOURCE;
	__u64 now;

	cfg = zl_rate_cfg.lookup(&idx);
	if (!cfg || cfg->rate_pps == 0)
		return 1;
	now = bpf_ktime_get_ns();
	__builtin_memcpy(key.addr, pkt->src, sizeof(key.addr));

	st = zl_rate_state.lookup(&key);
	if (!st) {
		fresh.tat_ns = now + ZL_NSEC_PER_SEC / cfg->rate_pps;
		zl_rate_state.update(&key, &fresh);
		return 1;
	}
	return zl_gcra_admit(cfg, st, now);
#else
	return 1;
#endif
}

/* The untagged requests' bucket, for a datagram zl_validate passed: 1 = admit (or tagged),
 * 0 = over budget. */
static __always_inline int zl_untagged_admit(struct zl_pkt *pkt, void *data_end)
{
#if ZL_RATE_LIMIT
	struct zl_common_hdr *c = pkt->payload;
	struct zl_rate_cfg *cfg;
	struct zl_rate_state *st;
	__u32 idx = ZL_RATE_UNTAGGED, zero = 0;

	/* zl_validate checked this much; the verifier wants it shown again here. */
	if ((void *)(c + 1) > data_end || c->flags & ZL_FLAG_XDP_TAG)
		return 1;
	cfg = zl_rate_cfg.lookup(&idx);
	if (!cfg || cfg->rate_pps == 0)
		return 1;
	st = zl_untagged_state.lookup(&zero);
	if (!st)
		return 1;
	return zl_gcra_admit(cfg, st, bpf_ktime_get_ns());
#else
	return 1;
#endif
}

#endif /* __RATE_LIMIT_H */
