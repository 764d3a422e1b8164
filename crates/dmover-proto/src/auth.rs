//! Authentication and key derivation, bound to the TLS control connection.
//!
//! Everything here is keyed or bound by a *channel binding*: 32 bytes both ends export
//! from their TLS 1.3 connection (RFC 8446 §7.5, label [`AUTH_EXPORTER_LABEL`]). A proof
//! computed over one TLS connection is worthless on any other, so a proof seen by a
//! man in the middle (who holds two different TLS connections) or recorded for later
//! cannot be replayed.
//!
//! # Transcript
//! [`transcript`] hashes the channel binding, the user name and the client's `Hello`
//! nonce into 32 bytes; every proof covers it. The binding is unique to one TLS
//! connection (both TLS randoms and the key exchange go into it), so no server nonce is
//! needed for freshness: since protocol version 3 the client sends `Auth` right behind
//! `Hello`, without waiting a round trip for `Welcome` (whose nonce is no longer part
//! of the transcript).
//!
//! # Tokens (SCRAM-like, RFC 5802's idea with BLAKE3)
//! From a token the client derives `client_key`; the server stores only
//! `stored_key = BLAKE3(client_key)` and `server_key` (see [`TokenVerifier`]), never the
//! token nor anything that lets one log in:
//! ```text
//! client_key  = derive_key("dmover 2026-11 token client key v2", token)
//! stored_key  = BLAKE3(client_key)
//! server_key  = derive_key("dmover 2026-11 token server key v2", token)
//! client sends  proof = client_key XOR keyed_hash(stored_key, "client" || transcript)
//! server checks BLAKE3(proof XOR keyed_hash(stored_key, "client" || transcript)) == stored_key
//! server sends  keyed_hash(server_key, "server" || transcript)   (mutual authentication)
//! ```
//! A leaked server configuration does not let anyone log in (it lacks `client_key`);
//! the proof on the wire does not reveal `client_key` to anyone without `stored_key`.
//!
//! # Public keys
//! The client signs [`key_auth_message`] (a label and the transcript) with its Ed25519
//! key; the server checks the signature against the keys configured for the user.
//!
//! # Data connections
//! Each session has a 32-byte session key ([`session_key`]): BLAKE3 key derivation
//! from 32 bytes exported from the same TLS connection with label
//! [`SESSION_EXPORTER_LABEL`], the session id and the session's salt
//! ([`crate::control::SessionInfo::salt`]), both derived from the same export
//! ([`session_id`], version 8; the server chose them at random before). From it: [`join_proof`] (a data
//! connection proves it belongs to the session by MACing a fresh server challenge) and
//! [`record_key`] (per stream and direction, for authenticated or encrypted records).

/// TLS exporter label of the channel binding used by authentication.
pub const AUTH_EXPORTER_LABEL: &[u8] = b"EXPORTER-dmover-auth-v2";
/// TLS exporter label of the secret session keys derive from ([`session_key`]).
pub const SESSION_EXPORTER_LABEL: &[u8] = b"EXPORTER-dmover-session-v2";
/// Prefix of a [`TokenVerifier`]'s text form.
pub const TOKEN_VERIFIER_PREFIX: &str = "dmover-token-v2";

/// Keys a client derives from a token.
#[derive(Clone)]
pub struct TokenKeys {
    /// Proves the client knows the token; never leaves the client.
    pub client_key: [u8; 32],
    /// What the server stores about the client's key.
    pub verifier: TokenVerifier,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKeys(..)")
    }
}

/// What a server stores for a token: enough to check a client's proof and to prove
/// itself, not enough to log in.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenVerifier {
    /// `BLAKE3(client_key)`.
    pub stored_key: [u8; 32],
    /// Key of the server's proof.
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenVerifier(..)")
    }
}

/// Derives the keys of a token (surrounding whitespace ignored, so a token file may end
/// in a newline).
pub fn token_keys(token: &[u8]) -> TokenKeys {
    let token = token.trim_ascii();
    let client_key = blake3::derive_key("dmover 2026-11 token client key v2", token);
    TokenKeys {
        client_key,
        verifier: TokenVerifier {
            stored_key: *blake3::hash(&client_key).as_bytes(),
            server_key: blake3::derive_key("dmover 2026-11 token server key v2", token),
        },
    }
}

/// The fewest bits of entropy a token must be able to hold before a verifier is made
/// of it: a verifier is a fast hash (BLAKE3) of the token, so whoever reads a server's
/// config can test guesses offline at billions per second; at 2^128 guesses there is
/// nothing to find.
pub const MIN_TOKEN_BITS: u32 = 128;

/// An upper bound on the entropy of `token` in bits: its length (surrounding whitespace
/// ignored) times log2 of the alphabet of the character classes it uses (lower case,
/// upper case, digits, other ASCII, other bytes). A random token reaches it; a word
/// or a phrase holds far less, so a token under [`MIN_TOKEN_BITS`] by this measure is
/// certainly too weak, and one above it is not proven strong. `dmover credential
/// token` makes 256-bit tokens (43 characters of base64).
pub fn token_bits(token: &[u8]) -> u32 {
    let token = token.trim_ascii();
    let mut classes = [false; 5];
    for &b in token {
        let class = match b {
            b'a'..=b'z' => 0,
            b'A'..=b'Z' => 1,
            b'0'..=b'9' => 2,
            0x20..=0x7e => 3,
            _ => 4,
        };
        classes[class] = true;
    }
    let alphabet: u32 = [26, 26, 10, 33, 161]
        .iter()
        .zip(classes)
        .filter(|(_, used)| *used)
        .map(|(n, _)| n)
        .sum();
    if alphabet < 2 {
        return 0;
    }
    (token.len() as f64 * f64::from(alphabet).log2()).floor() as u32
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl TokenVerifier {
    /// The text form for a configuration file: `dmover-token-v2:<stored hex>:<server hex>`.
    pub fn to_text(&self) -> String {
        format!(
            "{TOKEN_VERIFIER_PREFIX}:{}:{}",
            hex(&self.stored_key),
            hex(&self.server_key)
        )
    }

    /// Parses [`TokenVerifier::to_text`]'s form.
    pub fn from_text(s: &str) -> Option<Self> {
        let mut it = s.trim().split(':');
        let (Some(TOKEN_VERIFIER_PREFIX), Some(a), Some(b), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return None;
        };
        Some(TokenVerifier {
            stored_key: unhex32(a)?,
            server_key: unhex32(b)?,
        })
    }
}

/// The authentication transcript: channel binding, user name and the client's nonce.
pub fn transcript(binding: &[u8; 32], user: &str, client_nonce: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("dmover 2026-11 auth transcript v3");
    h.update(binding);
    h.update(&(user.len() as u64).to_be_bytes());
    h.update(user.as_bytes());
    h.update(client_nonce);
    *h.finalize().as_bytes()
}

fn mac(key: &[u8; 32], role: &[u8], transcript: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(role);
    h.update(transcript);
    *h.finalize().as_bytes()
}

fn xor(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// The client's token proof over `transcript`.
pub fn client_token_proof(keys: &TokenKeys, transcript: &[u8; 32]) -> [u8; 32] {
    xor(
        &keys.client_key,
        &mac(&keys.verifier.stored_key, b"client", transcript),
    )
}

/// Whether `proof` shows the client knows the token behind `v` (constant time).
pub fn verify_token_proof(v: &TokenVerifier, transcript: &[u8; 32], proof: &[u8; 32]) -> bool {
    let client_key = xor(proof, &mac(&v.stored_key, b"client", transcript));
    blake3::hash(&client_key) == blake3::Hash::from_bytes(v.stored_key)
}

/// The server's token proof over `transcript`.
pub fn server_token_proof(v: &TokenVerifier, transcript: &[u8; 32]) -> [u8; 32] {
    mac(&v.server_key, b"server", transcript)
}

/// The message a client signs with its private key.
pub fn key_auth_message(transcript: &[u8; 32]) -> Vec<u8> {
    let mut m = b"dmover 2026-11 public key auth v2\0".to_vec();
    m.extend_from_slice(transcript);
    m
}

/// A session's key: from the control connection's exported secret (label
/// [`SESSION_EXPORTER_LABEL`], no context), the session id and its salt.
pub fn session_key(exported: &[u8; 32], session: u64, salt: &[u8; 32]) -> [u8; 32] {
    let mut material = [0u8; 72];
    material[..32].copy_from_slice(exported);
    material[32..40].copy_from_slice(&session.to_be_bytes());
    material[40..].copy_from_slice(salt);
    blake3::derive_key("dmover 2026-11 session key v2", &material)
}

/// A session's id and salt (protocol version 8): derived from the control
/// connection's exported secret (label [`SESSION_EXPORTER_LABEL`], no context), so
/// both ends know them once TLS is up and the dialer's data streams join before the
/// acceptor's `Session` names them. One session per control connection, so the id is
/// the connection's; it travels in clear in each `DataHello` and says nothing of the
/// secret (a one-way derivation, apart from the salt's and the key's).
pub fn session_id(exported: &[u8; 32]) -> (u64, [u8; 32]) {
    let id = blake3::derive_key("dmover 2026-11 session id v8", exported);
    let salt = blake3::derive_key("dmover 2026-11 session salt v8", exported);
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    (u64::from_be_bytes(b), salt)
}

/// Which end of a data connection computes a proof or writes records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The end that connected (the dmover client).
    Client = 0,
    /// The end that accepted (the dmover server).
    Server = 1,
}

/// The proof a data connection's `role` end gives that it holds the session key:
/// a MAC over the session, the stream and both nonces of this connection.
pub fn join_proof(
    session_key: &[u8; 32],
    role: Role,
    session: u64,
    stream: u16,
    client_nonce: &[u8; 32],
    server_nonce: &[u8; 32],
) -> [u8; 32] {
    let join_key = blake3::derive_key("dmover 2026-11 data join key v2", session_key);
    let mut h = blake3::Hasher::new_keyed(&join_key);
    h.update(&[role as u8]);
    h.update(&session.to_be_bytes());
    h.update(&stream.to_be_bytes());
    h.update(client_nonce);
    h.update(server_nonce);
    *h.finalize().as_bytes()
}

/// The AES-256-GCM key of the records `writer` sends on data stream `stream`: every
/// stream and direction has its own key, so record nonces can simply count.
pub fn record_key(session_key: &[u8; 32], stream: u16, writer: Role) -> [u8; 32] {
    let mut material = [0u8; 35];
    material[..32].copy_from_slice(session_key);
    material[32..34].copy_from_slice(&stream.to_be_bytes());
    material[34] = writer as u8;
    blake3::derive_key("dmover 2026-11 data record key v2", &material)
}

/// Compares two 32-byte values in constant time.
pub fn proofs_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    blake3::Hash::from_bytes(*a) == blake3::Hash::from_bytes(*b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_proofs_verify_only_with_the_right_token_and_transcript() {
        let keys = token_keys(b"secret\n");
        assert_eq!(keys.client_key, token_keys(b"  secret").client_key);
        let t = transcript(&[1; 32], "alice", &[2; 32]);
        let proof = client_token_proof(&keys, &t);
        assert!(verify_token_proof(&keys.verifier, &t, &proof));
        // Another transcript (another TLS connection, user or nonce): refused.
        for other in [
            transcript(&[9; 32], "alice", &[2; 32]),
            transcript(&[1; 32], "bob", &[2; 32]),
            transcript(&[1; 32], "alice", &[3; 32]),
        ] {
            assert!(!verify_token_proof(&keys.verifier, &other, &proof));
        }
        // Another token: refused.
        let wrong = token_keys(b"other");
        assert!(!verify_token_proof(
            &keys.verifier,
            &t,
            &client_token_proof(&wrong, &t)
        ));
        // The stored verifier alone cannot make a proof.
        let forged = mac(&keys.verifier.stored_key, b"client", &t);
        assert!(!verify_token_proof(&keys.verifier, &t, &forged));
        assert_ne!(
            server_token_proof(&keys.verifier, &t),
            server_token_proof(&wrong.verifier, &t)
        );
    }

    #[test]
    fn verifier_text_round_trips() {
        let v = token_keys(b"tok").verifier;
        let s = v.to_text();
        assert!(s.starts_with("dmover-token-v2:"));
        assert_eq!(TokenVerifier::from_text(&s), Some(v));
        assert_eq!(TokenVerifier::from_text("dmover-token-v2:00:11"), None);
        assert_eq!(TokenVerifier::from_text(&s.replace("v2", "v1")), None);
        assert_eq!(TokenVerifier::from_text(&format!("{s}:x")), None);
    }

    #[test]
    fn join_proofs_and_record_keys_differ_by_role_stream_and_nonce() {
        let k = [7u8; 32];
        let p = join_proof(&k, Role::Client, 1, 0, &[1; 32], &[2; 32]);
        assert_ne!(p, join_proof(&k, Role::Server, 1, 0, &[1; 32], &[2; 32]));
        assert_ne!(p, join_proof(&k, Role::Client, 1, 1, &[1; 32], &[2; 32]));
        assert_ne!(p, join_proof(&k, Role::Client, 1, 0, &[1; 32], &[3; 32]));
        assert_ne!(
            p,
            join_proof(&[8; 32], Role::Client, 1, 0, &[1; 32], &[2; 32])
        );
        assert_ne!(
            record_key(&k, 0, Role::Client),
            record_key(&k, 0, Role::Server)
        );
        assert_ne!(
            record_key(&k, 0, Role::Client),
            record_key(&k, 1, Role::Client)
        );
    }

    #[test]
    fn token_bits_bound_what_a_token_can_hold() {
        // `dmover credential token`: 32 random bytes in base64url, 43 characters.
        assert!(token_bits(b"kQ2x-7pV_aL0mZ3bC8dE1fG4hJ6kN9oR2sT5uW8yXzA\n") >= 256);
        // 32 hex digits: 128 bits of randomness, and the bound says at least that.
        assert!(token_bits(b"0123456789abcdef0123456789abcdef") >= MIN_TOKEN_BITS);
        for weak in [
            &b"sekrit"[..],
            b"alice-token",
            b"correct horse battery",
            b"",
            b"  \n",
        ] {
            assert!(token_bits(weak) < MIN_TOKEN_BITS, "{weak:?}");
        }
        assert_eq!(token_bits(b"aaaa"), (4.0 * 26f64.log2()) as u32);
        assert_eq!(token_bits(b" aA1!\n"), (4.0 * 95f64.log2()) as u32);
    }
}
