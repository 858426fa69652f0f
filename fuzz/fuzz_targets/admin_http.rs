//! The admin endpoint's request heads on untrusted bytes: never a panic;
//! a head it takes lies within the bytes and the bounds, and parses the
//! same from its own bytes alone; one still to come is under the bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::node::admin::http_head::{parse_head, ADMIN_BODY_BYTES_MAX, ADMIN_HEAD_BYTES_MAX};

fuzz_target!(|data: &[u8]| {
    match parse_head(data) {
        Ok(Some(head)) => {
            assert!(head.head_bytes <= data.len());
            assert!(head.head_bytes <= ADMIN_HEAD_BYTES_MAX);
            assert!(head.body_bytes <= ADMIN_BODY_BYTES_MAX);
            let again = parse_head(&data[..head.head_bytes]).expect("its own bytes parse");
            assert_eq!(again.as_ref(), Some(&head));
        }
        Ok(None) => assert!(data.len() < ADMIN_HEAD_BYTES_MAX),
        Err(_) => {}
    }
});
