/* invoke_steer: the protocol checks of docs/PROTOCOL.md §10, in protocol/wire.py's order
 * (_parse_common, then parse_request): every fixed header field the daemon's structural
 * parser checks, so that whatever this redirects, the daemon parses (tests/test_xdp_prog.py
 * checks it on random and mutated frames). The one exception is stricter here: total_len
 * over 1 MiB is dropped (the daemon answers PAYLOAD_TOO_LARGE). Fixed offsets, no key, no
 * division, no state. Returns ZL_PARSE_OK or the drop reason.
 */
#ifndef __INVOKE_VALIDATE_H
#define __INVOKE_VALIDATE_H

#include "zl_wire_consts.h"
#include "invoke_consts.h"
#include "invoke_structs.h"

static __always_inline int zl_validate_control(struct zl_control_hdr *h)
{
	if (h->reserved != 0)
		return ZL_STAT_DROP_BAD_FIELD;
	if (h->c.type != ZL_TYPE_RESEND && h->arg != 0)
		return ZL_STAT_DROP_BAD_FIELD;
	return ZL_PARSE_OK;
}

static __always_inline int zl_validate_invoke(struct zl_invoke_hdr *h, __u32 n)
{
	if (h->reserved != 0)
		return ZL_STAT_DROP_BAD_FIELD;
#if ZL_VALIDATE_FRAGMENT
	__u32 chunk = h->chunk_len;
	__u32 total = h->total_len;
	__u32 count = h->frag_count;
	__u32 index = h->frag_index;
	__u32 rest, expect;

	/* Products fit in u32: count <= 65535 and chunk <= 1252 once checked. */
	if (chunk < ZL_MIN_CHUNK || chunk > ZL_MAX_CHUNK)
		return ZL_STAT_DROP_BAD_FRAGMENT;
	if (total < ZL_PARAMS_LEN || total > ZL_MAX_MESSAGE)
		return ZL_STAT_DROP_BAD_FRAGMENT;
	/* (count - 1) * chunk < total <= count * chunk, written without division. */
	if (count == 0 || (count - 1) * chunk >= total || total > count * chunk)
		return ZL_STAT_DROP_BAD_FRAGMENT;
	if (index >= count)
		return ZL_STAT_DROP_BAD_FRAGMENT;
	/* index < count makes index * chunk < total, so `rest` cannot underflow. */
	rest = total - index * chunk;
	expect = rest < chunk ? rest : chunk;
	if (n - ZL_HLEN_INVOKE - ZL_TAG_LEN != expect)
		return ZL_STAT_DROP_BAD_FRAGMENT;
#endif
	return ZL_PARSE_OK;
}

/* `payload` is the UDP payload, `n` its length from the UDP header (already known to fit
 * in the frame and to be at least ZL_COMMON_LEN). */
static __always_inline int zl_validate(void *payload, __u32 n, void *data_end)
{
	struct zl_common_hdr *c = payload;
	__u32 hlen;

	if ((void *)(c + 1) > data_end)
		return ZL_STAT_DROP_TRUNCATED;
	if (c->magic != ZL_MAGIC)
		return ZL_STAT_DROP_BAD_MAGIC;
	if (c->version != ZL_VERSION)
		return ZL_STAT_DROP_BAD_VERSION;
	if (c->type == 0 || c->type > ZL_TYPE_MAX_REQUEST)
		return ZL_STAT_DROP_BAD_TYPE;
	if (c->datagram_len != n || n > ZL_MAX_DATAGRAM)
		return ZL_STAT_DROP_BAD_LENGTH;
	hlen = c->type == ZL_TYPE_INVOKE ? ZL_HLEN_INVOKE : ZL_HLEN_CONTROL;
	if (c->header_len != hlen || hlen + ZL_TAG_LEN > n)
		return ZL_STAT_DROP_BAD_HEADER_LEN;
	if (c->flags & ~ZL_FLAG_XDP_TAG)
		return ZL_STAT_DROP_BAD_FLAGS;
	if (c->type != ZL_TYPE_INVOKE) {
		if (n != ZL_CONTROL_DGRAM)
			return ZL_STAT_DROP_BAD_LENGTH;
		if (payload + sizeof(struct zl_control_hdr) > data_end)
			return ZL_STAT_DROP_TRUNCATED;
		return zl_validate_control(payload);
	}
	if (payload + sizeof(struct zl_invoke_hdr) > data_end)
		return ZL_STAT_DROP_TRUNCATED;
	return zl_validate_invoke(payload, n);
}

#endif /* __INVOKE_VALIDATE_H */
