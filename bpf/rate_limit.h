/* invoke_steer: per-source rate limit, a token bucket kept as GCRA state.
 *
 * GCRA (the "virtual scheduling" form of a token bucket) needs one u64 per source, the
 * theoretical arrival time `tat`: each admitted datagram pushes it one emission interval
 * (1 s / rate) into the future, and a datagram is refused when `tat` is more than
 * (burst - 1) intervals ahead of now. That admits `burst` back to back, then `rate` per second.
 *
 * The state lives in an LRU hash shared by all CPUs; the read-modify-write is not atomic, so
 * two CPUs racing on one source can each admit a datagram the other would have charged.
 * RSS keeps a source on one queue in practice; the error is one datagram per race, toward
 * admitting.
 */
#ifndef __RATE_LIMIT_H
#define __RATE_LIMIT_H

#include "invoke_consts.h"
#include "invoke_structs.h"
#include "invoke_maps.h"

/* 1 = admit, 0 = over budget. */
static __always_inline int zl_rate_admit(struct zl_pkt *pkt)
{
#if ZL_RATE_LIMIT
	struct zl_rate_cfg *cfg;
	struct zl_rate_state *st, fresh = {};
	struct zl_src_key key = {};
	__u64 now, interval, tolerance, tat;
	__u32 zero = 0, burst;

	cfg = zl_rate_cfg.lookup(&zero);
	if (!cfg || cfg->rate_pps == 0)
		return 1;
	interval = ZL_NSEC_PER_SEC / cfg->rate_pps;
	burst = cfg->burst ? cfg->burst : 1;
	tolerance = interval * (burst - 1);
	now = bpf_ktime_get_ns();
	__builtin_memcpy(key.addr, pkt->src, sizeof(key.addr));

	st = zl_rate_state.lookup(&key);
	if (!st) {
		fresh.tat_ns = now + interval;
		zl_rate_state.update(&key, &fresh);
		return 1;
	}
	tat = st->tat_ns > now ? st->tat_ns : now;
	if (tat - now > tolerance)
		return 0;
	st->tat_ns = tat + interval;
#endif
	return 1;
}

#endif /* __RATE_LIMIT_H */
