//! The backends `proxy`, `render` and `cleanup` can drive, behind one small interface so the
//! sync loop does not care which mode it runs.

use anyhow::Context;
use svcplane_backend_iptables::{IptablesBackend, render_dump};
use svcplane_backend_nftables::{NftablesBackend, render_full};
use svcplane_core::{IpFamily, NodePlan, PlanDiff};
use svcplane_iptables::{IptablesCli, Variant, detect_variant};
use svcplane_nft::{NftCli, NftError, NftNetlink, Nftables, TableName, Transaction};

use crate::cli::{IptablesBackend as IptablesVariant, Mode, NftMechanism, ProxyArgs};

/// The way nftables transactions reach the kernel.
#[derive(Debug)]
pub enum NftClient {
    /// A persistent nf_tables netlink socket: no process per sync, no text to parse.
    Netlink(NftNetlink),
    /// `nft -f -`: slower, but what an operator can replay by hand.
    Cli(NftCli),
}

impl Nftables for NftClient {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        match self {
            NftClient::Netlink(netlink) => netlink.apply(transaction),
            NftClient::Cli(cli) => cli.apply(transaction),
        }
    }

    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError> {
        match self {
            NftClient::Netlink(netlink) => netlink.delete_table(table),
            NftClient::Cli(cli) => cli.delete_table(table),
        }
    }
}

/// What one sync did, in any mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncSummary {
    pub full: bool,
    pub service_ports: usize,
    pub operations: usize,
}

/// The node's dataplane in the chosen mode.
#[derive(Debug)]
pub enum Dataplane {
    Nftables(NftablesBackend<NftClient>),
    Iptables(IptablesBackend<IptablesCli>),
}

impl Dataplane {
    pub fn new(args: &ProxyArgs) -> anyhow::Result<Self> {
        Ok(match args.mode {
            Mode::Nftables => {
                let client = match args.nft_mechanism {
                    NftMechanism::Netlink => {
                        NftClient::Netlink(NftNetlink::new().context("opening the nf_tables netlink socket")?)
                    }
                    NftMechanism::Cli => NftClient::Cli(NftCli::new().with_program(args.nft_program.clone())),
                };
                Dataplane::Nftables(NftablesBackend::new(client))
            }
            Mode::Iptables => {
                let variant = match args.iptables_backend {
                    IptablesVariant::Legacy => Variant::Legacy,
                    IptablesVariant::Nft => Variant::Nft,
                    IptablesVariant::Auto => {
                        let detection = detect_variant(&[]);
                        tracing::info!(variant = detection.variant.name(), "iptables variant: {}", detection.reason);
                        detection.variant
                    }
                };
                Dataplane::Iptables(IptablesBackend::new(IptablesCli::new(variant)))
            }
        })
    }

    /// Brings the kernel in line with `plan`; `changed` lets a backend sync partially.
    pub fn sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> anyhow::Result<SyncSummary> {
        match self {
            Dataplane::Nftables(backend) => {
                let report = backend.sync(plan, changed)?;
                Ok(SyncSummary {
                    full: report.full,
                    service_ports: report.service_ports,
                    operations: report.operations,
                })
            }
            Dataplane::Iptables(backend) => {
                let report = backend.sync(plan, changed)?;
                Ok(SyncSummary {
                    full: report.full,
                    service_ports: report.service_ports,
                    operations: report.operations,
                })
            }
        }
    }

    /// Whether the kernel's rules were changed behind svcplane's back, so the next sync
    /// must be a full one (iptables mode watches its canary chains; cheap, rate-limited).
    pub fn rules_changed_behind_our_back(&mut self) -> bool {
        match self {
            Dataplane::Nftables(_) => false,
            Dataplane::Iptables(backend) => backend.rules_changed_behind_our_back(),
        }
    }

    /// What a full sync of `plan` would write, as the mode's own text.
    pub fn render(mode: Mode, plan: &NodePlan) -> anyhow::Result<String> {
        match mode {
            Mode::Nftables => {
                let mut text = String::new();
                for transaction in render_full(plan, &[IpFamily::V4, IpFamily::V6]) {
                    text.push_str(&svcplane_nft::render(&transaction).context("rendering the nft script")?);
                }
                Ok(text)
            }
            Mode::Iptables => Ok(render_dump(plan, &[IpFamily::V4, IpFamily::V6])),
        }
    }

    /// Removes whatever every mode may have left on this node. Returns whether anything was there.
    pub fn cleanup_all() -> anyhow::Result<bool> {
        let mut nftables = NftablesBackend::new(NftClient::Cli(NftCli::new()));
        let mut removed = nftables.cleanup().context("deleting svcplane's nftables tables")?;
        for variant in [Variant::Legacy, Variant::Nft] {
            let mut iptables = IptablesBackend::new(IptablesCli::new(variant));
            match iptables.cleanup() {
                Ok(found) => removed |= found,
                // A node without iptables has nothing of iptables mode to remove.
                Err(error) if error.is_program_missing() => {}
                Err(error) => {
                    return Err(error)
                        .with_context(|| format!("removing svcplane's iptables-{} rules", variant.name()));
                }
            }
        }
        Ok(removed)
    }
}
