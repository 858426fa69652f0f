//! The certificate subject walker (`tls::subject::common_name`) takes any
//! bytes: it never panics, and a name it returns is as long as the input
//! allows.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(name) = quire::tls::subject::common_name(data) {
        assert!(name.len() <= data.len());
    }
});
