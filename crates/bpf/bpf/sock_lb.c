// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket-level load balancing for every process in a cgroup tree: a connect() (TCP,
 * connected UDP) or an unconnected UDP sendmsg() to a Service frontend is rewritten to one
 * of its endpoints before any packet exists; recvmsg() and getpeername() show the Service
 * address again. The maps are filled by svcplane's eBPF mode from the node's plan; these
 * programs decide nothing beyond picking an endpoint. */
#include "common.h"

char _license[] SEC("license") = "Dual BSD/GPL";

#define NS_PER_SEC 1000000000ULL
#define PROTO_TCP_NUMBER 6
#define PROTO_UDP_NUMBER 17

/* A UDP flow (the client's network namespace and local port, to one frontend) stays on its
 * endpoint while it is used at least this often and the endpoint is still serving, as a
 * conntrack entry would keep it (the kernel's default UDP timeout is 30 s). */
#define UDP_FLOW_IDLE_NS (30ULL * NS_PER_SEC)

/* The name of each service port id, for readers of svcplane_counters (`svcplane top`):
 * written and read by userspace only. */
struct port_name {
	char name[124];
	__u8 proto;
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct port_name);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_port_names SEC(".maps");

struct udp_flow_key {
	__u64 netns;
	struct svc_key service;
	__u16 local_port;
	__u16 pad; /* 32 bytes, no implicit padding: every byte of a hash key counts */
};

struct udp_flow_value {
	__u64 last_used_ns;
	struct backend_value backend;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct udp_flow_key);
	__type(value, struct udp_flow_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_udp_flows SEC(".maps");

/* Outcomes of a lookup. */
#define LB_PASS 0    /* not a Service: leave the address alone */
#define LB_REWRITE 1 /* *out holds the endpoint */
#define LB_REFUSE 2  /* no endpoint at all: ECONNREFUSED */
#define LB_DROP 3    /* not for this traffic: EPERM, like a local firewall drop */

static __always_inline __u8 scope_of(struct bpf_sock_addr *ctx)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&svcplane_config, &zero);
	if (!cfg)
		return SCOPE_POD;
	return bpf_get_netns_cookie(ctx) == cfg->host_netns_cookie ? SCOPE_NODE : SCOPE_POD;
}

static __always_inline int same_backend(const struct backend_value *a, const struct backend_value *b)
{
	const __u32 *x = (const __u32 *)a->addr, *y = (const __u32 *)b->addr;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && a->port == b->port;
}

static __always_inline int pick(struct bpf_sock_addr *ctx, struct svc_key *key, struct backend_value *out)
{
	struct svc_value *svc = bpf_map_lookup_elem(&svcplane_services, key);
	if (!svc)
		return LB_PASS;
	__u32 flags = svc->flags;
	if (flags & SVC_F_REJECT)
		return LB_REFUSE;
	__u32 count = svc->count;
	if ((flags & SVC_F_DROP) || count == 0)
		return LB_DROP;
	if (count > MAX_BACKENDS_PER_SET)
		count = MAX_BACKENDS_PER_SET;
	__u32 set = svc->backend_set;

	struct affinity_key akey = {};
	__u64 now = 0;
	if (flags & SVC_F_AFFINITY) {
		/* At connect() the client has no address yet: its network namespace stands
		 * for it (a pod, or the node). */
		akey.client = bpf_get_netns_cookie(ctx);
		akey.backend_set = set;
		now = bpf_ktime_get_ns();
		struct affinity_value *aff = bpf_map_lookup_elem(&svcplane_affinity, &akey);
		if (aff && now - aff->last_used_ns <= (__u64)svc->affinity_timeout * NS_PER_SEC) {
			/* Still an endpoint of the set? Scan is bounded: the slot is kept too. */
			__u32 slot = aff->backend.pad;
			struct backend_value *still = slot < count ? backend_slot(svc, slot) : NULL;
			if (still && same_backend(still, &aff->backend)) {
				aff->last_used_ns = now;
				*out = *still;
				count_connection(svc->port_id, still);
				return LB_REWRITE;
			}
		}
	}

	__u32 slot = bpf_get_prandom_u32() % count;
	struct backend_value *backend = backend_slot(svc, slot);
	if (!backend)
		return LB_DROP; /* a set being rewritten: never a half-updated answer */
	*out = *backend;
	count_connection(svc->port_id, backend);
	if (flags & SVC_F_AFFINITY) {
		struct affinity_value fresh = { .last_used_ns = now, .backend = *backend };
		fresh.backend.pad = (__u16)slot;
		bpf_map_update_elem(&svcplane_affinity, &akey, &fresh, BPF_ANY);
	}
	return LB_REWRITE;
}

static __always_inline int still_serving(const struct backend_value *backend, __u32 port_id)
{
	struct live_key key;
	__builtin_memset(&key, 0, sizeof(key));
	key.port_id = port_id;
	key.port = backend->port;
	__builtin_memcpy(key.addr, backend->addr, 16);
	return bpf_map_lookup_elem(&svcplane_live, &key) != NULL;
}

/* pick(), but a UDP socket bound to a port keeps the endpoint its earlier datagrams from
 * that port went to, as long as the endpoint still serves: the flow a conntrack entry
 * would keep in the other modes. */
static __always_inline int pick_flow(struct bpf_sock_addr *ctx, struct svc_key *key, struct backend_value *out)
{
	struct bpf_sock *sk = ctx->sk;
	__u32 local_port = sk ? sk->src_port : 0;
	if (key->proto != PROTO_UDP_NUMBER || local_port == 0)
		return pick(ctx, key, out);
	struct svc_value *svc = bpf_map_lookup_elem(&svcplane_services, key);
	if (!svc || (svc->flags & (SVC_F_REJECT | SVC_F_DROP)))
		return pick(ctx, key, out);
	struct udp_flow_key fkey;
	__builtin_memset(&fkey, 0, sizeof(fkey));
	fkey.netns = bpf_get_netns_cookie(ctx);
	fkey.service = *key;
	fkey.local_port = (__u16)local_port;
	__u64 now = bpf_ktime_get_ns();
	struct udp_flow_value *flow = bpf_map_lookup_elem(&svcplane_udp_flows, &fkey);
	if (flow && now - flow->last_used_ns <= UDP_FLOW_IDLE_NS && still_serving(&flow->backend, svc->port_id)) {
		flow->last_used_ns = now;
		*out = flow->backend;
		return LB_REWRITE;
	}
	int verdict = pick(ctx, key, out);
	if (verdict == LB_REWRITE) {
		struct udp_flow_value fresh = { .last_used_ns = now, .backend = *out };
		bpf_map_update_elem(&svcplane_udp_flows, &fkey, &fresh, BPF_ANY);
	}
	return verdict;
}

static __always_inline int same_addr(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

/* The socket's reverse translation: the endpoint it now talks to shows as `service`. An
 * endpoint already in a slot is updated in place; a new one takes the oldest slot. */
static __attribute__((noinline)) void remember(struct bpf_sock_addr *ctx, const struct backend_value *backend,
				     const struct svc_key *service)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return;
	struct rev_sock *rev = bpf_sk_storage_get(&svcplane_sock_rev, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!rev)
		return;
	__u32 slot = rev->next % REV_SLOTS;
	int found = 0;
#pragma unroll
	for (int i = 0; i < REV_SLOTS; i++) {
		struct rev_entry *entry = &rev->slots[i];
		if (!found && entry->backend_port == backend->port && same_addr(entry->backend_addr, backend->addr)) {
			slot = i;
			found = 1;
		}
	}
	if (!found)
		rev->next = slot + 1;
	struct rev_entry *entry = &rev->slots[slot & (REV_SLOTS - 1)];
	__builtin_memcpy(entry->backend_addr, backend->addr, 16);
	entry->backend_port = backend->port;
	__builtin_memcpy(entry->addr, service->addr, 16);
	entry->port = service->port;
}

/* A TCP socket has one peer: its translation goes in svcplane_tcp_rev by socket cookie,
 * deleted by svcplane_sock_release. */
static __always_inline void remember_tcp(struct bpf_sock_addr *ctx, const struct backend_value *backend,
					 const struct svc_key *service)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct rev_entry entry;
	__builtin_memset(&entry, 0, sizeof(entry));
	__builtin_memcpy(entry.backend_addr, backend->addr, 16);
	entry.backend_port = backend->port;
	__builtin_memcpy(entry.addr, service->addr, 16);
	entry.port = service->port;
	bpf_map_update_elem(&svcplane_tcp_rev, &cookie, &entry, BPF_ANY);
}

static __always_inline void remember_any(struct bpf_sock_addr *ctx, const struct backend_value *backend,
					 const struct svc_key *service)
{
	if (service->proto == PROTO_TCP_NUMBER)
		remember_tcp(ctx, backend, service);
	else
		remember(ctx, backend, service);
}

/* connect() of the node's own UDP socket: remembered by cookie for the proxy, which closes
 * the socket when its endpoint stops serving. */
static __always_inline void remember_udp_socket(struct bpf_sock_addr *ctx, const struct backend_value *backend,
						const struct svc_key *service)
{
	if (service->proto != PROTO_UDP_NUMBER || service->scope != SCOPE_NODE)
		return;
	struct rev_key rkey = { .cookie = bpf_get_socket_cookie(ctx), .port = backend->port };
	__builtin_memcpy(rkey.addr, backend->addr, 16);
	struct rev_value rval = { .port = service->port };
	__builtin_memcpy(rval.addr, service->addr, 16);
	bpf_map_update_elem(&svcplane_udp_sockets, &rkey, &rval, BPF_ANY);
}

/* The Service address a reply from `addr`:`port` shows, if this socket was balanced to it. */
static __always_inline struct rev_entry *recall(struct bpf_sock_addr *ctx, const __u8 *addr, __u16 port)
{
	if (ctx->protocol == PROTO_TCP_NUMBER) {
		__u64 cookie = bpf_get_socket_cookie(ctx);
		struct rev_entry *entry = bpf_map_lookup_elem(&svcplane_tcp_rev, &cookie);
		if (entry && entry->backend_port == port && same_addr(entry->backend_addr, addr))
			return entry;
		return NULL;
	}
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return NULL;
	struct rev_sock *rev = bpf_sk_storage_get(&svcplane_sock_rev, sk, 0, 0);
	if (!rev)
		return NULL;
#pragma unroll
	for (int i = 0; i < REV_SLOTS; i++) {
		struct rev_entry *entry = &rev->slots[i];
		if (entry->backend_port == port && same_addr(entry->backend_addr, addr))
			return entry;
	}
	return NULL;
}

static __always_inline void key4(struct svc_key *key, __u32 ip, __u16 port)
{
	__u32 *words = (__u32 *)key->addr;
	words[0] = 0;
	words[1] = 0;
	words[2] = bpf_htonl(0x0000ffff);
	words[3] = ip;
	key->port = port;
}

static __always_inline void key6(struct svc_key *key, struct bpf_sock_addr *ctx)
{
	__u32 *words = (__u32 *)key->addr;
	words[0] = ctx->user_ip6[0];
	words[1] = ctx->user_ip6[1];
	words[2] = ctx->user_ip6[2];
	words[3] = ctx->user_ip6[3];
	key->port = (__u16)ctx->user_port;
}

static __always_inline int is_v4_mapped(const __u8 *addr)
{
	const __u32 *words = (const __u32 *)addr;
	return words[0] == 0 && words[1] == 0 && words[2] == bpf_htonl(0x0000ffff);
}

/* connect4 / sendmsg4: rewrite; refusals only where the syscall can carry them. */
/* The frontend a sock_addr call names, for the caller's scope. */
static __always_inline void frontend4(struct bpf_sock_addr *ctx, struct svc_key *key)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->proto = (__u8)ctx->protocol;
	key4(key, ctx->user_ip4, (__u16)ctx->user_port);
	key->scope = scope_of(ctx);
}

static __always_inline void frontend6(struct bpf_sock_addr *ctx, struct svc_key *key)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->proto = (__u8)ctx->protocol;
	key6(key, ctx);
	key->scope = scope_of(ctx);
}

static __always_inline int balance4(struct bpf_sock_addr *ctx, struct svc_key *frontend, int connecting)
{
	struct svc_key key = *frontend;
	struct backend_value backend;
	switch (pick_flow(ctx, &key, &backend)) {
	case LB_PASS:
		return 1;
	case LB_REFUSE:
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	case LB_DROP:
		return 0;
	}
	if (!is_v4_mapped(backend.addr))
		return 0;
	ctx->user_ip4 = ((__u32 *)backend.addr)[3];
	ctx->user_port = backend.port;
	remember_any(ctx, &backend, &key);
	if (connecting)
		remember_udp_socket(ctx, &backend, &key);
	return 1;
}

static __always_inline int balance6(struct bpf_sock_addr *ctx, struct svc_key *frontend, int connecting)
{
	struct svc_key key = *frontend;
	struct backend_value backend;
	switch (pick_flow(ctx, &key, &backend)) {
	case LB_PASS:
		return 1;
	case LB_REFUSE:
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	case LB_DROP:
		return 0;
	}
	__u32 *words = (__u32 *)backend.addr;
	ctx->user_ip6[0] = words[0];
	ctx->user_ip6[1] = words[1];
	ctx->user_ip6[2] = words[2];
	ctx->user_ip6[3] = words[3];
	ctx->user_port = backend.port;
	remember_any(ctx, &backend, &key);
	if (connecting)
		remember_udp_socket(ctx, &backend, &key);
	return 1;
}

/* recvmsg4 / getpeername4: a backend this socket was balanced to shows as the Service. */
static __always_inline void reverse4(struct bpf_sock_addr *ctx)
{
	__u32 words[4] = { 0, 0, bpf_htonl(0x0000ffff), ctx->user_ip4 };
	struct rev_entry *service = recall(ctx, (const __u8 *)words, (__u16)ctx->user_port);
	if (!service || !is_v4_mapped(service->addr))
		return;
	ctx->user_ip4 = ((__u32 *)service->addr)[3];
	ctx->user_port = service->port;
}

static __always_inline void reverse6(struct bpf_sock_addr *ctx)
{
	__u32 words[4] = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] };
	struct rev_entry *service = recall(ctx, (const __u8 *)words, (__u16)ctx->user_port);
	if (!service)
		return;
	__u32 *out = (__u32 *)service->addr;
	ctx->user_ip6[0] = out[0];
	ctx->user_ip6[1] = out[1];
	ctx->user_ip6[2] = out[2];
	ctx->user_ip6[3] = out[3];
	ctx->user_port = service->port;
}

/* A pod's connected UDP socket to a frontend is not rewritten: its datagrams reach the node
 * through the pod's veth, where the tc program translates them per flow and moves the flow
 * when its endpoint stops serving (a socket connected to an endpoint would keep sending to
 * it). Refusals still fail connect() at once. */
static __always_inline int leave_to_tc(struct bpf_sock_addr *ctx, struct svc_key *key)
{
	if (key->proto != PROTO_UDP_NUMBER || key->scope != SCOPE_POD)
		return 0;
	struct svc_value *svc = bpf_map_lookup_elem(&svcplane_services, key);
	return svc && !(svc->flags & SVC_F_REJECT);
}

SEC("cgroup/connect4")
int svcplane_connect4(struct bpf_sock_addr *ctx)
{
	struct svc_key key;
	frontend4(ctx, &key);
	if (leave_to_tc(ctx, &key))
		return 1;
	return balance4(ctx, &key, 1);
}

SEC("cgroup/sendmsg4")
int svcplane_sendmsg4(struct bpf_sock_addr *ctx)
{
	struct svc_key key;
	frontend4(ctx, &key);
	return balance4(ctx, &key, 0);
}

SEC("cgroup/recvmsg4")
int svcplane_recvmsg4(struct bpf_sock_addr *ctx)
{
	reverse4(ctx);
	return 1;
}

SEC("cgroup/getpeername4")
int svcplane_getpeername4(struct bpf_sock_addr *ctx)
{
	reverse4(ctx);
	return 1;
}

SEC("cgroup/connect6")
int svcplane_connect6(struct bpf_sock_addr *ctx)
{
	struct svc_key key;
	frontend6(ctx, &key);
	if (leave_to_tc(ctx, &key))
		return 1;
	return balance6(ctx, &key, 1);
}

SEC("cgroup/sendmsg6")
int svcplane_sendmsg6(struct bpf_sock_addr *ctx)
{
	struct svc_key key;
	frontend6(ctx, &key);
	return balance6(ctx, &key, 0);
}

SEC("cgroup/recvmsg6")
int svcplane_recvmsg6(struct bpf_sock_addr *ctx)
{
	reverse6(ctx);
	return 1;
}

SEC("cgroup/getpeername6")
int svcplane_getpeername6(struct bpf_sock_addr *ctx)
{
	reverse6(ctx);
	return 1;
}

/* A TCP socket's translation goes with it. Runs for every socket of the cgroup tree that
 * is released; a socket never balanced finds nothing to delete. */
SEC("cgroup/sock_release")
int svcplane_sock_release(struct bpf_sock *sk)
{
	if (sk->protocol == PROTO_TCP_NUMBER) {
		__u64 cookie = bpf_get_socket_cookie(sk);
		bpf_map_delete_elem(&svcplane_tcp_rev, &cookie);
	}
	return 1;
}
