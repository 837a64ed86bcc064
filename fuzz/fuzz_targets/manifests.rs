//! One manifest file's text, read and converted the way a manifests directory is: parsing
//! into k8s-openapi objects (`parse_manifest_text`), conversion into the core model
//! (`convert_objects`), and into cluster DNS's view (`dns_view`) and zone.
//!
//! The first byte picks the file's extension (JSON or YAML), the rest is the file's text.
//! Properties: nothing panics or hangs; every problem displays as a message naming the file;
//! whatever converts has a name.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use svcplane_dns::{Zone, ZoneConfig};
use svcplane_source::{convert_objects, dns_view, parse_manifest_text};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, text)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let path = Path::new(if selector & 1 == 1 { "fuzz/objects.json" } else { "fuzz/objects.yaml" });
    let loaded = parse_manifest_text(path, text);
    for error in &loaded.errors {
        let message = error.to_string();
        assert!(message.starts_with("fuzz/objects."), "an error that does not name the file: {message}");
    }
    let converted = convert_objects(&loaded.objects, &loaded.origins);
    for error in &converted.errors {
        let _ = error.to_string();
    }
    for service in &converted.services {
        assert!(!service.name.name.is_empty(), "a Service without a name: {service:?}");
    }
    // The zone cluster DNS would build from these manifests.
    let view = dns_view(&loaded.objects, &loaded.origins);
    for error in &view.errors {
        let _ = error.to_string();
    }
    let config = ZoneConfig::new("cluster.local").expect("a valid zone");
    let _ = Zone::build(Arc::new(config), &view.view, 1);
});
