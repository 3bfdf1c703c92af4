/* invoke_steer: maps (BCC declarations). Names are ABI for bpf/loader.py and pinned paths. */
#ifndef __INVOKE_MAPS_H
#define __INVOKE_MAPS_H

#include "invoke_consts.h"
#include "invoke_structs.h"

/* Invoke UDP ports, host byte order -> 1. Empty = nothing is steered, everything passes. */
BPF_HASH(zl_ports, __u16, __u8, ZL_MAX_PORTS);

/* One AF_XDP socket per RX queue, indexed by rx_queue_index. */
BPF_XSKMAP(zl_xsks, ZL_MAX_QUEUES);

/* All counters, one per reason (enum zl_stat), per CPU: no atomics on the fast path. */
BPF_PERCPU_ARRAY(zl_stats, __u64, ZL_STAT_MAX);

/* Rate limiters: configuration (entries ZL_RATE_PER_SOURCE, ZL_RATE_UNTAGGED), per-source
 * state, and the untagged requests' bucket, one per CPU (no atomics, no races). */
BPF_ARRAY(zl_rate_cfg, struct zl_rate_cfg, ZL_RATE_CFGS);
BPF_TABLE("lru_hash", struct zl_src_key, struct zl_rate_state, zl_rate_state, ZL_RATE_SOURCES);
BPF_PERCPU_ARRAY(zl_untagged_state, struct zl_rate_state, 1);

/* Authentication (invoke_auth.h): key id -> its XDP tag key, kept in step with the daemon's
 * keys file; and the daemon's switches and clock offset (entry 0). Key material: the daemon
 * pins these root-only (bpf/loader.py pin_maps). */
BPF_HASH(zl_keys, __u32, struct zl_tag_key, ZL_MAX_KEYS);
BPF_ARRAY(zl_auth_cfg, struct zl_auth_cfg, 1);

#endif /* __INVOKE_MAPS_H */
