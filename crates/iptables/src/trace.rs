//! Walks a new connection's first packet through the fake's tables the way netfilter would
//! and reports every outcome it can have, like kube-proxy's `tracePacket`.
//!
//! Hooks run their tables in the kernel's order (`raw`, `mangle`, `nat`, `filter` before
//! routing; `mangle`, `filter`, `nat` after). `-m statistic` is explored both ways, so a
//! load-balancing cascade yields one outcome per endpoint. `-m recent` is not modelled: no
//! source was seen before, so `--rcheck` never matches and `--set` always does.
//! `-m addrtype LOCAL` asks the [`Host`]'s address list. Anything the tracer does not
//! understand (an unknown match or target, a missing chain, DNAT where the kernel would
//! refuse it, a jump loop) fails the trace instead of passing silently.

use std::collections::BTreeSet;

use crate::fake::{FakeIptables, FakeTable};
use crate::model::{Arg, CtState, Family, Match, Rule, Table, Target};

pub use svcplane_net::trace::{Disposition, Host, Origin, Outcome, Packet};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("{table} chain {chain}: jump to {target}, which is no chain of the table")]
    MissingChain { table: Table, chain: String, target: String },
    #[error("{table} chain {chain}: the tracer does not understand {what}")]
    Unknown { table: Table, chain: String, what: String },
    #[error("{table} chain {chain}: {target} is not allowed from hook {hook}")]
    NotAllowedHere { table: Table, chain: String, target: &'static str, hook: &'static str },
    #[error("{table} chain {chain}: jumps nest deeper than the kernel allows (loop?)")]
    TooDeep { table: Table, chain: String },
}

const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PathState {
    packet: Packet,
    masquerade: bool,
}

/// What a rule's target did for a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Go on with the next rule of the same chain.
    NextRule,
    /// The chain is done with this path.
    Done(Flow),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Fell off a user chain or returned: the caller continues.
    Continue,
    Accept,
    Drop,
    Reject,
}

struct Tracer<'a> {
    table: &'a FakeTable,
    host: &'a Host,
    hook: &'static str,
}

/// Every outcome `packet` can have, through the `family` tables of `iptables`.
pub fn trace(
    iptables: &FakeIptables,
    family: Family,
    host: &Host,
    origin: Origin,
    packet: Packet,
) -> Result<BTreeSet<Outcome>, TraceError> {
    use Table::{Filter, Mangle, Nat, Raw};
    let before_routing: &[(Table, &'static str)] = match origin {
        Origin::Network => &[(Raw, "PREROUTING"), (Mangle, "PREROUTING"), (Nat, "PREROUTING")],
        Origin::LocalProcess => &[(Raw, "OUTPUT"), (Mangle, "OUTPUT"), (Nat, "OUTPUT"), (Filter, "OUTPUT")],
    };
    let mut outcomes = BTreeSet::new();
    let start = PathState { packet, masquerade: false };
    for state in run_steps(iptables, family, host, before_routing, vec![start], &mut outcomes)? {
        let local = host.is_local(state.packet.destination);
        // Locally sent packets pass POSTROUTING even on their way to a local socket.
        let after_routing: &[(Table, &'static str)] = match (origin, local) {
            (Origin::Network, true) => &[(Mangle, "INPUT"), (Filter, "INPUT"), (Nat, "INPUT")],
            (Origin::Network, false) => {
                &[(Mangle, "FORWARD"), (Filter, "FORWARD"), (Mangle, "POSTROUTING"), (Nat, "POSTROUTING")]
            }
            (Origin::LocalProcess, true) => {
                &[(Mangle, "POSTROUTING"), (Nat, "POSTROUTING"), (Mangle, "INPUT"), (Filter, "INPUT")]
            }
            (Origin::LocalProcess, false) => &[(Mangle, "POSTROUTING"), (Nat, "POSTROUTING")],
        };
        for state in run_steps(iptables, family, host, after_routing, vec![state], &mut outcomes)? {
            outcomes.insert(Outcome {
                disposition: if local { Disposition::DeliveredLocally } else { Disposition::Forwarded },
                destination: state.packet.destination,
                destination_port: state.packet.destination_port,
                masqueraded: state.masquerade,
            });
        }
    }
    Ok(outcomes)
}

fn run_steps(
    iptables: &FakeIptables,
    family: Family,
    host: &Host,
    steps: &[(Table, &'static str)],
    mut states: Vec<PathState>,
    outcomes: &mut BTreeSet<Outcome>,
) -> Result<Vec<PathState>, TraceError> {
    for &(table, hook) in steps {
        let Some(fake) = iptables.table(family, table) else { continue };
        let tracer = Tracer { table: fake, host, hook };
        let mut next = Vec::new();
        for state in states {
            for (state, flow) in tracer.run_chain(hook, state, 0)? {
                let flow = match flow {
                    // Falling off a built-in chain applies its policy.
                    Flow::Continue if fake.chain(hook).and_then(|c| c.policy.as_deref()) == Some("DROP") => Flow::Drop,
                    other => other,
                };
                match flow {
                    Flow::Continue | Flow::Accept => next.push(state),
                    Flow::Drop | Flow::Reject => {
                        outcomes.insert(Outcome {
                            disposition: if flow == Flow::Drop { Disposition::Dropped } else { Disposition::Rejected },
                            destination: state.packet.destination,
                            destination_port: state.packet.destination_port,
                            masqueraded: state.masquerade,
                        });
                    }
                }
            }
        }
        states = next;
    }
    Ok(states)
}

impl Tracer<'_> {
    fn unknown(&self, chain: &str, what: String) -> TraceError {
        TraceError::Unknown { table: self.table.table(), chain: chain.to_owned(), what }
    }

    fn run_chain(&self, chain: &str, state: PathState, depth: usize) -> Result<Vec<(PathState, Flow)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError::TooDeep { table: self.table.table(), chain: chain.to_owned() });
        }
        let rules = self.table.rules(chain).ok_or_else(|| TraceError::MissingChain {
            table: self.table.table(),
            chain: self.hook.to_owned(),
            target: chain.to_owned(),
        })?;
        let mut walking = vec![(0usize, state)];
        let mut finished = Vec::new();
        while let Some((index, state)) = walking.pop() {
            let Some(rule) = rules.get(index) else {
                finished.push((state, Flow::Continue));
                continue;
            };
            for (state, matched) in self.evaluate(chain, rule, state)? {
                if !matched {
                    walking.push((index + 1, state));
                    continue;
                }
                for (state, step) in self.apply_target(chain, rule.target.as_ref(), state, depth)? {
                    match step {
                        Step::NextRule => walking.push((index + 1, state)),
                        Step::Done(flow) => finished.push((state, flow)),
                    }
                }
            }
        }
        Ok(finished)
    }

    /// Whether the rule matches, per path (`-m statistic` forks).
    fn evaluate(&self, chain: &str, rule: &Rule, state: PathState) -> Result<Vec<(PathState, bool)>, TraceError> {
        let packet = &state.packet;
        let mut forks: Vec<bool> = vec![true];
        for arg in &rule.args {
            let holds = match arg {
                Arg::Source(m) => m.matches(packet.source),
                Arg::Destination(m) => m.matches(packet.destination),
                Arg::Protocol(p) => packet.protocol == p.number(),
                Arg::Match(m) => match m {
                    Match::Comment(_) => true,
                    Match::Port { protocol, destination_port } => {
                        packet.protocol == protocol.number()
                            && destination_port.is_none_or(|t| (packet.destination_port == t.port) != t.negate)
                    }
                    Match::AddrType { source, destination } => {
                        source.is_none_or(|t| self.host.is_local(packet.source) != t.negate)
                            && destination.is_none_or(|t| self.host.is_local(packet.destination) != t.negate)
                    }
                    Match::Statistic(p) => {
                        let (can_pass, can_fail) = p.outcomes();
                        let mut next = Vec::new();
                        for alive in forks {
                            if alive && can_pass {
                                next.push(true);
                            }
                            if alive && can_fail {
                                next.push(false);
                            }
                            if !alive {
                                next.push(false);
                            }
                        }
                        forks = next;
                        continue;
                    }
                    Match::Recent(recent) => matches!(recent.action, crate::model::RecentAction::Set),
                    Match::Mark { negate, value, mask } => ((packet.mark & mask) == *value) != *negate,
                    Match::Conntrack { negate, states } => states.contains(&CtState::New) != *negate,
                    Match::Other { module, .. } => return Err(self.unknown(chain, format!("-m {module}"))),
                },
                Arg::DestinationPort(_) => {
                    return Err(self.unknown(chain, "--dport outside its port match".to_owned()));
                }
                Arg::Other(words) => return Err(self.unknown(chain, words.join(" "))),
            };
            if !holds {
                forks.iter_mut().for_each(|alive| *alive = false);
            }
        }
        forks.sort();
        forks.dedup();
        Ok(forks.into_iter().map(|holds| (state, holds)).collect())
    }

    fn require(&self, chain: &str, target: &'static str, table: Table, hooks: &[&str]) -> Result<(), TraceError> {
        if self.table.table() == table && hooks.contains(&self.hook) {
            Ok(())
        } else {
            Err(TraceError::NotAllowedHere {
                table: self.table.table(),
                chain: chain.to_owned(),
                target,
                hook: self.hook,
            })
        }
    }

    fn apply_target(
        &self,
        chain: &str,
        target: Option<&Target>,
        mut state: PathState,
        depth: usize,
    ) -> Result<Vec<(PathState, Step)>, TraceError> {
        let Some(target) = target else { return Ok(vec![(state, Step::NextRule)]) };
        Ok(match target {
            Target::Accept => vec![(state, Step::Done(Flow::Accept))],
            Target::Drop => vec![(state, Step::Done(Flow::Drop))],
            Target::Return => vec![(state, Step::Done(Flow::Continue))],
            Target::Reject(_) => {
                self.require(chain, "REJECT", Table::Filter, &["INPUT", "FORWARD", "OUTPUT"])?;
                vec![(state, Step::Done(Flow::Reject))]
            }
            Target::Dnat(address) => {
                self.require(chain, "DNAT", Table::Nat, &["PREROUTING", "OUTPUT"])?;
                state.packet.destination = address.ip();
                state.packet.destination_port = address.port();
                vec![(state, Step::Done(Flow::Accept))]
            }
            Target::Masquerade { .. } => {
                self.require(chain, "MASQUERADE", Table::Nat, &["POSTROUTING"])?;
                state.masquerade = true;
                vec![(state, Step::Done(Flow::Accept))]
            }
            Target::Mark(op) => {
                state.packet.mark = op.apply(state.packet.mark);
                vec![(state, Step::NextRule)]
            }
            Target::Jump(next) | Target::Goto(next) => {
                if self.table.table().is_builtin(next) || !self.table.has_chain(next) {
                    return Err(TraceError::MissingChain {
                        table: self.table.table(),
                        chain: chain.to_owned(),
                        target: next.clone(),
                    });
                }
                // The called chain falling off (or returning) continues with the next
                // rule after a jump, but ends this chain too after a goto.
                let is_goto = matches!(target, Target::Goto(_));
                self.run_chain(next, state, depth + 1)?
                    .into_iter()
                    .map(|(state, flow)| match flow {
                        Flow::Continue if !is_goto => (state, Step::NextRule),
                        other => (state, Step::Done(other)),
                    })
                    .collect()
            }
            Target::Other { name, .. } => return Err(self.unknown(chain, format!("-j {name}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Iptables;
    use crate::model::{Probability, Protocol};
    use crate::restore::RestoreTable;

    fn packet() -> Packet {
        Packet {
            source: "198.18.0.101".parse().unwrap(),
            destination: "198.19.0.10".parse().unwrap(),
            protocol: 6,
            source_port: 40000,
            destination_port: 80,
            mark: 0,
        }
    }

    fn dnat(last: u8) -> Rule {
        Rule::new().protocol(Protocol::Tcp).target(Target::Dnat(format!("198.18.129.{last}:8080").parse().unwrap()))
    }

    #[test]
    fn a_statistic_cascade_of_three_yields_three_outcomes() {
        let mut fake = FakeIptables::new();
        let mut input = RestoreTable::new(Table::Nat);
        input.declare("SVC");
        for (i, last) in [1u8, 2, 3].into_iter().enumerate() {
            let mut rule = dnat(last);
            if i < 2 {
                rule.args.insert(0, Arg::Match(Match::Statistic(Probability::one_in(3 - i))));
            }
            input.append("SVC", rule);
        }
        input.append("PREROUTING", Rule::new().jump("SVC"));
        fake.restore(Family::V4, &input).unwrap();
        let outcomes = trace(&fake, Family::V4, &Host::default(), Origin::Network, packet()).unwrap();
        let destinations: Vec<String> = outcomes.iter().map(|o| o.destination.to_string()).collect();
        assert_eq!(destinations, ["198.18.129.1", "198.18.129.2", "198.18.129.3"]);
    }

    #[test]
    fn an_unknown_match_fails_the_trace() {
        let mut fake = FakeIptables::new();
        fake.load(
            Family::V4,
            "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m set --match-set X dst -j ACCEPT\nCOMMIT\n",
        )
        .unwrap();
        let error = trace(&fake, Family::V4, &Host::default(), Origin::Network, packet()).unwrap_err();
        assert!(matches!(error, TraceError::Unknown { .. }), "{error}");
    }

    #[test]
    fn a_packet_nothing_touches_is_forwarded_unchanged() {
        let fake = FakeIptables::new();
        let outcomes = trace(&fake, Family::V4, &Host::default(), Origin::Network, packet()).unwrap();
        assert_eq!(outcomes.len(), 1);
        assert_eq!(outcomes.first().unwrap().disposition, Disposition::Forwarded);
    }

    #[test]
    fn a_drop_policy_drops_what_falls_off_the_chain() {
        let mut fake = FakeIptables::new();
        fake.load(Family::V4, "*filter\n:FORWARD DROP [0:0]\nCOMMIT\n").unwrap();
        let outcomes = trace(&fake, Family::V4, &Host::default(), Origin::Network, packet()).unwrap();
        assert_eq!(outcomes.first().unwrap().disposition, Disposition::Dropped);
    }
}
