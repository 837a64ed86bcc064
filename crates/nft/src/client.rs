//! Either real mechanism behind one type, chosen at run time (`--nft-mechanism`).

use crate::{Element, Family, NftCli, NftError, NftNetlink, Nftables, Set, TableName, Transaction};

/// The way transactions reach the kernel.
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

    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        match self {
            NftClient::Netlink(netlink) => netlink.count_rules(table, chain),
            NftClient::Cli(cli) => cli.count_rules(table, chain),
        }
    }

    fn holds_element(&mut self, table: &TableName, set: &Set, element: &Element) -> Result<Option<bool>, NftError> {
        match self {
            NftClient::Netlink(netlink) => netlink.holds_element(table, set, element),
            NftClient::Cli(cli) => cli.holds_element(table, set, element),
        }
    }

    fn list_tables(&mut self, family: Family) -> Result<Vec<String>, NftError> {
        match self {
            NftClient::Netlink(netlink) => netlink.list_tables(family),
            NftClient::Cli(cli) => cli.list_tables(family),
        }
    }
}
