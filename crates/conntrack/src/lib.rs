//! The conntrack mechanism: deletes UDP conntrack entries matching a [`UdpFlowFilter`]
//! through the `conntrack` program.
//!
//! It decides nothing and knows nothing of Services: which flows are stale is the caller's
//! business (svcplane's core decides it). It touches only UDP entries whose original
//! destination matches the filter and whose reply does not come from an address it is told
//! to keep.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use svcplane_net::IpFamily;

/// "Delete the UDP entries of `family` sent to `destination` (any address when `None`)
/// and `port`, whose replies do not come from one of `keep_replies_from`."
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UdpFlowFilter {
    pub family: IpFamily,
    pub destination: Option<IpAddr>,
    pub port: u16,
    pub keep_replies_from: BTreeSet<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("listing UDP flows to {destination}: {message}")]
    List { destination: String, message: String },
}

/// One UDP flow as conntrack lists it: original and reply direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpFlow {
    pub original_source: SocketAddr,
    pub original_destination: SocketAddr,
    pub reply_source: SocketAddr,
}

/// Source, destination and ports of one direction, as far as the line gave them.
type Tuple = (Option<IpAddr>, Option<IpAddr>, Option<u16>, Option<u16>);

/// Parses one line of `conntrack -L -p udp` output. Lines of other protocols, or that lack a
/// field, are not flows we can act on.
pub fn parse_udp_flow(line: &str) -> Option<UdpFlow> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "udp" {
        return None;
    }
    let mut tuples: Vec<Tuple> = Vec::new();
    for field in fields {
        let Some((name, value)) = field.split_once('=') else { continue };
        match name {
            "src" => tuples.push((value.parse().ok(), None, None, None)),
            "dst" => tuples.last_mut()?.1 = value.parse().ok(),
            "sport" => tuples.last_mut()?.2 = value.parse().ok(),
            "dport" => tuples.last_mut()?.3 = value.parse().ok(),
            _ => {}
        }
    }
    let [(Some(src), Some(dst), Some(sport), Some(dport)), (Some(reply_src), _, Some(reply_sport), _)] =
        tuples.get(..2)?
    else {
        return None;
    };
    Some(UdpFlow {
        original_source: SocketAddr::new(*src, *sport),
        original_destination: SocketAddr::new(*dst, *dport),
        reply_source: SocketAddr::new(*reply_src, *reply_sport),
    })
}

/// Runs the `conntrack` program (optionally behind a prefix such as `ip netns exec NS`).
#[derive(Debug, Clone)]
pub struct ConntrackCli {
    program: String,
    prefix: Vec<String>,
}

impl Default for ConntrackCli {
    fn default() -> Self {
        Self { program: "conntrack".to_owned(), prefix: Vec::new() }
    }
}

impl ConntrackCli {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_prefix<S: Into<String>>(mut self, prefix: impl IntoIterator<Item = S>) -> Self {
        self.prefix = prefix.into_iter().map(Into::into).collect();
        self
    }

    fn command(&self, args: &[String]) -> Command {
        let mut words = self.prefix.iter().chain(std::iter::once(&self.program));
        let mut command = Command::new(words.next().expect("a program"));
        command.args(words).args(args).env("LC_ALL", "C");
        command
    }

    /// Deletes the flows `cleanup` describes; returns how many were deleted.
    pub fn delete_udp_flows(&self, cleanup: &UdpFlowFilter) -> Result<usize, ConntrackError> {
        let family = cleanup.family.name();
        let mut args: Vec<String> =
            ["-L", "-f", family, "-p", "udp", "--orig-port-dst"].iter().map(|s| (*s).to_owned()).collect();
        args.push(cleanup.port.to_string());
        let destination = match cleanup.destination {
            Some(address) => {
                args.push("--orig-dst".into());
                args.push(address.to_string());
                format!("{}", SocketAddr::new(address, cleanup.port))
            }
            None => format!("port {} on any address", cleanup.port),
        };
        let output = self
            .command(&args)
            .output()
            .map_err(|source| ConntrackError::Spawn { program: self.program.clone(), source })?;
        // conntrack exits non-zero when nothing matched on some versions; only a message
        // other than the summary line is a failure.
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() && !stderr.contains("flow entries have been shown") {
            return Err(ConntrackError::List { destination, message: stderr.trim().to_owned() });
        }
        let mut deleted = 0;
        for flow in String::from_utf8_lossy(&output.stdout).lines().filter_map(parse_udp_flow) {
            if cleanup.keep_replies_from.contains(&flow.reply_source) {
                continue;
            }
            let delete = [
                "-D".to_owned(),
                "-f".to_owned(),
                family.to_owned(),
                "-p".to_owned(),
                "udp".to_owned(),
                "--orig-src".to_owned(),
                flow.original_source.ip().to_string(),
                "--orig-dst".to_owned(),
                flow.original_destination.ip().to_string(),
                "--orig-port-src".to_owned(),
                flow.original_source.port().to_string(),
                "--orig-port-dst".to_owned(),
                flow.original_destination.port().to_string(),
            ];
            // A flow that expired meanwhile is fine: it is gone either way.
            if let Ok(status) = self.command(&delete).output()
                && status.status.success()
            {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dnatted_udp_flow_is_read_with_its_reply_source() {
        let line = "udp      17 29 src=198.18.0.101 dst=198.19.0.10 sport=40000 dport=53 [UNREPLIED] \
                    src=198.18.129.1 dst=198.18.0.101 sport=5353 dport=40000 mark=0 use=1";
        let flow = parse_udp_flow(line).unwrap();
        assert_eq!(flow.original_source.to_string(), "198.18.0.101:40000");
        assert_eq!(flow.original_destination.to_string(), "198.19.0.10:53");
        assert_eq!(flow.reply_source.to_string(), "198.18.129.1:5353");
    }

    #[test]
    fn an_ipv6_flow_is_read_too() {
        let line = "udp      17 29 src=2001:db8::101 dst=2001:db8:f::10 sport=40000 dport=53 \
                    src=2001:db8:1:1::1 dst=2001:db8::101 sport=5353 dport=40000 mark=0 use=1";
        let flow = parse_udp_flow(line).unwrap();
        assert_eq!(flow.reply_source.to_string(), "[2001:db8:1:1::1]:5353");
    }

    #[test]
    fn lines_of_other_protocols_are_not_udp_flows() {
        let line = "tcp      6 431999 ESTABLISHED src=198.18.0.101 dst=198.19.0.10 sport=40000 dport=80 \
                    src=198.18.129.1 dst=198.18.0.101 sport=8080 dport=40000 [ASSURED] mark=0 use=1";
        assert_eq!(parse_udp_flow(line), None);
    }
}
