//! `iptables-save` output as the iptables mechanism reads it back (`parse_save`), each rule
//! parsed into the typed model, asked for its jump target and rendered again, and the canonical order.
//!
//! Properties: nothing panics or hangs; a dump that reads renders canonically into text that
//! reads again into the same canonical text (canonical order is a fixed point).

#![no_main]

use libfuzzer_sys::fuzz_target;
use svcplane_iptables::save::render_canonical;
use svcplane_iptables::{Family, parse_save};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(ruleset) = parse_save(text) else { return };
    for table in &ruleset.tables {
        let _ = table.table();
        for chain in &table.chains {
            for rule in &chain.rules {
                let _ = rule.jump_target();
                if let Ok(parsed) = rule.parse() {
                    // What the mechanism does with a rule read back: render it both ways.
                    for family in [Family::V4, Family::V6] {
                        let _ = parsed.save_args(family);
                        let _ = parsed.same_as(&parsed, family);
                    }
                    let _ = parsed.restore_args();
                }
            }
        }
    }
    let canonical = render_canonical(&ruleset);
    let again = parse_save(&canonical).expect("canonical text reads back");
    assert_eq!(render_canonical(&again), canonical, "canonical order is not a fixed point");
});
