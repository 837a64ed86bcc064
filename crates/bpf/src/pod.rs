//! aya's `Pod` marker for our map keys and values.
//!
//! `Pod` is an unsafe trait: implementing it promises aya that any bytes of the type's size
//! are a valid value and that the type has no padding it would read uninitialised. Every
//! type below is `#[repr(C)]`, made of integers and byte arrays only, with explicit padding
//! fields, so both hold. The workspace denies `unsafe_code`; this module is the one place
//! that allows it, for these impls only.
#![allow(unsafe_code)]

use crate::maps::{
    AffinityKey, AffinityValue, BackendValue, Config, LiveKey, RevKey, RevValue, ServiceKey, ServiceValue,
};

// SAFETY: see the module comment: repr(C), integer fields only, no implicit padding.
unsafe impl aya::Pod for ServiceKey {}
// SAFETY: as above.
unsafe impl aya::Pod for ServiceValue {}
// SAFETY: as above.
unsafe impl aya::Pod for BackendValue {}
// SAFETY: as above.
unsafe impl aya::Pod for RevKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RevValue {}
// SAFETY: as above.
unsafe impl aya::Pod for AffinityKey {}
// SAFETY: as above.
unsafe impl aya::Pod for AffinityValue {}
// SAFETY: as above.
unsafe impl aya::Pod for Config {}
// SAFETY: as above.
unsafe impl aya::Pod for LiveKey {}
// SAFETY: as above.
unsafe impl aya::Pod for crate::tc::TcConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for crate::tc::RangeData {}
// SAFETY: as above.
unsafe impl aya::Pod for crate::maps::PortName {}
