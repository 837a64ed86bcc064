//! Buffers as the kernel's nf_tables netlink socket might deliver them: acks and errors
//! (with extended acks), dump ends, and set and element descriptions, through the decoders
//! the netlink mechanism reads replies with (`decode_kernel_replies`).
//!
//! Properties: nothing panics or hangs, and no message is decoded from outside the buffer
//! (there are never more messages than 16-byte headers fit in it).

#![no_main]

use libfuzzer_sys::fuzz_target;
use svcplane_nft::{KernelReply, decode_kernel_replies};

fuzz_target!(|data: &[u8]| {
    let replies = decode_kernel_replies(data);
    assert!(replies.len() <= data.len() / 16, "{} messages in {} bytes", replies.len(), data.len());
    for reply in &replies {
        if let KernelReply::Object { set: Some(set), .. } = reply {
            assert!(!set.key.is_empty(), "a set without key types: {set:?}");
        }
    }
});
