//! Capabilities for third-party transfers (see docs/third-party.md).
//!
//! The server that will *accept* the server-to-server connection (B under push, A under
//! pull) issues a [`Capability`] to the client steering the copy: a [`Grant`] (who may
//! dial it, where, for which user and scope, until when), encoded with postcard and
//! signed with the issuer's TLS key. The client hands it to the dialing server, which
//! checks it *before it connects* (the issuer's key is the one the client pinned and
//! one the dialer trusts, the signature holds, the grant names the dialer's own key and the address it would dial,
//! it has not expired), and presents it as its credential; the issuer checks its own
//! signature again, that the TLS peer holds the key the grant names, the expiry, and
//! that the nonce was never used (single use), and grants only the scope.
//!
//! This module is the sans-IO part: the types, the signed message, the checks that need
//! no key. Signing and signature verification are `dmover_net::capability`.

use serde::{Deserialize, Serialize};

/// The version of [`Grant`]'s encoding.
pub const GRANT_VERSION: u8 = 1;

/// Domain separation of the signed message: a signature over a grant can never be
/// mistaken for any other signature made with a server's key (TLS handshake signatures
/// have their own context strings).
pub const SIGNING_CONTEXT: &[u8] = b"dmover third-party capability v1\0";

/// Longest validity an issuer grants (the default is shorter, see the server's config).
pub const MAX_TTL_SECS: u64 = 3600;

/// What a capability allows: one session of this op on the issuer (a sync's scopes:
/// the few sessions of one sync, [`Scope::uses`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// The dialer pushes into `dest` on the issuer (a path as in [`crate::control::Op::Push`]).
    Push {
        /// Destination path on the issuer.
        dest: Vec<u8>,
    },
    /// The dialer pulls `sources` from the issuer.
    Pull {
        /// Source paths on the issuer.
        sources: Vec<Vec<u8>>,
    },
    /// (appended; feature `SYNC_BETWEEN`) A sync between servers into the mirror
    /// `dest` on the issuer: the dialer pushes the mirror (`Op::Push` of `dest`'s
    /// parent, the manifest's one root named as `dest`) and prunes it (`Op::Prune` of
    /// `dest`, before and after the push).
    Mirror {
        /// The mirror on the issuer (the directory itself).
        dest: Vec<u8>,
    },
    /// (appended; feature `SYNC_BETWEEN`) A sync between servers from `source` on the
    /// issuer: the dialer pulls it (`Op::Pull`, `Op::PullFiltered` or
    /// `Op::PullListed` of `[source]`) and, for `--checksum`, asks the digests of its
    /// files (`Op::Digests` of `source`).
    MirrorSource {
        /// The sync's source on the issuer.
        source: Vec<u8>,
    },
}

impl Scope {
    /// How many sessions a capability of this scope allows: one for a copy; for a
    /// sync, its prunes or digest request too (docs/third-party.md, "Sync between
    /// servers").
    pub fn uses(&self) -> u8 {
        match self {
            Scope::Push { .. } | Scope::Pull { .. } => 1,
            Scope::Mirror { .. } => 3,
            Scope::MirrorSource { .. } => 2,
        }
    }
}

/// The signed content of a capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// [`GRANT_VERSION`].
    pub version: u8,
    /// The issuer's key fingerprint (`sha256:` + base64 of its SubjectPublicKeyInfo).
    pub issuer: String,
    /// Addresses (`host:port`) the dialer may connect to for the issuer: since issue
    /// 46 only the issuer's own one (its advertised or local address).
    pub addrs: Vec<String>,
    /// The dialer's key fingerprint: only a TLS peer holding that key may use it.
    pub dialer: String,
    /// The user on the issuer the session runs as (the steering client's user there).
    pub user: String,
    /// The one session it allows.
    pub scope: Scope,
    /// Seconds since the Unix epoch after which it is void.
    pub expires: u64,
    /// Random; an issuer accepts each nonce once.
    pub nonce: [u8; 16],
}

/// A grant, its issuer's certificate and the issuer's signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The postcard encoding of the [`Grant`] (signed as it is).
    pub grant: Vec<u8>,
    /// The issuer's certificate (DER): its key checks the signature.
    pub cert: Vec<u8>,
    /// The TLS signature scheme used (IANA code point, e.g. 0x0403 ECDSA P-256 SHA-256).
    pub scheme: u16,
    /// The signature of [`signed_message`] of `grant`.
    pub signature: Vec<u8>,
}

/// Why a capability is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// Not decodable, or a version this build does not know.
    #[error("malformed capability: {0}")]
    Malformed(String),
    /// The certificate's key is not the one expected.
    #[error("the capability was issued by {got}, not by {want}")]
    WrongIssuer {
        /// Its issuer.
        got: String,
        /// The key the checker trusts.
        want: String,
    },
    /// The signature does not hold.
    #[error("the capability's signature is not valid: {0}")]
    BadSignature(String),
    /// Past its expiry.
    #[error("the capability expired {0} s ago")]
    Expired(u64),
    /// Valid for longer than any issuer grants.
    #[error("the capability claims a validity of {0} s, more than {MAX_TTL_SECS} s")]
    TooLong(u64),
    /// Made for another dialer.
    #[error("the capability is for the server with key {want}, not {got}")]
    WrongDialer {
        /// The dialer it names.
        want: String,
        /// The key that presented it.
        got: String,
    },
    /// The address is not one the issuer named.
    #[error("the capability does not name {addr} (it names {named})")]
    WrongAddress {
        /// The address asked for.
        addr: String,
        /// Those it names.
        named: String,
    },
    /// Used before.
    #[error("the capability was already used")]
    Replayed,
}

/// The bytes a capability's signature covers.
pub fn signed_message(grant: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNING_CONTEXT.len() + grant.len());
    m.extend_from_slice(SIGNING_CONTEXT);
    m.extend_from_slice(grant);
    m
}

impl Grant {
    /// The encoding that is signed.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a grant always encodes")
    }

    /// Decodes a grant, refusing other versions and trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Grant, CapabilityError> {
        let (g, rest): (Grant, _) = postcard::take_from_bytes(bytes)
            .map_err(|e| CapabilityError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CapabilityError::Malformed(format!(
                "{} bytes after the grant",
                rest.len()
            )));
        }
        if g.version != GRANT_VERSION {
            return Err(CapabilityError::Malformed(format!(
                "grant version {} (this build knows {GRANT_VERSION})",
                g.version
            )));
        }
        Ok(g)
    }

    /// The checks that need no key: not expired at `now` (Unix seconds), not valid for
    /// longer than [`MAX_TTL_SECS`] from now, made for the dialer with key `dialer`.
    pub fn check(&self, now: u64, dialer: &str) -> Result<(), CapabilityError> {
        if now > self.expires {
            return Err(CapabilityError::Expired(now - self.expires));
        }
        if self.expires - now > MAX_TTL_SECS {
            return Err(CapabilityError::TooLong(self.expires - now));
        }
        if self.dialer != dialer {
            return Err(CapabilityError::WrongDialer {
                want: self.dialer.clone(),
                got: dialer.to_string(),
            });
        }
        Ok(())
    }

    /// Whether the dialer may connect to `addr` for the issuer.
    pub fn check_addr(&self, addr: &str) -> Result<(), CapabilityError> {
        if self.addrs.iter().any(|a| a == addr) {
            Ok(())
        } else {
            Err(CapabilityError::WrongAddress {
                addr: addr.to_string(),
                named: self.addrs.join(", "),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            version: GRANT_VERSION,
            issuer: "sha256:issuer".into(),
            addrs: vec!["b.example:7700".into(), "10.0.0.2:7700".into()],
            dialer: "sha256:dialer".into(),
            user: "alice".into(),
            scope: Scope::Push {
                dest: b"data/run1".to_vec(),
            },
            expires: 10_000,
            nonce: [9; 16],
        }
    }

    #[test]
    fn a_grant_round_trips_and_trailing_bytes_or_other_versions_are_refused() {
        let g = grant();
        let bytes = g.encode();
        assert_eq!(Grant::decode(&bytes).unwrap(), g);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            Grant::decode(&longer),
            Err(CapabilityError::Malformed(_))
        ));
        let mut v2 = g.clone();
        v2.version = 2;
        assert!(matches!(
            Grant::decode(&v2.encode()),
            Err(CapabilityError::Malformed(m)) if m.contains("version 2")
        ));
        assert!(Grant::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn expiry_dialer_and_address_are_checked() {
        let g = grant();
        assert_eq!(g.check(10_000, "sha256:dialer"), Ok(()));
        assert_eq!(
            g.check(10_001, "sha256:dialer"),
            Err(CapabilityError::Expired(1))
        );
        assert!(matches!(
            g.check(9_000, "sha256:other"),
            Err(CapabilityError::WrongDialer { .. })
        ));
        assert_eq!(
            g.check(10_000 - MAX_TTL_SECS - 1, "sha256:dialer"),
            Err(CapabilityError::TooLong(MAX_TTL_SECS + 1))
        );
        assert_eq!(g.check_addr("10.0.0.2:7700"), Ok(()));
        let e = g.check_addr("10.0.0.2:25").unwrap_err();
        assert!(e.to_string().contains("does not name 10.0.0.2:25"), "{e}");
    }

    #[test]
    fn the_signed_message_is_separated_from_other_signatures() {
        let m = signed_message(b"xyz");
        assert!(m.starts_with(SIGNING_CONTEXT));
        assert!(m.ends_with(b"xyz"));
    }
}
