//! Shared-token authentication: a mutual challenge-response, so the token itself never
//! crosses the wire.
//!
//! Both sides derive a key from the token with BLAKE3's key derivation, then MAC the
//! two nonces exchanged in `Hello` and `Welcome`, with a role label so a client's proof
//! can never be replayed as the server's (or the reverse).

/// Derives the MAC key from a shared token (surrounding whitespace ignored, so a token
/// file may end in a newline).
pub fn token_key(token: &[u8]) -> [u8; 32] {
    blake3::derive_key("dmover 2026 shared-token auth v1", token.trim_ascii())
}

fn proof(
    key: &[u8; 32],
    role: &[u8],
    client_nonce: &[u8; 32],
    server_nonce: &[u8; 32],
) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(role);
    h.update(client_nonce);
    h.update(server_nonce);
    *h.finalize().as_bytes()
}

/// The client's proof of the token.
pub fn client_proof(key: &[u8; 32], client_nonce: &[u8; 32], server_nonce: &[u8; 32]) -> [u8; 32] {
    proof(key, b"client", client_nonce, server_nonce)
}

/// The server's proof of the token.
pub fn server_proof(key: &[u8; 32], client_nonce: &[u8; 32], server_nonce: &[u8; 32]) -> [u8; 32] {
    proof(key, b"server", client_nonce, server_nonce)
}

/// Compares two proofs in constant time.
pub fn proofs_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    blake3::Hash::from_bytes(*a) == blake3::Hash::from_bytes(*b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_tokens_give_different_proofs() {
        let k = token_key(b"secret\n");
        assert_eq!(k, token_key(b"  secret"));
        let (c, s) = ([1u8; 32], [2u8; 32]);
        assert!(proofs_equal(
            &client_proof(&k, &c, &s),
            &client_proof(&k, &c, &s)
        ));
        assert!(!proofs_equal(
            &client_proof(&k, &c, &s),
            &server_proof(&k, &c, &s)
        ));
        assert!(!proofs_equal(
            &client_proof(&k, &c, &s),
            &client_proof(&token_key(b"other"), &c, &s)
        ));
        assert!(!proofs_equal(
            &client_proof(&k, &c, &s),
            &client_proof(&k, &s, &c)
        ));
    }
}
