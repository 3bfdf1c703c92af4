/* Wire protocol v1 constants the XDP program needs (docs/PROTOCOL.md §2-§4, §10).
 *
 * A copy, not an include: bpf/ never depends on daemon/. tests/test_xdp_prog.py checks that
 * every value here equals daemon/wire.py's, and that bpf/loader.py's Python mirror equals
 * both. Change all three together (and bump ZL_VERSION with the protocol).
 */
#ifndef __ZL_WIRE_CONSTS_H
#define __ZL_WIRE_CONSTS_H

#define ZL_MAGIC            0x52594C5Au  /* "ZLYR" read as a little-endian u32 */
#define ZL_VERSION          1
#define ZL_COMMON_LEN       32           /* the fixed header every datagram starts with */
#define ZL_TAG_LEN          32           /* HMAC-SHA256 tag at the end of every datagram */
#define ZL_MAX_DATAGRAM     1400         /* UDP payload bytes, tag included */

#define ZL_TYPE_INVOKE      0x01
#define ZL_TYPE_CANCEL      0x02
#define ZL_TYPE_RESEND      0x03
#define ZL_TYPE_PING        0x04
#define ZL_TYPE_MAX_REQUEST ZL_TYPE_PING /* requests are 0x01..0x04; responses have bit 7 */

#define ZL_HLEN_INVOKE      116          /* header_len of an INVOKE fragment */
#define ZL_HLEN_CONTROL     80           /* header_len of CANCEL / RESEND / PING */
#define ZL_CONTROL_DGRAM    112          /* control datagrams have no body: 80 + tag */

#define ZL_MIN_CHUNK        256          /* chunk_len bounds of an INVOKE fragment */
#define ZL_MAX_CHUNK        1252         /* = MAX_DATAGRAM - HLEN_INVOKE - TAG_LEN */
#define ZL_PARAMS_LEN       32           /* smallest INVOKE body: the parameter block */
#define ZL_MAX_MESSAGE      1048576      /* largest INVOKE body (1 MiB) */

#endif /* __ZL_WIRE_CONSTS_H */
