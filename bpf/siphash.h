/* invoke_steer: SipHash-2-4 (Aumasson and Bernstein, 2012), 64-bit output, over exactly 64
 * bytes: the XDP tag's input (docs/PROTOCOL.md §6.6). protocol/siphash.py is the reference
 * both are tested against.
 *
 * A fixed 64-byte message keeps it straight-line code after unrolling (no loop the verifier
 * must bound, no tail bytes): 8 compression blocks + the length block, 2 rounds each, then 4
 * finalization rounds, 22 SipRounds of 14 ALU instructions. Called once per tagged request,
 * twice while a key id's secret is being replaced (invoke_auth.h).
 */
#ifndef __SIPHASH_H
#define __SIPHASH_H

#define ZL_SIP_WORDS 8   /* 64 bytes */

#define ZL_ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define ZL_SIPROUND(v0, v1, v2, v3) do {                                       \
		v0 += v1; v1 = ZL_ROTL64(v1, 13); v1 ^= v0; v0 = ZL_ROTL64(v0, 32);  \
		v2 += v3; v3 = ZL_ROTL64(v3, 16); v3 ^= v2;                          \
		v0 += v3; v3 = ZL_ROTL64(v3, 21); v3 ^= v0;                          \
		v2 += v1; v1 = ZL_ROTL64(v1, 17); v1 ^= v2; v2 = ZL_ROTL64(v2, 32);  \
	} while (0)

/* m: the message as 8 little-endian u64 words (on the stack, already masked). */
static __always_inline __u64 zl_siphash24_64(const __u64 *m, __u64 k0, __u64 k1)
{
	__u64 v0 = k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k1 ^ 0x7465646279746573ULL;
	__u64 b = (__u64)(ZL_SIP_WORDS * 8) << 56;   /* no tail bytes: only the length */
	int i;

#pragma unroll
	for (i = 0; i < ZL_SIP_WORDS; i++) {
		v3 ^= m[i];
		ZL_SIPROUND(v0, v1, v2, v3);
		ZL_SIPROUND(v0, v1, v2, v3);
		v0 ^= m[i];
	}
	v3 ^= b;
	ZL_SIPROUND(v0, v1, v2, v3);
	ZL_SIPROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	ZL_SIPROUND(v0, v1, v2, v3);
	ZL_SIPROUND(v0, v1, v2, v3);
	ZL_SIPROUND(v0, v1, v2, v3);
	ZL_SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

#endif /* __SIPHASH_H */
