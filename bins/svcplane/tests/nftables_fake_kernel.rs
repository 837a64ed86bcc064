//! The scenario table against the in-memory nftables fake (no root, no lab), through the
//! one fake-kernel runner of `scenarios/fake.rs`: `NftablesBackend<FakeNftables>`, traced by
//! the nftables tracer, which explores every `numgen` branch.

mod scenarios;

use std::collections::BTreeSet;

use scenarios::fake::FakeMode;
use svcplane_backend_nftables::NftablesBackend;
use svcplane_nft::FakeNftables;
use svcplane_nft::trace::{Host, Origin, Outcome, Packet, trace};

struct Mode;

impl FakeMode for Mode {
    type Backend = NftablesBackend<FakeNftables>;
    const KERNEL: &'static str = "the nftables fake";

    fn backend() -> Self::Backend {
        NftablesBackend::new(FakeNftables::new())
    }

    fn dump(backend: &Self::Backend) -> String {
        backend.nftables().dump()
    }

    fn trace(
        backend: &Self::Backend,
        host: &Host,
        origin: Origin,
        packet: Packet,
    ) -> Result<BTreeSet<Outcome>, String> {
        let family = if packet.destination.is_ipv4() { svcplane_nft::Family::Ip } else { svcplane_nft::Family::Ip6 };
        trace(backend.nftables(), family, host, origin, packet).map_err(|error| error.to_string())
    }
}

fake_table_tests!(Mode);
