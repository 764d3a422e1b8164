//! Signing and checking third-party capabilities ([`dmover_proto::capability`]) with a
//! server's TLS key.

use dmover_proto::capability::{Capability, CapabilityError, Grant, signed_message};
use rustls::SignatureScheme;
use rustls::pki_types::CertificateDer;
use webpki::aws_lc_rs as algs;

use crate::NetError;
use crate::tls::{ServerIdentity, provider, spki_fingerprint};

/// The schemes a capability may be signed with, in order of preference.
const SCHEMES: [SignatureScheme; 4] = [
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ED25519,
    SignatureScheme::RSA_PSS_SHA256,
];

/// Signs `grant` with `id`'s key.
pub fn issue(id: &ServerIdentity, grant: &Grant) -> Result<Capability, NetError> {
    let failed = |what: String| NetError::Tls {
        peer: "this server".into(),
        source: std::io::Error::other(format!("signing a capability: {what}")),
    };
    let key = provider()
        .key_provider
        .load_private_key(id.private_key().clone_key())
        .map_err(|e| failed(e.to_string()))?;
    let signer = key
        .choose_scheme(&SCHEMES)
        .ok_or_else(|| failed("the server's key type cannot sign capabilities".into()))?;
    let body = grant.encode();
    let signature = signer
        .sign(&signed_message(&body))
        .map_err(|e| failed(e.to_string()))?;
    Ok(Capability {
        grant: body,
        cert: id.certificate().to_vec(),
        scheme: u16::from(signer.scheme()),
        signature,
    })
}

/// Checks that `cap` was signed by the key with fingerprint `issuer` and returns its
/// grant (the caller checks expiry, dialer and address: [`Grant::check`]).
pub fn verify(cap: &Capability, issuer: &str) -> Result<Grant, CapabilityError> {
    let cert = CertificateDer::from(cap.cert.as_slice());
    let fp = spki_fingerprint(&cert).map_err(CapabilityError::Malformed)?;
    if fp != issuer {
        return Err(CapabilityError::WrongIssuer {
            got: fp,
            want: issuer.to_string(),
        });
    }
    let alg: &dyn rustls::pki_types::SignatureVerificationAlgorithm =
        match SignatureScheme::from(cap.scheme) {
            SignatureScheme::ECDSA_NISTP256_SHA256 => algs::ECDSA_P256_SHA256,
            SignatureScheme::ECDSA_NISTP384_SHA384 => algs::ECDSA_P384_SHA384,
            SignatureScheme::ED25519 => algs::ED25519,
            SignatureScheme::RSA_PSS_SHA256 => algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
            other => {
                return Err(CapabilityError::BadSignature(format!(
                    "unsupported scheme {other:?}"
                )));
            }
        };
    let ee = webpki::EndEntityCert::try_from(&cert)
        .map_err(|e| CapabilityError::Malformed(format!("bad certificate: {e}")))?;
    ee.verify_signature(alg, &signed_message(&cap.grant), &cap.signature)
        .map_err(|e| CapabilityError::BadSignature(format!("{e:?}")))?;
    let g = Grant::decode(&cap.grant)?;
    if g.issuer != fp {
        return Err(CapabilityError::WrongIssuer {
            got: g.issuer,
            want: fp,
        });
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_proto::capability::{GRANT_VERSION, Scope};

    fn grant(issuer: &ServerIdentity) -> Grant {
        Grant {
            version: GRANT_VERSION,
            issuer: issuer.fingerprint().to_string(),
            addrs: vec!["127.0.0.1:7700".into()],
            dialer: "sha256:dialer".into(),
            user: "alice".into(),
            scope: Scope::Pull {
                sources: vec![b"data".to_vec()],
            },
            expires: 2_000_000_000,
            nonce: [1; 16],
        }
    }

    #[test]
    fn an_issued_capability_verifies_under_its_issuer_only() {
        let b = ServerIdentity::ephemeral().unwrap();
        let other = ServerIdentity::ephemeral().unwrap();
        let g = grant(&b);
        let cap = issue(&b, &g).unwrap();
        assert_eq!(verify(&cap, b.fingerprint()).unwrap(), g);
        // Pinned to another key: refused before the signature is looked at.
        assert!(matches!(
            verify(&cap, other.fingerprint()),
            Err(CapabilityError::WrongIssuer { .. })
        ));
    }

    #[test]
    fn a_changed_grant_or_signature_or_a_foreign_certificate_is_refused() {
        let b = ServerIdentity::ephemeral().unwrap();
        let cap = issue(&b, &grant(&b)).unwrap();
        // A widened scope, same signature.
        let mut wider = grant(&b);
        wider.scope = Scope::Pull {
            sources: vec![b"".to_vec()],
        };
        let forged = Capability {
            grant: wider.encode(),
            ..cap.clone()
        };
        assert!(matches!(
            verify(&forged, b.fingerprint()),
            Err(CapabilityError::BadSignature(_))
        ));
        let mut flipped = cap.clone();
        let last = flipped.signature.len() - 1;
        flipped.signature[last] ^= 1;
        assert!(matches!(
            verify(&flipped, b.fingerprint()),
            Err(CapabilityError::BadSignature(_))
        ));
        // Signed by another key that claims to be b in the grant, with its own
        // certificate: the pin catches it.
        let mallory = ServerIdentity::ephemeral().unwrap();
        let claims_b = issue(&mallory, &grant(&b)).unwrap();
        assert!(matches!(
            verify(&claims_b, b.fingerprint()),
            Err(CapabilityError::WrongIssuer { .. })
        ));
        // Its own key pinned, but the grant names b as issuer.
        assert!(matches!(
            verify(&claims_b, mallory.fingerprint()),
            Err(CapabilityError::WrongIssuer { .. })
        ));
    }
}
