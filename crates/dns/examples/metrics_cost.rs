//! What counting one query costs on the hot path: `DnsMetrics::request` + `response` and the
//! two clock reads the handler adds, in nanoseconds per query, on one thread and on two
//! threads counting into the same series at once (the contended worst case).
//!
//!     cargo run --release -p svcplane-dns --example metrics_cost

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use svcplane_dns::metrics::{DnsMetrics, Proto, Source};

const QUERIES: u64 = 20_000_000;

fn count(metrics: &DnsMetrics, queries: u64) {
    for i in 0..queries {
        let started = Instant::now();
        let query_type = Some(if i % 4 == 1 { 33 } else { 1 });
        metrics.request(Proto::Udp, false, black_box(query_type), black_box(40));
        let rcode = if i % 4 == 2 { 3 } else { 0 };
        metrics.response(query_type, black_box(rcode), Source::Kubernetes, started.elapsed());
    }
}

fn main() {
    let metrics = Arc::new(DnsMetrics::new("127.0.0.1:53".parse().unwrap()));
    let started = Instant::now();
    count(&metrics, QUERIES);
    let one = started.elapsed();
    let started = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let metrics = Arc::clone(&metrics);
            std::thread::spawn(move || count(&metrics, QUERIES))
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let two = started.elapsed();
    let per = |d: Duration, n: u64| d.as_nanos() as f64 / n as f64;
    println!("one thread:  {:.1} ns per query ({QUERIES} queries in {one:?})", per(one, QUERIES));
    println!("two threads: {:.1} ns per query per thread ({} queries in {two:?})", per(two, QUERIES), 2 * QUERIES);
    assert_eq!(metrics.responses_with("NXDOMAIN"), 3 * QUERIES / 4);
}
