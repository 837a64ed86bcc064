//! `svcplane top`: the mode's kernel counters, read every interval, summed and ordered by
//! `svcplane_core::counters`, printed as a refreshing table or one JSON object per refresh.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use svcplane_core::Protocol;
use svcplane_core::counters::{Bounded, ServiceCounter, bounded, by_service, merge};

use crate::cli::{Output, TopArgs};
use crate::modes;

type Key = (String, Protocol, SocketAddr);

pub fn run(args: &TopArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let mut dataplane = modes::for_counters(args.mode, args.iptables_backend, &args.bpf_root);
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let terminal = std::io::stdout().is_terminal();
    let mut previous: BTreeMap<Key, u64> = BTreeMap::new();
    let mut refresh = 0u64;
    while args.count.is_none_or(|count| refresh < count) && !stop.load(Ordering::Relaxed) {
        if refresh > 0 {
            let until = Instant::now() + interval;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let counters = merge(dataplane.counters().map_err(anyhow::Error::from_boxed)?);
        let services = by_service(&counters);
        let now: BTreeMap<Key, u64> =
            counters.iter().map(|c| ((c.service_port.clone(), c.protocol, c.endpoint), c.connections)).collect();
        let shown = bounded(counters, args.max_series);
        let mut out = std::io::stdout().lock();
        match args.output {
            Output::Json => writeln!(
                out,
                "{}",
                to_json(dataplane.mode(), &services[..services.len().min(args.max_series)], &shown)
            )?,
            Output::Text => {
                if terminal {
                    write!(out, "\x1b[H\x1b[2J")?;
                }
                write!(out, "{}", table(dataplane.mode(), &services, &shown, &previous, refresh > 0, args.max_series))?;
            }
        }
        out.flush()?;
        previous = now;
        refresh += 1;
    }
    Ok(())
}

fn to_json(mode: &str, services: &[ServiceCounter], shown: &Bounded) -> serde_json::Value {
    json!({
        "mode": mode,
        "services": services.iter().map(|s| json!({
            "servicePort": s.service_port,
            "protocol": s.protocol.as_str(),
            "connections": s.connections,
            "endpoints": s.endpoints,
        })).collect::<Vec<_>>(),
        "endpoints": shown.series.iter().map(|c| json!({
            "servicePort": c.service_port,
            "protocol": c.protocol.as_str(),
            "endpoint": c.endpoint.to_string(),
            "connections": c.connections,
        })).collect::<Vec<_>>(),
        "omittedSeries": shown.omitted,
        "omittedConnections": shown.omitted_connections,
    })
}

fn table(
    mode: &str,
    services: &[ServiceCounter],
    shown: &Bounded,
    previous: &BTreeMap<Key, u64>,
    has_previous: bool,
    max_series: usize,
) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    let _ = writeln!(text, "svcplane top ({mode} mode): new connections per Service and endpoint, busiest first\n");
    let _ = writeln!(text, "{:<48} {:<5} {:>9} {:>12}", "SERVICE PORT", "PROTO", "ENDPOINTS", "CONNECTIONS");
    for service in services.iter().take(max_series) {
        let _ = writeln!(
            text,
            "{:<48} {:<5} {:>9} {:>12}",
            service.service_port,
            service.protocol.as_str(),
            service.endpoints,
            service.connections
        );
    }
    let _ =
        writeln!(text, "\n{:<48} {:<5} {:<28} {:>12} {:>8}", "SERVICE PORT", "PROTO", "ENDPOINT", "CONNECTIONS", "NEW");
    for counter in &shown.series {
        let key = (counter.service_port.clone(), counter.protocol, counter.endpoint);
        let new = if has_previous {
            counter.connections.saturating_sub(previous.get(&key).copied().unwrap_or(0)).to_string()
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            text,
            "{:<48} {:<5} {:<28} {:>12} {:>8}",
            counter.service_port,
            counter.protocol.as_str(),
            counter.endpoint.to_string(),
            counter.connections,
            new
        );
    }
    if shown.omitted > 0 {
        let _ = writeln!(
            text,
            "({} more endpoint series, {} connections; --max-series raises the cap)",
            shown.omitted, shown.omitted_connections
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcplane_core::counters::EndpointCounter;

    fn counter(endpoint: &str, connections: u64) -> EndpointCounter {
        EndpointCounter {
            service_port: "default/echo:http".into(),
            protocol: Protocol::Tcp,
            endpoint: endpoint.parse().unwrap(),
            connections,
        }
    }

    #[test]
    fn the_table_lists_services_and_endpoints_busiest_first_with_new_connections_since_the_last_refresh() {
        let counters = merge([counter("198.18.129.1:8080", 2), counter("198.18.129.2:8080", 9)]);
        let services = by_service(&counters);
        let previous = BTreeMap::from([(
            ("default/echo:http".to_owned(), Protocol::Tcp, "198.18.129.2:8080".parse().unwrap()),
            4,
        )]);
        let text = table("nftables", &services, &bounded(counters, 1), &previous, true, 10);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.iter().any(|l| l.starts_with("default/echo:http") && l.contains(" 2 ") && l.ends_with("11")));
        let endpoint = lines.iter().find(|l| l.contains("198.18.129.2:8080")).expect("the busiest endpoint");
        assert!(endpoint.ends_with(" 5"), "{endpoint}");
        assert!(!text.contains("198.18.129.1:8080"));
        assert!(text.contains("(1 more endpoint series, 2 connections; --max-series raises the cap)"));
    }

    #[test]
    fn the_json_names_every_service_and_the_series_left_out() {
        let counters = merge([counter("198.18.129.1:8080", 2), counter("198.18.129.2:8080", 9)]);
        let json = to_json("iptables", &by_service(&counters), &bounded(counters, 1));
        assert_eq!(json["services"][0]["connections"], 11);
        assert_eq!(json["endpoints"].as_array().map(Vec::len), Some(1));
        assert_eq!(json["omittedSeries"], 1);
    }
}
