/* invoke_steer: what can be checked of a request's authenticity in the kernel, in the
 * daemon's order (daemon/ingress.py, docs/PROTOCOL.md §6.5, §10): key id known, XDP tag, then
 * the timestamp window. The daemon stays the authority: each check here drops only what it
 * would refuse anyway, with the same error class (bpf/loader.py REASON_ERROR), and the daemon
 * turns them on by filling zl_auth_cfg (all zero: nothing here is checked).
 *
 * - Key id (ZL_AUTH_KEYS): zl_keys holds every key id of the daemon's keys file, and, marked
 *   retired, the ids a rotation removed while requests admitted under them still run (the
 *   daemon honours their CANCEL and RESEND, §6.1, and drops the entry when the last one
 *   ends). A request under an id not held is UNKNOWN_KEY; an INVOKE or PING under a retired
 *   one too.
 * - XDP tag (flag XDP_TAG): SipHash-2-4 of the first 64 bytes (datagram_len zeroed) under
 *   the key id's derived key, against the u64 at offset 64. While a key id's secret is being
 *   replaced its entry holds the old key too, and either verifies (no window in which a
 *   datagram the daemon accepts is dropped here). Without the flag the request passes to the
 *   daemon, unless ZL_AUTH_REQUIRE_TAG (the daemon then refuses it the same way).
 * - Timestamp, of a tagged request whose tag verified: |timestamp_us - now| beyond skew_us,
 *   where now is bpf_ktime_get_ns() (the monotonic clock) plus the wall-clock offset the
 *   daemon publishes and refreshes. skew_us is the daemon's ±300 s plus a margin for the
 *   offset's age, so the kernel is never stricter than the daemon; 0 turns the check off.
 *   Only a verified tag makes the timestamp a key holder's: the daemon checks the HMAC
 *   before the timestamp, so an untagged stale datagram may be a forgery it would count as
 *   INVALID_SIGNATURE, and is left to it. (A stranger gains nothing from a stale timestamp
 *   anyway: a fresh one costs the same.)
 */
#ifndef __INVOKE_AUTH_H
#define __INVOKE_AUTH_H

#include "zl_wire_consts.h"
#include "invoke_consts.h"
#include "invoke_structs.h"
#include "invoke_maps.h"
#include "siphash.h"

static __always_inline int zl_tag_ok(const __u64 *m, __u64 tag, struct zl_tag_key *k)
{
	if (zl_siphash24_64(m, k->k0, k->k1) == tag)
		return 1;
	return k->has_prev && zl_siphash24_64(m, k->prev_k0, k->prev_k1) == tag;
}

static __always_inline int zl_authenticate(void *payload, void *data_end)
{
#if ZL_AUTH
	struct zl_common_hdr *c = payload;
	__u64 *w = payload;
	struct zl_auth_cfg *cfg;
	struct zl_tag_key *key;
	__u64 m[ZL_SIP_WORDS];
	__u64 ts, now_us, d;
	__u32 zero = 0, key_id;
	int i;

	/* zl_validate checked this much; the verifier wants it shown again here. */
	if (payload + ZL_XDP_TAG_OFF + ZL_XDP_TAG_LEN > data_end)
		return ZL_STAT_DROP_TRUNCATED;
	cfg = zl_auth_cfg.lookup(&zero);
	if (!cfg)
		return ZL_PARSE_OK;
	key_id = c->key_id;
	key = zl_keys.lookup(&key_id);
	if (!key)
		return cfg->flags & ZL_AUTH_KEYS ? ZL_STAT_DROP_UNKNOWN_KEY : ZL_PARSE_OK;
	if (key->retired && (c->type == ZL_TYPE_INVOKE || c->type == ZL_TYPE_PING))
		return ZL_STAT_DROP_UNKNOWN_KEY;
	if (!(c->flags & ZL_FLAG_XDP_TAG))
		return cfg->flags & ZL_AUTH_REQUIRE_TAG ? ZL_STAT_DROP_UNTAGGED : ZL_PARSE_OK;
#pragma unroll
	for (i = 0; i < ZL_SIP_WORDS; i++)
		m[i] = w[i];
	m[1] &= ~0xFFFFULL;   /* datagram_len: differs between fragments, not covered */
	if (!zl_tag_ok(m, w[ZL_SIP_WORDS], key))
		return ZL_STAT_DROP_BAD_TAG;
	if (cfg->skew_us) {
		ts = w[4];   /* timestamp_us at offset 32, INVOKE and control alike */
		now_us = (bpf_ktime_get_ns() + cfg->clock_offset_ns) / 1000;
		d = ts > now_us ? ts - now_us : now_us - ts;
		if (d > cfg->skew_us)
			return ZL_STAT_DROP_STALE_TIMESTAMP;
	}
#endif
	return ZL_PARSE_OK;
}

#endif /* __INVOKE_AUTH_H */
