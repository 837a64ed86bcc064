// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Service translation for packets arriving at a node from elsewhere (external clients, pods
 * of other nodes): a tcx ingress program on each of the node's interfaces. A new flow to a
 * frontend (the same services map the socket programs read, scope "external" or "pod" by
 * the source) gets an endpoint, is DNATed to it and, when the plan says so, SNATed to the
 * node's address; a connection-tracking map keeps each flow on its endpoint and translates
 * its replies back when they arrive (from a local pod on its veth, from another node on the
 * LAN interface). Packets the maps know nothing of pass untouched: in particular flows the
 * socket programs balanced, and direct pod traffic, are never translated. */
#include "common.h"

#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>

char _license[] SEC("license") = "Dual BSD/GPL";

#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

#define NS_PER_SEC 1000000000ULL

/* The node's own addresses (IPv4-mapped and IPv6), the SNAT source, and the Maglev table
 * size. */
struct tc_config {
	__u8 node_v4[16];
	__u8 node_v6[16];
	__u32 maglev_size;
	__u32 flags; /* TC_F_* */
};

/* Direct server return for external traffic the plan masquerades: no SNAT; a flow to
 * another node's endpoint carries the Service address (an IPv4 option, an IPv6
 * destination-options header, on its first packet) so that node answers the client from
 * it directly. */
#define TC_F_DSR 1

/* The IPv4 option carrying the Service address and port to the endpoint's node. Its type
 * is one RFC 4727 sets aside for experiments (copied on fragmentation, class 0, number 30). */
#define DSR_OPT4_TYPE 0x9e
#define DSR_OPT4_LEN 8

struct dsr_opt4 {
	__u8 type;
	__u8 len;
	__be16 port;
	__be32 addr;
};

/* IPv6: a destination-options header holding one option (an RFC 4727 experimental type
 * whose two high bits say "skip if unknown") with the Service address and port, padded to
 * 24 bytes with a PadN option. */
#define DSR_OPT6_TYPE 0x1e
#define DSR_EXT6_LEN 24
#define IPPROTO_DSTOPTS_NUMBER 60

struct dsr_ext6 {
	__u8 next_header;
	__u8 length; /* in 8-byte units beyond the first 8 */
	__u8 type;
	__u8 option_len;
	__u8 addr[16];
	__be16 port;
	__u8 padn_type; /* 1: PadN */
	__u8 padn_len;  /* 0 */
};

/* Maglev: per endpoint set of an externally reachable frontend, a table of prime size
 * whose entries are slots of the set (written whole by userspace, swapped in atomically). */
struct maglev_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16381);
	__uint(map_flags, BPF_F_INNER_MAP);
	__type(key, __u32);
	__type(value, __u32);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct maglev_table);
} svcplane_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tc_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_tc_config SEC(".maps");

/* The cluster's pod CIDRs: a source inside is a pod (of another node). */
struct cidr_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 64);
	__type(key, struct cidr_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_cluster_cidrs SEC(".maps");

/* loadBalancerSourceRanges: the frontend (address, port, protocol) then the source prefix;
 * prefixlen counts the frontend's 160 bits too. */
struct range_key {
	__u32 prefixlen;
	__u8 frontend[16];
	__u16 port;
	__u8 proto;
	__u8 pad;
	__u8 source[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct range_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_source_ranges SEC(".maps");

/* A flow as a packet names it: source, destination, ports, protocol. */
struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* What a flow is rewritten to: the whole new tuple (forward, or reply). A forward entry of
 * a UDP flow names its service port, so the flow moves once its endpoint stops serving. */
struct nat {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;
	__u16 dport;
	__u32 port_id; /* forward entries of UDP flows; 0 otherwise */
	__u8 forward;  /* 1: the client's direction; 0: replies */
	__u8 pad[3];
	/* Forward entries of UDP flows: when the client last sent (seconds of
	 * bpf_ktime_get_ns), so an idle flow ends as a conntrack entry would. */
	__u32 last_seen_s;
};

/* A UDP flow silent this long is over: a later datagram with the same ports is a new flow,
 * balanced afresh and counted (the kernel's conntrack forgets an unreplied UDP flow after
 * 30 s; without this, a new socket reusing an old source port would inherit its endpoint
 * for as long as the LRU map kept the entry). */
#define UDP_FLOW_IDLE_S 30

#define AF_INET 2
#define AF_INET6 10

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct flow);
	__type(value, struct nat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svcplane_ct SEC(".maps");

struct packet {
	struct flow flow;
	__u32 l3;
	__u32 l4;
	__u8 v6;
};

static __always_inline void v4_mapped(__u8 *out, __u32 addr)
{
	__u32 *words = (__u32 *)out;
	words[0] = 0;
	words[1] = 0;
	words[2] = bpf_htonl(0x0000ffff);
	words[3] = addr;
}

/* Parses Ethernet + IPv4 (no options, not a fragment) or IPv6 (no extension headers) + TCP
 * or UDP. Anything else is not ours. */
static __always_inline int parse(struct __sk_buff *skb, struct packet *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return 0;
	__builtin_memset(p, 0, sizeof(*p));
	p->l3 = sizeof(*eth);
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)))
			return 0;
		p->flow.proto = ip->protocol;
		v4_mapped(p->flow.src, ip->saddr);
		v4_mapped(p->flow.dst, ip->daddr);
		p->l4 = p->l3 + sizeof(*ip);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return 0;
		p->v6 = 1;
		p->flow.proto = ip6->nexthdr;
		__builtin_memcpy(p->flow.src, &ip6->saddr, 16);
		__builtin_memcpy(p->flow.dst, &ip6->daddr, 16);
		p->l4 = p->l3 + sizeof(*ip6);
	} else {
		return 0;
	}
	if (p->flow.proto != IPPROTO_TCP && p->flow.proto != IPPROTO_UDP)
		return 0;
	__u16 *ports = data + p->l4;
	if ((void *)(ports + 2) > end)
		return 0;
	p->flow.sport = ports[0];
	p->flow.dport = ports[1];
	return 1;
}

static __always_inline __u32 l4_checksum_offset(const struct packet *p)
{
	return p->l4 + (p->flow.proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) : offsetof(struct udphdr, check));
}

static __always_inline __u64 l4_flags(const struct packet *p)
{
	return p->flow.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Replaces one address (source: which == 0, destination: 1) and its port, fixing checksums. */
static __always_inline int rewrite(struct __sk_buff *skb, const struct packet *p, int which, const __u8 *old_addr,
				   const __u8 *new_addr, __u16 old_port, __u16 new_port)
{
	__u32 csum = l4_checksum_offset(p);
	if (!p->v6) {
		__u32 old4 = ((const __u32 *)old_addr)[3], new4 = ((const __u32 *)new_addr)[3];
		__u32 at = p->l3 + (which ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
		if (old4 != new4) {
			if (bpf_l4_csum_replace(skb, csum, old4, new4, BPF_F_PSEUDO_HDR | 4 | l4_flags(p)) ||
			    bpf_l3_csum_replace(skb, p->l3 + offsetof(struct iphdr, check), old4, new4, 4) ||
			    bpf_skb_store_bytes(skb, at, &new4, 4, 0))
				return -1;
		}
	} else {
		__u32 at = p->l3 + (which ? offsetof(struct ipv6hdr, daddr) : offsetof(struct ipv6hdr, saddr));
		__s64 diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum, 0, (__u32)diff, BPF_F_PSEUDO_HDR | l4_flags(p)) ||
		    bpf_skb_store_bytes(skb, at, new_addr, 16, 0))
			return -1;
	}
	if (old_port != new_port) {
		__u32 at = p->l4 + (which ? 2 : 0);
		if (bpf_l4_csum_replace(skb, csum, old_port, new_port, 2 | l4_flags(p)) ||
		    bpf_skb_store_bytes(skb, at, &new_port, 2, 0))
			return -1;
	}
	return 0;
}

/* Sends a translated packet straight out of the interface its new destination is routed
 * through. The stack's input path would drop it: an IPv4 packet whose source is now one of
 * the node's own addresses (a masqueraded flow, or a NodePort's reply) is a martian there. */
static __always_inline int redirect_to_route(struct __sk_buff *skb, const struct packet *p, const struct nat *to)
{
	struct bpf_fib_lookup fib;
	__builtin_memset(&fib, 0, sizeof(fib));
	fib.ifindex = skb->ingress_ifindex;
	fib.l4_protocol = p->flow.proto;
	fib.sport = to->sport;
	fib.dport = to->dport;
	if (!p->v6) {
		fib.family = AF_INET;
		fib.ipv4_src = ((const __u32 *)to->src)[3];
		fib.ipv4_dst = ((const __u32 *)to->dst)[3];
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, to->src, 16);
		__builtin_memcpy(fib.ipv6_dst, to->dst, 16);
	}
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	return TC_ACT_OK;
}

/* Applies a translation: the packet's tuple becomes `to`, and it leaves by its new route. */
static __always_inline int translate(struct __sk_buff *skb, const struct packet *p, const struct nat *to)
{
	if (rewrite(skb, p, 1, p->flow.dst, to->dst, p->flow.dport, to->dport))
		return TC_ACT_SHOT;
	if (rewrite(skb, p, 0, p->flow.src, to->src, p->flow.sport, to->sport))
		return TC_ACT_SHOT;
	return redirect_to_route(skb, p, to);
}

/* A TCP SYN without ACK: the first packet of a connection. */
static __always_inline int is_new_connection(struct __sk_buff *skb, const struct packet *p)
{
	if (p->flow.proto != IPPROTO_TCP)
		return 0;
	__u8 flags;
	if (bpf_skb_load_bytes(skb, p->l4 + 13, &flags, 1))
		return 0;
	return (flags & 0x12) == 0x02;
}

/* Whether a UDP flow's endpoint still serves its service port. */
static __always_inline int still_serving(const struct nat *forward)
{
	struct live_key key;
	__builtin_memset(&key, 0, sizeof(key));
	key.port_id = forward->port_id;
	key.port = forward->dport;
	__builtin_memcpy(key.addr, forward->dst, 16);
	return bpf_map_lookup_elem(&svcplane_live, &key) != NULL;
}

static __always_inline __u8 scope_of(const struct packet *p)
{
	struct cidr_key key = { .prefixlen = 128 };
	__builtin_memcpy(key.addr, p->flow.src, 16);
	return bpf_map_lookup_elem(&svcplane_cluster_cidrs, &key) ? SCOPE_POD : SCOPE_EXTERNAL;
}

static __always_inline int source_allowed(const struct packet *p)
{
	struct range_key key = { .prefixlen = 160 + 128, .port = p->flow.dport, .proto = p->flow.proto };
	__builtin_memcpy(key.frontend, p->flow.dst, 16);
	__builtin_memcpy(key.source, p->flow.src, 16);
	return bpf_map_lookup_elem(&svcplane_source_ranges, &key) != NULL;
}

/* A hash of the flow's source and protocol (its destination is the frontend itself). */
static __always_inline __u32 flow_hash(const struct packet *p)
{
	const __u32 *src = (const __u32 *)p->flow.src;
	__u32 h = 0x9747b28c;
	h = (h ^ src[0]) * 0x01000193;
	h = (h ^ src[1]) * 0x01000193;
	h = (h ^ src[2]) * 0x01000193;
	h = (h ^ src[3]) * 0x01000193;
	h = (h ^ ((__u32)p->flow.sport << 16 | p->flow.proto)) * 0x01000193;
	h ^= h >> 15;
	return h;
}

static __always_inline __u64 client_of(const struct packet *p)
{
	const __u64 *halves = (const __u64 *)p->flow.src;
	return halves[0] ^ (halves[1] * 0x9e3779b97f4a7c15ULL);
}

/* An endpoint of the frontend's set: the client's affinity entry while it holds, else one at
 * random (the flow then stays on it through the connection-tracking map). */
static __always_inline struct backend_value *pick(const struct packet *p, struct svc_value *svc)
{
	__u32 count = svc->count;
	if (count == 0)
		return NULL;
	if (count > MAX_BACKENDS_PER_SET)
		count = MAX_BACKENDS_PER_SET;
	struct affinity_key akey = { .client = client_of(p), .backend_set = svc->backend_set };
	__u64 now = 0;
	if (svc->flags & SVC_F_AFFINITY) {
		now = bpf_ktime_get_ns();
		struct affinity_value *aff = bpf_map_lookup_elem(&svcplane_affinity, &akey);
		if (aff && now - aff->last_used_ns <= (__u64)svc->affinity_timeout * NS_PER_SEC) {
			__u32 slot = aff->backend.pad;
			struct backend_value *still = slot < count ? backend_slot(svc, slot) : NULL;
			const __u32 *a = (const __u32 *)still, *b = (const __u32 *)&aff->backend;
			if (still && still->port == aff->backend.port && a[0] == b[0] &&
			    a[1] == b[1] && a[2] == b[2] && a[3] == b[3]) {
				aff->last_used_ns = now;
				return still;
			}
		}
	}
	__u32 slot = bpf_get_prandom_u32() % count;
	/* Without affinity, a Maglev table (where the set has one) picks by the flow's hash:
	 * every node picks the same endpoint for a flow, and a changed set moves few flows. */
	if (!(svc->flags & SVC_F_AFFINITY)) {
		__u32 zero = 0;
		struct tc_config *cfg = bpf_map_lookup_elem(&svcplane_tc_config, &zero);
		void *table = bpf_map_lookup_elem(&svcplane_maglev, &svc->backend_set);
		if (cfg && table && cfg->maglev_size) {
			__u32 index = flow_hash(p) % cfg->maglev_size;
			__u32 *chosen = bpf_map_lookup_elem(table, &index);
			if (chosen && *chosen < count)
				slot = *chosen;
		}
	}
	struct backend_value *backend = backend_slot(svc, slot);
	if (backend && (svc->flags & SVC_F_AFFINITY)) {
		struct affinity_value fresh = { .last_used_ns = now, .backend = *backend };
		fresh.backend.pad = (__u16)slot;
		bpf_map_update_elem(&svcplane_affinity, &akey, &fresh, BPF_ANY);
	}
	return backend;
}

/* Folds a bpf_csum_diff sum into a 16-bit one's complement checksum. */
static __always_inline __u16 fold(__s64 sum)
{
	__u64 s = (__u64)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~(__u16)s;
}

static __always_inline int swap_macs(struct __sk_buff *skb)
{
	__u8 macs[12], swapped[12];
	if (bpf_skb_load_bytes(skb, 0, macs, 12))
		return -1;
	__builtin_memcpy(swapped, macs + 6, 6);
	__builtin_memcpy(swapped + 6, macs, 6);
	return bpf_skb_store_bytes(skb, 0, swapped, 12, 0);
}

struct pseudo4 {
	__be32 src;
	__be32 dst;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

struct pseudo6 {
	__u8 src[16];
	__u8 dst[16];
	__be32 len;
	__u8 zero[3];
	__u8 next;
};

/* The TCP reset a closed port would answer with: addresses and ports swapped, to the
 * sender of `p`, out of the interface it came in by. */
static __always_inline int forge_reset(struct __sk_buff *skb, const struct packet *p)
{
	struct tcphdr in;
	if (bpf_skb_load_bytes(skb, p->l4, &in, sizeof(in)))
		return TC_ACT_SHOT;
	if (in.rst)
		return TC_ACT_SHOT;
	struct tcphdr out;
	__builtin_memset(&out, 0, sizeof(out));
	out.source = in.dest;
	out.dest = in.source;
	out.doff = 5;
	out.rst = 1;
	if (in.ack) {
		out.seq = in.ack_seq;
	} else {
		__u32 payload = skb->len - p->l4 - in.doff * 4;
		out.ack = 1;
		out.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + payload + in.syn + in.fin);
	}
	__u32 length = p->l4 + sizeof(out);
	if (bpf_skb_change_tail(skb, length, 0) || swap_macs(skb))
		return TC_ACT_SHOT;
	if (!p->v6) {
		struct iphdr ip;
		__builtin_memset(&ip, 0, sizeof(ip));
		ip.version = 4;
		ip.ihl = 5;
		ip.tot_len = bpf_htons(sizeof(ip) + sizeof(out));
		ip.ttl = 64;
		ip.protocol = IPPROTO_TCP;
		ip.saddr = ((const __u32 *)p->flow.dst)[3];
		ip.daddr = ((const __u32 *)p->flow.src)[3];
		ip.check = fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));
		struct pseudo4 ph = { .src = ip.saddr, .dst = ip.daddr, .proto = IPPROTO_TCP, .len = bpf_htons(sizeof(out)) };
		__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
		out.check = fold(bpf_csum_diff(NULL, 0, (__be32 *)&out, sizeof(out), (__u32)sum));
		if (bpf_skb_store_bytes(skb, p->l3, &ip, sizeof(ip), 0))
			return TC_ACT_SHOT;
	} else {
		struct ipv6hdr ip6;
		__builtin_memset(&ip6, 0, sizeof(ip6));
		ip6.version = 6;
		ip6.payload_len = bpf_htons(sizeof(out));
		ip6.nexthdr = IPPROTO_TCP;
		ip6.hop_limit = 64;
		__builtin_memcpy(&ip6.saddr, p->flow.dst, 16);
		__builtin_memcpy(&ip6.daddr, p->flow.src, 16);
		struct pseudo6 ph;
		__builtin_memset(&ph, 0, sizeof(ph));
		__builtin_memcpy(ph.src, p->flow.dst, 16);
		__builtin_memcpy(ph.dst, p->flow.src, 16);
		ph.len = bpf_htonl(sizeof(out));
		ph.next = IPPROTO_TCP;
		__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
		out.check = fold(bpf_csum_diff(NULL, 0, (__be32 *)&out, sizeof(out), (__u32)sum));
		if (bpf_skb_store_bytes(skb, p->l3, &ip6, sizeof(ip6), 0))
			return TC_ACT_SHOT;
	}
	if (bpf_skb_store_bytes(skb, p->l4, &out, sizeof(out), 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

struct icmp4_error {
	__u8 type;
	__u8 code;
	__u16 check;
	__u32 unused;
	struct iphdr original;
	__u8 original_l4[8];
};

struct icmp6_error {
	__u8 type;
	__u8 code;
	__u16 check;
	__u32 unused;
	struct ipv6hdr original;
	__u8 original_l4[8];
};

/* ICMP (v6) port unreachable about `p`, from the address it was sent to, back out of the
 * interface it came in by: what a closed UDP port answers. */
static __always_inline int forge_unreachable(struct __sk_buff *skb, const struct packet *p)
{
	if (!p->v6) {
		struct icmp4_error icmp;
		__builtin_memset(&icmp, 0, sizeof(icmp));
		if (bpf_skb_load_bytes(skb, p->l3, &icmp.original, sizeof(icmp.original)) ||
		    bpf_skb_load_bytes(skb, p->l4, icmp.original_l4, sizeof(icmp.original_l4)))
			return TC_ACT_SHOT;
		icmp.type = 3; /* destination unreachable */
		icmp.code = 3; /* port unreachable */
		icmp.check = fold(bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), 0));
		struct iphdr ip;
		__builtin_memset(&ip, 0, sizeof(ip));
		ip.version = 4;
		ip.ihl = 5;
		ip.tot_len = bpf_htons(sizeof(ip) + sizeof(icmp));
		ip.ttl = 64;
		ip.protocol = IPPROTO_ICMP;
		ip.saddr = ((const __u32 *)p->flow.dst)[3];
		ip.daddr = ((const __u32 *)p->flow.src)[3];
		ip.check = fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));
		if (bpf_skb_change_tail(skb, p->l3 + sizeof(ip) + sizeof(icmp), 0) || swap_macs(skb) ||
		    bpf_skb_store_bytes(skb, p->l3, &ip, sizeof(ip), 0) ||
		    bpf_skb_store_bytes(skb, p->l3 + sizeof(ip), &icmp, sizeof(icmp), 0))
			return TC_ACT_SHOT;
	} else {
		struct icmp6_error icmp;
		__builtin_memset(&icmp, 0, sizeof(icmp));
		if (bpf_skb_load_bytes(skb, p->l3, &icmp.original, sizeof(icmp.original)) ||
		    bpf_skb_load_bytes(skb, p->l4, icmp.original_l4, sizeof(icmp.original_l4)))
			return TC_ACT_SHOT;
		icmp.type = 1; /* destination unreachable */
		icmp.code = 4; /* port unreachable */
		struct pseudo6 ph;
		__builtin_memset(&ph, 0, sizeof(ph));
		__builtin_memcpy(ph.src, p->flow.dst, 16);
		__builtin_memcpy(ph.dst, p->flow.src, 16);
		ph.len = bpf_htonl(sizeof(icmp));
		ph.next = 58; /* ICMPv6 */
		__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
		icmp.check = fold(bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), (__u32)sum));
		struct ipv6hdr ip6;
		__builtin_memset(&ip6, 0, sizeof(ip6));
		ip6.version = 6;
		ip6.payload_len = bpf_htons(sizeof(icmp));
		ip6.nexthdr = 58;
		ip6.hop_limit = 64;
		__builtin_memcpy(&ip6.saddr, p->flow.dst, 16);
		__builtin_memcpy(&ip6.daddr, p->flow.src, 16);
		if (bpf_skb_change_tail(skb, p->l3 + sizeof(ip6) + sizeof(icmp), 0) || swap_macs(skb) ||
		    bpf_skb_store_bytes(skb, p->l3, &ip6, sizeof(ip6), 0) ||
		    bpf_skb_store_bytes(skb, p->l3 + sizeof(ip6), &icmp, sizeof(icmp), 0))
			return TC_ACT_SHOT;
	}
	return bpf_redirect(skb->ifindex, 0);
}

/* Whether `addr` is one of the node's addresses the tc program knows (its SNAT source). */
static __always_inline int is_node_address(const __u8 *addr)
{
	__u32 zero = 0;
	struct tc_config *cfg = bpf_map_lookup_elem(&svcplane_tc_config, &zero);
	if (!cfg)
		return 0;
	const __u32 *a = (const __u32 *)addr, *v4 = (const __u32 *)cfg->node_v4, *v6 = (const __u32 *)cfg->node_v6;
	return (a[0] == v4[0] && a[1] == v4[1] && a[2] == v4[2] && a[3] == v4[3]) ||
	       (a[0] == v6[0] && a[1] == v6[1] && a[2] == v6[2] && a[3] == v6[3]);
}

/* Rewrites the 20-byte IPv4 header at `l3` with `ihl` words and `delta` more bytes in all,
 * its checksum over the header and `options` (`options_len` bytes, 0 or DSR_OPT4_LEN). */
static __always_inline int rewrite_ip4_header(struct __sk_buff *skb, __u32 l3, __u8 ihl, int delta,
					      struct dsr_opt4 *options, __u32 options_len)
{
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)))
		return -1;
	ip.ihl = ihl;
	ip.tot_len = bpf_htons((__u16)(bpf_ntohs(ip.tot_len) + delta));
	ip.check = 0;
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0);
	if (options_len)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)options, DSR_OPT4_LEN, (__u32)sum);
	ip.check = fold(sum);
	return bpf_skb_store_bytes(skb, l3, &ip, sizeof(ip), 0);
}

/* A new external flow to another node's endpoint, in direct-server-return mode: DNAT only
 * (the client's address stays), the Service address and port in an IPv4 option or an IPv6
 * destination-options header, out by the route to the endpoint. Later packets of the flow go without the option: the endpoint's
 * node keeps what it learned from the first. */
static __always_inline int dsr_forward(struct __sk_buff *skb, const struct packet *p, const struct nat *forward,
				       const struct svc_key *frontend)
{
	if (rewrite(skb, p, 1, p->flow.dst, forward->dst, p->flow.dport, forward->dport))
		return TC_ACT_SHOT;
	if (p->v6) {
		struct dsr_ext6 ext = {
			.next_header = p->flow.proto,
			.length = DSR_EXT6_LEN / 8 - 1,
			.type = DSR_OPT6_TYPE,
			.option_len = 18,
			.port = frontend->port,
			.padn_type = 1,
		};
		__builtin_memcpy(ext.addr, frontend->addr, 16);
		struct ipv6hdr ip6;
		/* Room right after the fixed 40-byte header, where extension headers go. */
		if (bpf_skb_load_bytes(skb, p->l3, &ip6, sizeof(ip6)) ||
		    bpf_skb_adjust_room(skb, DSR_EXT6_LEN, BPF_ADJ_ROOM_NET, 0) ||
		    bpf_skb_store_bytes(skb, p->l3 + sizeof(ip6), &ext, DSR_EXT6_LEN, 0))
			return TC_ACT_SHOT;
		ip6.nexthdr = IPPROTO_DSTOPTS_NUMBER;
		ip6.payload_len = bpf_htons((__u16)(bpf_ntohs(ip6.payload_len) + DSR_EXT6_LEN));
		if (bpf_skb_store_bytes(skb, p->l3, &ip6, sizeof(ip6), 0))
			return TC_ACT_SHOT;
		return redirect_to_route(skb, p, forward);
	}
	struct dsr_opt4 option = {
		.type = DSR_OPT4_TYPE,
		.len = DSR_OPT4_LEN,
		.port = frontend->port,
		.addr = ((const __u32 *)frontend->addr)[3],
	};
	/* Room right after the fixed 20-byte header, where options go. */
	if (bpf_skb_adjust_room(skb, DSR_OPT4_LEN, BPF_ADJ_ROOM_NET, 0) ||
	    bpf_skb_store_bytes(skb, p->l3 + sizeof(struct iphdr), &option, DSR_OPT4_LEN, 0) ||
	    rewrite_ip4_header(skb, p->l3, 7, DSR_OPT4_LEN, &option, DSR_OPT4_LEN))
		return TC_ACT_SHOT;
	return redirect_to_route(skb, p, forward);
}

/* A packet that another node sent here in direct-server-return mode, IPv4 with the option:
 * the endpoint's reply is to leave from the Service address, so its translation is
 * remembered (as a reply entry, which the pod's veth finds), and the option is removed
 * before the packet goes on to the pod. Returns -1 for any other packet. */
static __always_inline int dsr_arrival6(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_DSTOPTS_NUMBER)
		return -1;
	struct dsr_ext6 *ext = (void *)(ip6 + 1);
	__u16 *ports = (void *)(ext + 1);
	if ((void *)(ports + 2) > end || ext->type != DSR_OPT6_TYPE || ext->option_len != 18 ||
	    ext->length != DSR_EXT6_LEN / 8 - 1)
		return -1;
	__u8 proto = ext->next_header;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return -1;
	struct flow reply;
	__builtin_memset(&reply, 0, sizeof(reply));
	__builtin_memcpy(reply.src, &ip6->daddr, 16);
	__builtin_memcpy(reply.dst, &ip6->saddr, 16);
	reply.sport = ports[1];
	reply.dport = ports[0];
	reply.proto = proto;
	struct nat back;
	__builtin_memset(&back, 0, sizeof(back));
	__builtin_memcpy(back.src, ext->addr, 16);
	back.sport = ext->port;
	__builtin_memcpy(back.dst, &ip6->saddr, 16);
	back.dport = ports[0];
	if (bpf_map_update_elem(&svcplane_ct, &reply, &back, BPF_ANY))
		return TC_ACT_SHOT;
	struct ipv6hdr header = *ip6;
	header.nexthdr = proto;
	header.payload_len = bpf_htons((__u16)(bpf_ntohs(header.payload_len) - DSR_EXT6_LEN));
	__u32 l3 = sizeof(struct ethhdr);
	if (bpf_skb_adjust_room(skb, -DSR_EXT6_LEN, BPF_ADJ_ROOM_NET, 0) ||
	    bpf_skb_store_bytes(skb, l3, &header, sizeof(header), 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

static __always_inline int dsr_arrival(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return dsr_arrival6(skb);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 7 || (ip->frag_off & bpf_htons(0x3fff)))
		return -1;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return -1;
	struct dsr_opt4 *option = (void *)(ip + 1);
	__u16 *ports = (void *)(option + 1);
	if ((void *)(ports + 2) > end || option->type != DSR_OPT4_TYPE || option->len != DSR_OPT4_LEN)
		return -1;
	struct flow reply;
	__builtin_memset(&reply, 0, sizeof(reply));
	v4_mapped(reply.src, ip->daddr);
	v4_mapped(reply.dst, ip->saddr);
	reply.sport = ports[1];
	reply.dport = ports[0];
	reply.proto = ip->protocol;
	struct nat back;
	__builtin_memset(&back, 0, sizeof(back));
	v4_mapped(back.src, option->addr);
	back.sport = option->port;
	v4_mapped(back.dst, ip->saddr);
	back.dport = ports[0];
	if (bpf_map_update_elem(&svcplane_ct, &reply, &back, BPF_ANY))
		return TC_ACT_SHOT;
	__u32 l3 = sizeof(struct ethhdr);
	if (bpf_skb_adjust_room(skb, -DSR_OPT4_LEN, BPF_ADJ_ROOM_NET, 0) ||
	    rewrite_ip4_header(skb, l3, 5, -DSR_OPT4_LEN, NULL, 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* A new flow to a frontend: translate it and remember both directions. */
static __always_inline int new_flow(struct __sk_buff *skb, const struct packet *p)
{
	struct svc_key key = { .port = p->flow.dport, .proto = p->flow.proto, .scope = scope_of(p) };
	__builtin_memcpy(key.addr, p->flow.dst, 16);
	struct svc_value *svc = bpf_map_lookup_elem(&svcplane_services, &key);
	if (!svc)
		return TC_ACT_OK;
	__u32 flags = svc->flags;
	if ((flags & SVC_F_SOURCE_RANGES) && !source_allowed(p))
		return TC_ACT_SHOT;
	/* No endpoint at all: refused as a closed port would be (a reset, ICMP port
	 * unreachable), by the node's own stack when the address is the node's. */
	if (flags & SVC_F_REJECT) {
		if (is_node_address(p->flow.dst))
			return TC_ACT_OK;
		return p->flow.proto == IPPROTO_TCP ? forge_reset(skb, p) : forge_unreachable(skb, p);
	}
	if (flags & SVC_F_DROP)
		return TC_ACT_SHOT;
	struct backend_value *backend = pick(p, svc);
	if (!backend)
		return TC_ACT_SHOT;
	__u32 zero = 0;
	struct tc_config *cfg = bpf_map_lookup_elem(&svcplane_tc_config, &zero);
	if (!cfg)
		return TC_ACT_SHOT;
	/* Direct server return replaces the SNAT that external traffic would get. */
	int dsr = (cfg->flags & TC_F_DSR) && (flags & SVC_F_MASQ) && key.scope == SCOPE_EXTERNAL;
	int masq = (flags & SVC_F_MASQ) && !dsr;
	int remote = !(backend->pad & BACKEND_F_LOCAL);

	struct nat forward;
	__builtin_memset(&forward, 0, sizeof(forward));
	__builtin_memcpy(forward.dst, backend->addr, 16);
	forward.dport = backend->port;
	__builtin_memcpy(forward.src, p->flow.src, 16);
	forward.sport = p->flow.sport;
	forward.port_id = p->flow.proto == IPPROTO_UDP ? svc->port_id : 0;
	forward.forward = 1;
	forward.last_seen_s = (__u32)(bpf_ktime_get_ns() / NS_PER_SEC);
	if (masq)
		__builtin_memcpy(forward.src, p->v6 ? cfg->node_v6 : cfg->node_v4, 16);

	/* The reply's tuple, as it will arrive: from the endpoint to the (translated) source.
	 * A source port already taken towards this endpoint is moved. */
	struct flow reply;
	__builtin_memset(&reply, 0, sizeof(reply));
	__builtin_memcpy(reply.src, forward.dst, 16);
	__builtin_memcpy(reply.dst, forward.src, 16);
	reply.sport = forward.dport;
	reply.proto = p->flow.proto;
	struct nat back;
	__builtin_memset(&back, 0, sizeof(back));
	__builtin_memcpy(back.src, p->flow.dst, 16);
	__builtin_memcpy(back.dst, p->flow.src, 16);
	back.sport = p->flow.dport;
	back.dport = p->flow.sport;
	int stored = -1;
	for (int attempt = 0; attempt < 8 && stored; attempt++) {
		if (attempt > 0) {
			if (!masq)
				break;
			forward.sport = bpf_htons(32768 + (bpf_get_prandom_u32() % 28232));
		}
		reply.dport = forward.sport;
		stored = bpf_map_update_elem(&svcplane_ct, &reply, &back, BPF_NOEXIST);
	}
	if (stored) {
		/* The same reply tuple from an earlier flow of this very client: take it over. */
		if (bpf_map_update_elem(&svcplane_ct, &reply, &back, BPF_ANY))
			return TC_ACT_SHOT;
	}
	if (bpf_map_update_elem(&svcplane_ct, &p->flow, &forward, BPF_ANY))
		return TC_ACT_SHOT;
	count_connection(svc->port_id, backend);
	if (dsr && remote)
		return dsr_forward(skb, p, &forward, &key);
	return translate(skb, p, &forward);
}

SEC("classifier")
int svcplane_tc_ingress(struct __sk_buff *skb)
{
	int arrived = dsr_arrival(skb);
	if (arrived >= 0)
		return arrived;
	struct packet p;
	if (!parse(skb, &p))
		return TC_ACT_OK;
	/* A packet of a tracked flow, either direction: its translation is known. */
	struct nat *known = bpf_map_lookup_elem(&svcplane_ct, &p.flow);
	if (known) {
		struct nat to = *known;
		/* A UDP flow whose endpoint stopped serving or that fell silent is balanced afresh;
		 * so is a TCP SYN that reuses the ports of a connection long gone (the entry
		 * outlived it). Only UDP forward entries carry a port id. */
		__u32 now_s = (__u32)(bpf_ktime_get_ns() / NS_PER_SEC);
		int udp_forward = to.port_id != 0;
		int idle = udp_forward && now_s - to.last_seen_s > UDP_FLOW_IDLE_S;
		if (!idle && (!udp_forward || still_serving(&to)) && !(to.forward && is_new_connection(skb, &p))) {
			/* One write a second at most per flow, not one per datagram. */
			if (udp_forward && to.last_seen_s != now_s)
				known->last_seen_s = now_s;
			return translate(skb, &p, &to);
		}
		bpf_map_delete_elem(&svcplane_ct, &p.flow);
	}
	return new_flow(skb, &p);
}
