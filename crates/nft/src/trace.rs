//! Walks a packet through the fake's ruleset the way netfilter would and reports every
//! outcome it can have. `numgen random` tests are explored both ways, so a load-balancing
//! cascade yields one outcome per endpoint.
//!
//! Every statement and match the object model can express is interpreted; a ruleset the
//! tracer cannot follow (an unknown chain, a value of the wrong type, a jump loop) is an
//! error, never a silent pass.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::fake::{FakeNftables, FakeTable};
use crate::objects::{
    ChainType, CmpOp, ElementValue, Expr, Family, FibAddress, Hook, Match, Statement, TableName, Value, Verdict,
};

pub use svcplane_net::trace::{Disposition, Host, Origin, Outcome, Packet};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("chain {chain} in table {table} does not exist")]
    MissingChain { table: String, chain: String },
    #[error("set {set} in table {table} does not exist")]
    MissingSet { table: String, set: String },
    #[error("rule in chain {chain}: cannot compare {expr:?} with {value:?}")]
    TypeMismatch { chain: String, expr: Expr, value: Value },
    #[error("chain {chain}: jumps nest deeper than the kernel allows (loop?)")]
    TooDeep { chain: String },
    #[error("chain {chain}: {statement} is not allowed in a {chain_type:?} chain on {hook:?}")]
    NotAllowedHere { chain: String, statement: &'static str, chain_type: ChainType, hook: Hook },
}

/// The kernel refuses jump chains nested deeper than this.
const MAX_DEPTH: usize = 16;

/// Per-path state: the packet as rules have changed it so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PathState {
    packet: Packet,
    masquerade: bool,
    /// A nat chain translated the destination: as in the kernel, later nat chains on this
    /// hook (other tables' too) no longer run for the packet.
    destination_translated: bool,
}

/// How evaluating a chain ended for one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Fell off the end or returned: the caller continues.
    Continue,
    Accept,
    Drop,
    Reject,
}

struct Tracer<'a> {
    table_name: &'a TableName,
    table: &'a FakeTable,
    host: &'a Host,
    chain_type: ChainType,
    hook: Hook,
}

/// Every outcome `packet` can have, walking the tables of `family` in `nft`.
pub fn trace(
    nft: &FakeNftables,
    family: Family,
    host: &Host,
    origin: Origin,
    packet: Packet,
) -> Result<BTreeSet<Outcome>, TraceError> {
    let before_routing = match origin {
        Origin::Network => Hook::Prerouting,
        Origin::LocalProcess => Hook::Output,
    };
    let mut outcomes = BTreeSet::new();
    for state in run_hook(
        nft,
        family,
        host,
        before_routing,
        PathState { packet, masquerade: false, destination_translated: false },
        &mut outcomes,
    )? {
        let local = host.is_local(state.packet.destination);
        // Locally generated packets pass postrouting even on their way to a local socket.
        let after_routing: &[Hook] = match (origin, local) {
            (Origin::Network, true) => &[Hook::Input],
            (Origin::Network, false) => &[Hook::Forward, Hook::Postrouting],
            (Origin::LocalProcess, true) => &[Hook::Postrouting, Hook::Input],
            (Origin::LocalProcess, false) => &[Hook::Postrouting],
        };
        let mut states = vec![state];
        for &hook in after_routing {
            let mut next = Vec::new();
            for state in states {
                next.extend(run_hook(nft, family, host, hook, state, &mut outcomes)?);
            }
            states = next;
        }
        for state in states {
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

/// Runs every base chain on `hook` in priority order. Returns the paths that got through;
/// paths that were dropped or rejected are recorded in `outcomes`.
fn run_hook(
    nft: &FakeNftables,
    family: Family,
    host: &Host,
    hook: Hook,
    state: PathState,
    outcomes: &mut BTreeSet<Outcome>,
) -> Result<Vec<PathState>, TraceError> {
    let mut base_chains = Vec::new();
    for table_name in nft.table_names().into_iter().filter(|t| t.family == family) {
        let table = nft.table(table_name).expect("listed table exists");
        for chain in table.chains() {
            if let Some(base) = chain.base.filter(|b| b.hook == hook) {
                base_chains.push((base.priority, base.chain_type, table_name, table, chain.name.clone()));
            }
        }
    }
    base_chains.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.4.cmp(&b.4)));
    let mut states = vec![state];
    for (_, chain_type, table_name, table, chain) in base_chains {
        let tracer = Tracer { table_name, table, host, chain_type, hook };
        let mut next = Vec::new();
        for state in states {
            // The kernel's nat core runs a hook's nat chains (every table's) only until one
            // of them binds a translation of the kind that hook makes.
            let translated = match hook {
                Hook::Prerouting | Hook::Output => state.destination_translated,
                Hook::Postrouting => state.masquerade,
                _ => false,
            };
            if chain_type == ChainType::Nat && translated {
                next.push(state);
                continue;
            }
            for (state, flow) in tracer.run_chain(&chain, state, 0)? {
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
    fn run_chain(&self, chain: &str, state: PathState, depth: usize) -> Result<Vec<(PathState, Flow)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError::TooDeep { chain: chain.to_owned() });
        }
        let rules = self
            .table
            .rules(chain)
            .ok_or_else(|| TraceError::MissingChain { table: self.table_name.to_string(), chain: chain.to_owned() })?;
        // Paths still walking this chain, each at the rule it is on.
        let mut walking = vec![(0usize, state)];
        let mut finished = Vec::new();
        while let Some((index, state)) = walking.pop() {
            let Some(rule) = rules.get(index) else {
                finished.push((state, Flow::Continue));
                continue;
            };
            for (state, step) in self.run_statements(chain, &rule.statements, state, depth)? {
                match step {
                    Step::NextRule => walking.push((index + 1, state)),
                    Step::Done(flow) => finished.push((state, flow)),
                }
            }
        }
        Ok(finished)
    }

    /// Runs one rule's statements for one path; may fork on `numgen`.
    fn run_statements(
        &self,
        chain: &str,
        statements: &[Statement],
        state: PathState,
        depth: usize,
    ) -> Result<Vec<(PathState, Step)>, TraceError> {
        let Some((statement, rest)) = statements.split_first() else {
            return Ok(vec![(state, Step::NextRule)]);
        };
        let mut state = state;
        let continue_with = |tracer: &Self, state: PathState| tracer.run_statements(chain, rest, state, depth);
        match statement {
            Statement::Match(condition) => {
                let mut results = Vec::new();
                for (state, holds) in self.evaluate(chain, condition, state)? {
                    if holds {
                        results.extend(continue_with(self, state)?);
                    } else {
                        results.push((state, Step::NextRule));
                    }
                }
                Ok(results)
            }
            Statement::Counter => continue_with(self, state),
            Statement::SetMarkBits(bits) => {
                state.packet.mark |= bits;
                continue_with(self, state)
            }
            Statement::ToggleMarkBits(bits) => {
                state.packet.mark ^= bits;
                continue_with(self, state)
            }
            Statement::Dnat { address, port } => {
                self.require(chain, "dnat", ChainType::Nat, &[Hook::Prerouting, Hook::Output])?;
                state.packet.destination = *address;
                state.destination_translated = true;
                if let Some(port) = port {
                    state.packet.destination_port = *port;
                }
                Ok(vec![(state, Step::Done(Flow::Accept))])
            }
            Statement::Masquerade { .. } => {
                self.require(chain, "masquerade", ChainType::Nat, &[Hook::Postrouting])?;
                state.masquerade = true;
                Ok(vec![(state, Step::Done(Flow::Accept))])
            }
            Statement::Reject(_) => Ok(vec![(state, Step::Done(Flow::Reject))]),
            Statement::VerdictMap { keys, map } => {
                let key = self.key(chain, keys, &state)?;
                match self.lookup(map, &key)? {
                    Some(ElementValue::Verdict(verdict)) => {
                        let verdict = verdict.clone();
                        self.follow(chain, &verdict, state, depth, rest)
                    }
                    Some(ElementValue::Data(_)) | None => continue_with(self, state),
                }
            }
            // Affinity memory is not modelled: every path stays possible.
            Statement::UpdateSet { set, .. } => {
                self.set_exists(set)?;
                continue_with(self, state)
            }
            Statement::Verdict(verdict) => self.follow(chain, verdict, state, depth, &[]),
        }
    }

    /// Applies a verdict; `rest` are the statements after a vmap lookup that found nothing
    /// terminal (a jump that returned).
    fn follow(
        &self,
        chain: &str,
        verdict: &Verdict,
        state: PathState,
        depth: usize,
        rest: &[Statement],
    ) -> Result<Vec<(PathState, Step)>, TraceError> {
        Ok(match verdict {
            Verdict::Accept => vec![(state, Step::Done(Flow::Accept))],
            Verdict::Drop => vec![(state, Step::Done(Flow::Drop))],
            Verdict::Return => vec![(state, Step::Done(Flow::Continue))],
            Verdict::Goto(target) => {
                self.run_chain(target, state, depth + 1)?.into_iter().map(|(s, f)| (s, Step::Done(f))).collect()
            }
            Verdict::Jump(target) => {
                let mut results = Vec::new();
                for (state, flow) in self.run_chain(target, state, depth + 1)? {
                    match flow {
                        Flow::Continue => results.extend(self.run_statements(chain, rest, state, depth)?),
                        other => results.push((state, Step::Done(other))),
                    }
                }
                results
            }
        })
    }

    fn require(
        &self,
        chain: &str,
        statement: &'static str,
        chain_type: ChainType,
        hooks: &[Hook],
    ) -> Result<(), TraceError> {
        if self.chain_type == chain_type && hooks.contains(&self.hook) {
            Ok(())
        } else {
            Err(TraceError::NotAllowedHere {
                chain: chain.to_owned(),
                statement,
                chain_type: self.chain_type,
                hook: self.hook,
            })
        }
    }

    /// Whether a condition holds, per path (`numgen` forks into a holding and a failing path).
    fn evaluate(&self, chain: &str, condition: &Match, state: PathState) -> Result<Vec<(PathState, bool)>, TraceError> {
        let packet = &state.packet;
        let holds = match condition {
            Match::Compare { left: Expr::RandomModulo(modulus), op, right } => {
                let Value::Integer(value) = right else {
                    return Err(self.mismatch(chain, Expr::RandomModulo(*modulus), *right));
                };
                // Some draw equals the value (if it is below the modulus) and some does not.
                let can_equal = value < modulus;
                let can_differ = *modulus > 1 || !can_equal;
                let mut paths = Vec::new();
                if can_equal {
                    paths.push((state, *op == CmpOp::Eq));
                }
                if can_differ {
                    paths.push((state, *op == CmpOp::Ne));
                }
                return Ok(paths);
            }
            Match::Compare { left, op, right } => {
                let equal = self.field(chain, *left, packet)? == self.comparable(chain, *left, *right)?;
                equal == (*op == CmpOp::Eq)
            }
            Match::InPrefixes { left, negate, prefixes } => {
                let Field::Address(address) = self.field(chain, *left, packet)? else {
                    return Err(self.mismatch(chain, *left, Value::Prefix(prefixes[0])));
                };
                prefixes.iter().any(|p| p.contains(&address)) != *negate
            }
            Match::InSet { keys, negate, set } => {
                let key = self.key(chain, keys, &state)?;
                self.contains_key(set, &key)? != *negate
            }
            Match::MarkMasked { mask, op, value } => ((packet.mark & mask) == *value) == (*op == CmpOp::Eq),
            Match::FibLocal { address, negate } => {
                let address = match address {
                    FibAddress::Source => packet.source,
                    FibAddress::Destination => packet.destination,
                };
                self.host.is_local(address) != *negate
            }
            // The tracer follows first packets only.
            Match::CtStateNew => true,
        };
        Ok(vec![(state, holds)])
    }

    fn mismatch(&self, chain: &str, expr: Expr, value: Value) -> TraceError {
        TraceError::TypeMismatch { chain: chain.to_owned(), expr, value }
    }

    fn field(&self, chain: &str, expr: Expr, packet: &Packet) -> Result<Field, TraceError> {
        Ok(match expr {
            Expr::SourceAddress => Field::Address(packet.source),
            Expr::DestinationAddress => Field::Address(packet.destination),
            Expr::L4Proto => Field::Number(u32::from(packet.protocol)),
            Expr::DestinationPort => Field::Number(u32::from(packet.destination_port)),
            Expr::SourcePort => Field::Number(u32::from(packet.source_port)),
            Expr::Mark => Field::Number(packet.mark),
            Expr::RandomModulo(_) => return Err(self.mismatch(chain, expr, Value::Integer(0))),
        })
    }

    fn comparable(&self, chain: &str, expr: Expr, value: Value) -> Result<Field, TraceError> {
        Ok(match (expr, value) {
            (Expr::SourceAddress | Expr::DestinationAddress, Value::Address(address)) => Field::Address(address),
            (Expr::L4Proto, Value::Protocol(protocol)) => Field::Number(u32::from(protocol)),
            (Expr::DestinationPort | Expr::SourcePort, Value::Port(port)) => Field::Number(u32::from(port)),
            (Expr::Mark, Value::Integer(number)) => Field::Number(number),
            _ => return Err(self.mismatch(chain, expr, value)),
        })
    }

    fn key(&self, chain: &str, keys: &[Expr], state: &PathState) -> Result<Vec<Field>, TraceError> {
        keys.iter().map(|expr| self.field(chain, *expr, &state.packet)).collect()
    }

    fn set_exists(&self, set: &str) -> Result<(), TraceError> {
        self.table
            .set(set)
            .map(|_| ())
            .ok_or_else(|| TraceError::MissingSet { table: self.table_name.to_string(), set: set.to_owned() })
    }

    /// The value of the element matching `key` in a map.
    fn lookup(&self, set: &str, key: &[Field]) -> Result<Option<&ElementValue>, TraceError> {
        Ok(self.matching_element(set, key)?.and_then(|element| element.value.as_ref()))
    }

    fn contains_key(&self, set: &str, key: &[Field]) -> Result<bool, TraceError> {
        Ok(self.matching_element(set, key)?.is_some())
    }

    fn matching_element(&self, set: &str, key: &[Field]) -> Result<Option<&crate::objects::Element>, TraceError> {
        self.set_exists(set)?;
        let elements = self.table.elements(set).expect("set exists");
        Ok(elements.into_iter().find(|element| {
            element.key.len() == key.len() && element.key.iter().zip(key).all(|(value, field)| field.matches(value))
        }))
    }
}

/// What a rule step decided for a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    NextRule,
    Done(Flow),
}

/// A packet field's value, typed loosely enough to compare with set keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Address(IpAddr),
    Number(u32),
}

impl Field {
    fn matches(&self, value: &Value) -> bool {
        match (self, value) {
            (Field::Address(address), Value::Address(other)) => address == other,
            (Field::Address(address), Value::Prefix(prefix)) => prefix.contains(address),
            (Field::Number(number), Value::Protocol(protocol)) => *number == u32::from(*protocol),
            (Field::Number(number), Value::Port(port)) => *number == u32::from(*port),
            (Field::Number(number), Value::Integer(integer)) => number == integer,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Nftables;
    use crate::objects::{BaseChain, Chain, Operation, Rule, Transaction};

    fn table() -> TableName {
        TableName { family: Family::Ip, name: "t".into() }
    }

    fn nat_prerouting_with(statements: Vec<Statement>) -> FakeNftables {
        let mut nft = FakeNftables::new();
        let chain = Chain {
            name: "pre".into(),
            base: Some(BaseChain { chain_type: ChainType::Nat, hook: Hook::Prerouting, priority: -100 }),
            comment: None,
        };
        nft.apply(&Transaction {
            table: table(),
            operations: vec![
                Operation::AddTable { comment: None },
                Operation::AddChain(chain),
                Operation::AddRule(Rule { chain: "pre".into(), statements, comment: None }),
            ],
        })
        .expect("valid ruleset");
        nft
    }

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

    #[test]
    fn a_random_cascade_of_three_yields_three_outcomes() {
        let tcp = || Statement::Match(Match::Compare { left: Expr::L4Proto, op: CmpOp::Eq, right: Value::Protocol(6) });
        let dnat =
            |last: u8| Statement::Dnat { address: format!("198.18.129.{last}").parse().unwrap(), port: Some(8080) };
        let draw = |modulus| {
            Statement::Match(Match::Compare {
                left: Expr::RandomModulo(modulus),
                op: CmpOp::Eq,
                right: Value::Integer(0),
            })
        };
        let mut nft = nat_prerouting_with(vec![draw(3), tcp(), dnat(1)]);
        nft.apply(&Transaction {
            table: table(),
            operations: vec![
                Operation::AddRule(Rule {
                    chain: "pre".into(),
                    statements: vec![draw(2), tcp(), dnat(2)],
                    comment: None,
                }),
                Operation::AddRule(Rule { chain: "pre".into(), statements: vec![tcp(), dnat(3)], comment: None }),
            ],
        })
        .unwrap();
        let outcomes = trace(&nft, Family::Ip, &Host::default(), Origin::Network, packet()).unwrap();
        let destinations: Vec<String> = outcomes.iter().map(|o| o.destination.to_string()).collect();
        assert_eq!(destinations, ["198.18.129.1", "198.18.129.2", "198.18.129.3"]);
    }

    #[test]
    fn a_packet_no_rule_touches_is_forwarded_unchanged() {
        let nft = nat_prerouting_with(vec![Statement::Counter]);
        let outcomes = trace(&nft, Family::Ip, &Host::default(), Origin::Network, packet()).unwrap();
        let only: Vec<_> = outcomes.into_iter().collect();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].disposition, Disposition::Forwarded);
        assert_eq!(only[0].destination, packet().destination);
    }

    #[test]
    fn once_a_nat_chain_translated_the_destination_no_other_tables_nat_chain_runs_on_that_hook() {
        let dnat = |last: u8| Statement::Dnat { address: format!("198.18.129.{last}").parse().unwrap(), port: None };
        let mut nft = nat_prerouting_with(vec![dnat(1)]);
        let later = Chain {
            name: "pre".into(),
            base: Some(BaseChain { chain_type: ChainType::Nat, hook: Hook::Prerouting, priority: -90 }),
            comment: None,
        };
        nft.apply(&Transaction {
            table: TableName { family: Family::Ip, name: "other".into() },
            operations: vec![
                Operation::AddTable { comment: None },
                Operation::AddChain(later),
                Operation::AddRule(Rule { chain: "pre".into(), statements: vec![dnat(2)], comment: None }),
            ],
        })
        .unwrap();
        let outcomes = trace(&nft, Family::Ip, &Host::default(), Origin::Network, packet()).unwrap();
        let destinations: Vec<String> = outcomes.iter().map(|o| o.destination.to_string()).collect();
        assert_eq!(destinations, ["198.18.129.1"]);
    }
}
