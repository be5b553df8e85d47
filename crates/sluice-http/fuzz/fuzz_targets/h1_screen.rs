//! Feeds an arbitrary downstream byte stream, split at an arbitrary point, through the HTTP/1.1
//! request screen: it must never panic, never loop, and only ever alter a head it refused. An
//! upgrade request is answered as switched or not by the split byte's low bit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::h1screen::{Head, Screen};

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let split = usize::from(split).min(stream.len());
    let mut screen = Screen::new(512, 16);
    let mut held: Vec<u8> = Vec::new();
    for piece in [&stream[..split], &stream[split..]] {
        held.extend_from_slice(piece);
        while !held.is_empty() && !screen.is_off() {
            if screen.deciding() {
                // Nothing is taken while the answer is awaited.
                assert_eq!(screen.body(&held), 0);
                screen.decided(split & 1 == 1);
                assert!(!screen.deciding());
                continue;
            }
            if screen.at_head() {
                let before = held.clone();
                match screen.head(&mut held) {
                    Head::Partial | Head::Off | Head::TooLarge => {
                        assert_eq!(before, held);
                        break;
                    }
                    Head::Passed(n) => {
                        assert_eq!(before, held);
                        // Never a head over the limit.
                        assert!(n > 0 && n <= held.len() && n <= 512);
                        held.drain(..n);
                    }
                    Head::Refused(n, _) => {
                        assert!(n > 0 && n <= held.len());
                        held.drain(..n);
                    }
                }
            } else {
                let n = screen.body(&held);
                assert!(n <= held.len());
                held.drain(..n);
            }
        }
    }
});
