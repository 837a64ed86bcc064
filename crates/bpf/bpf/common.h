/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Shared map layouts of svcplane's BPF programs. Every struct here has a twin in
 * crates/bpf/src/maps.rs (#[repr(C)]): change both together. Addresses are 16 bytes
 * in network order; IPv4 is stored IPv4-mapped (::ffff:a.b.c.d), so both families share
 * one set of maps. Ports are in network order. */
#ifndef SVCPLANE_COMMON_H
#define SVCPLANE_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ECONNREFUSED 111

/* A service frontend is looked up per source scope: what the plan decides for traffic
 * from this node itself (the node's network namespace) and from its pods. */
#define SCOPE_NODE 0
#define SCOPE_POD 1
/* tc programs: a packet from outside the cluster CIDRs. */
#define SCOPE_EXTERNAL 2

/* svc_value.flags */
#define SVC_F_REJECT 1   /* no endpoint at all: refuse (ECONNREFUSED / reset / ICMP) */
#define SVC_F_DROP 2     /* endpoints exist, not for this traffic: drop */
#define SVC_F_AFFINITY 4 /* ClientIP affinity, affinity_timeout seconds */
#define SVC_F_MASQ 8 /* tc: SNAT to the node's address */
#define SVC_F_SOURCE_RANGES 16 /* tc: only sources inside the frontend's ranges */

#define MAX_BACKENDS_PER_SET 65536

struct svc_key {
	__u8 addr[16];
	__u16 port;
	__u8 proto;
	__u8 scope;
};

struct svc_value {
	/* The set's id: affinity entries and Maglev tables are kept per set. */
	__u32 backend_set;
	__u32 count;
	__u32 flags;
	__u32 affinity_timeout;
	/* The service port this frontend belongs to (one id per service port and family):
	 * UDP flows stay on an endpoint while (port_id, endpoint) is in svcplane_live. */
	__u32 port_id;
	/* The set's slots are svcplane_backends[first .. first + count). */
	__u32 first;
};

struct backend_value {
	__u8 addr[16];
	__u16 port;
	/* In svcplane_backends: BACKEND_F_* flags. In copies kept for affinity: the slot. */
	__u16 pad;
};

/* The endpoint runs on this node (the tc program's direct server return sends only flows
 * to other nodes' endpoints with the Service address attached). */
#define BACKEND_F_LOCAL 1

/* Reverse translation of socket-balanced flows: a socket talking to a backend sees the
 * Service address in recvmsg and getpeername. A TCP socket's one translation is kept in
 * svcplane_tcp_rev (below); UDP sockets' in the socket's own storage
 * (svcplane_sock_rev, BPF_MAP_TYPE_SK_STORAGE): allocated when the socket is first balanced,
 * freed with the socket, so nothing is preallocated and no other socket can push it out. A
 * connected socket has one peer; an unconnected UDP socket may send to several Services
 * (a resolver asking each name server): the last REV_SLOTS distinct endpoints are kept,
 * the oldest replaced first. */
#define REV_SLOTS 4

struct rev_entry {
	__u8 backend_addr[16];
	__u16 backend_port;
	__u16 pad;
	__u8 addr[16]; /* the Service address the socket named */
	__u16 port;
	__u16 pad2;
};

struct rev_sock {
	struct rev_entry slots[REV_SLOTS];
	__u32 next; /* the slot a new endpoint takes (mod REV_SLOTS) */
	__u32 pad;
};

/* The node's own connected UDP sockets the connect programs balanced: a socket (cookie) and
 * its endpoint -> the Service address it asked for. The proxy reads it to close those
 * sockets when their endpoint stops serving (they cannot move, pods' sockets are moved by
 * tc). Only these sockets are written, so it is small (an LRU: a socket pushed out is left
 * to its application's timeouts instead of being closed). */
struct rev_key {
	__u64 cookie;
	__u8 addr[16];
	__u16 port;
	__u16 pad[3];
};

struct rev_value {
	__u8 addr[16];
	__u16 port;
	__u16 pad;
};

struct affinity_key {
	__u64 client;
	__u32 backend_set;
	__u32 pad;
};

struct affinity_value {
	__u64 last_used_ns;
	/* backend.pad holds the backend's slot, to check it is still in the set. */
	struct backend_value backend;
	__u32 tail;
};

struct config {
	/* bpf_get_netns_cookie of the node's own network namespace: sockets there are the
	 * node itself, sockets elsewhere in the cgroup are pods. */
	__u64 host_netns_cookie;
};

/* The services map is preallocated (no BPF_F_NO_PREALLOC): a cold start writes ~30k
 * entries into it at 10k Services, and an insert into a preallocated map takes a free
 * element instead of allocating one. The endpoint slots are an array: each set is a range
 * of it that is never rewritten while a frontend names it (a changed set is written to a
 * new range and the frontends are moved to it), so a lookup never sees a slot half
 * written; an array takes ~100k slots at a cold start in a fraction of a hash's time. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct backend_value);
	/* The proxy maps the array and writes new ranges as memory: no system call per slot. */
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_backends SEC(".maps");

/* The endpoint in slot `slot` of `svc`'s set, or NULL (out of the map, or an empty slot:
 * an endpoint's port is never 0). */
static __always_inline struct backend_value *backend_slot(const struct svc_value *svc, __u32 slot)
{
	__u32 index = svc->first + slot;
	struct backend_value *backend = bpf_map_lookup_elem(&svcplane_backends, &index);
	if (!backend || backend->port == 0)
		return NULL;
	return backend;
}

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct rev_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_sock_rev SEC(".maps");

/* A balanced TCP socket's one reverse translation, by socket cookie: written at connect(),
 * read by getpeername(), deleted when the socket is released (cgroup/sock_release). A hash
 * without preallocation: nothing to make at a cold start, and an insert takes an element
 * from the kernel's per-CPU caches where socket storage allocates memory for each socket
 * and frees it after an RCU grace period (measured: that raised the connect p99). Sized
 * like the other connection maps; should it be full, the connection still goes through and
 * its getpeername() shows the endpoint. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, __u64);
	__type(value, struct rev_entry);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_tcp_rev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rev_key);
	__type(value, struct rev_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_udp_sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_config SEC(".maps");

/* Every endpoint still serving (ready or terminating) of each service port: a flow may stay
 * on these and only these. */
struct live_key {
	__u32 port_id;
	__u8 addr[16];
	__u16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct live_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_live SEC(".maps");

/* New connections (TCP, connected UDP, new UDP flows, tc flows) sent to each endpoint of
 * each service port, keyed like svcplane_live. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 131072);
	__type(key, struct live_key);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_counters SEC(".maps");

static __always_inline void count_connection(__u32 port_id, const struct backend_value *backend)
{
	struct live_key key;
	__builtin_memset(&key, 0, sizeof(key));
	key.port_id = port_id;
	key.port = backend->port;
	__builtin_memcpy(key.addr, backend->addr, 16);
	__u64 *count = bpf_map_lookup_elem(&svcplane_counters, &key);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&svcplane_counters, &key, &one, BPF_NOEXIST)) {
		count = bpf_map_lookup_elem(&svcplane_counters, &key);
		if (count)
			__sync_fetch_and_add(count, 1);
	}
}

#endif
