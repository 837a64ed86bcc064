//! The scenario table against the in-memory iptables fake (no root, no lab), through the
//! one fake-kernel runner of `scenarios/fake.rs`: `IptablesBackend<FakeIptables>`, traced
//! through the filter and nat tables by the iptables tracer, which explores both ways of
//! every `-m statistic` (`-m recent` is not modelled: affinity over time is the real
//! kernel's part).

mod scenarios;

use std::collections::BTreeSet;

use scenarios::fake::FakeMode;
use svcplane_backend_iptables::IptablesBackend;
use svcplane_iptables::FakeIptables;
use svcplane_iptables::trace::{Host, Origin, Outcome, Packet, trace};

struct Mode;

impl FakeMode for Mode {
    type Backend = IptablesBackend<FakeIptables>;
    const KERNEL: &'static str = "the iptables fake";

    fn backend() -> Self::Backend {
        IptablesBackend::new(FakeIptables::new())
    }

    /// Both families' tables, as `iptables-save` and `ip6tables-save` would print them.
    fn dump(backend: &Self::Backend) -> String {
        let fake = backend.iptables();
        [svcplane_iptables::Family::V4, svcplane_iptables::Family::V6].map(|family| fake.dump(family)).concat()
    }

    fn trace(
        backend: &Self::Backend,
        host: &Host,
        origin: Origin,
        packet: Packet,
    ) -> Result<BTreeSet<Outcome>, String> {
        let family =
            if packet.destination.is_ipv4() { svcplane_iptables::Family::V4 } else { svcplane_iptables::Family::V6 };
        trace(backend.iptables(), family, host, origin, packet).map_err(|error| error.to_string())
    }
}

fake_table_tests!(Mode);
