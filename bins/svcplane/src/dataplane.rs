//! The backends `proxy`, `render` and `cleanup` can drive, behind one small interface so the
//! sync loop does not care which mode it runs.

use anyhow::Context;
use svcplane_backend_nftables::{NftablesBackend, render_full};
use svcplane_core::{ChangedKeys, IpFamily, NodePlan};
use svcplane_nft::{NftCli, NftError, NftNetlink, Nftables, TableName, Transaction};

use crate::cli::{Mode, NftMechanism, ProxyArgs};

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
        })
    }

    /// Brings the kernel in line with `plan`; `changed` lets a backend sync partially.
    pub fn sync(&mut self, plan: &NodePlan, changed: &ChangedKeys) -> anyhow::Result<SyncSummary> {
        match self {
            Dataplane::Nftables(backend) => {
                let report = backend.sync(plan, changed)?;
                Ok(SyncSummary { full: report.full, service_ports: report.service_ports, operations: report.operations })
            }
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
        }
    }

    /// Removes whatever every mode may have left on this node. Returns whether anything was there.
    pub fn cleanup_all() -> anyhow::Result<bool> {
        let mut nftables = NftablesBackend::new(NftClient::Cli(NftCli::new()));
        nftables.cleanup().context("deleting svcplane's nftables tables")
    }
}
