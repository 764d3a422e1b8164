//! The text decoders of credentials and trust: token verifiers, public keys, the
//! known-hosts file and the server's configuration file never panic on arbitrary text,
//! and what they accept round-trips.
#![no_main]

use std::path::Path;

use dmover_core::access::{ConfigFile, format_public_key, parse_public_key};
use dmover_net::known_hosts;
use dmover_proto::auth::TokenVerifier;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(v) = TokenVerifier::from_text(text) {
        assert_eq!(TokenVerifier::from_text(&v.to_text()), Some(v));
    }
    if let Some(k) = parse_public_key(text) {
        assert_eq!(parse_public_key(&format_public_key(&k)), Some(k));
    }
    if let Some((line, fp)) = known_hosts::lookup(text, "h:1") {
        assert!(line >= 1 && line <= text.lines().count());
        assert!(!fp.is_empty() && !fp.contains(char::is_whitespace));
    }
    let p = Path::new("fuzz.toml");
    if let Ok(cfg) = ConfigFile::parse(text, p)
        && let Ok((exports, users)) = cfg.access(p)
    {
        assert!(!exports.is_empty() && !users.is_empty());
        for u in users.values() {
            assert!(u.token.is_some() || !u.keys.is_empty());
            for e in u.exports.keys() {
                assert!(exports.iter().any(|x| &x.name == e));
            }
        }
    }
});
