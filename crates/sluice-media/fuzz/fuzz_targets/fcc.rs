//! Fuzzes FCC signalling: any bytes parsed as server or client packets in either dialect must
//! never panic, and every response parsed must build back into a packet that parses the same.

#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use sluice_media::fcc::{self, Flavor, ServerMessage};

fuzz_target!(|data: &[u8]| {
    for flavor in [Flavor::Telecom, Flavor::Huawei] {
        let _ = fcc::is_feedback(data);
        let _ = fcc::parse_client(flavor, data);
        if let Ok(ServerMessage::Response(r)) = fcc::parse_server(flavor, data) {
            let again = fcc::response(flavor, Ipv4Addr::new(239, 0, 0, 1), &r);
            assert_eq!(
                fcc::parse_server(flavor, &again),
                Ok(ServerMessage::Response(r))
            );
        }
    }
});
