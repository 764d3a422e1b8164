//! `dmover credential`: make tokens and keys, and print what the server's config needs.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;

use anyhow::Context;
use base64::Engine;
use dmover_core::access::{ClientKey, format_public_key};
use dmover_proto::auth::{MIN_TOKEN_BITS, token_bits, token_keys};

use crate::args::{CredentialArgs, CredentialCommand};

/// `dmover credential`.
pub fn run(a: CredentialArgs) -> anyhow::Result<ExitCode> {
    match a.command {
        CredentialCommand::Token { file } => {
            let raw: [u8; 32] = rand::random();
            let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .with_context(|| format!("creating {}", file.display()))?;
            writeln!(f, "{token}").with_context(|| format!("writing {}", file.display()))?;
            eprintln!(
                "wrote a new token to {}; give it to the client (--token-file), and put this \
                 line under the user in the server's config:",
                file.display()
            );
            println!(
                "token = \"{}\"",
                token_keys(token.as_bytes()).verifier.to_text()
            );
        }
        CredentialCommand::Verifier { file } => {
            let token = crate::resolve::token_file(&file)?;
            let bits = token_bits(&token);
            if bits < MIN_TOKEN_BITS {
                anyhow::bail!(
                    "{}: this token holds at most {bits} bits of entropy, under the \
                     {MIN_TOKEN_BITS} a verifier needs (whoever reads a server's config can \
                     test guesses against a verifier offline, fast); make a token with \
                     `dmover credential token FILE`, or use one of at least 22 random \
                     characters of letters and digits",
                    file.display()
                );
            }
            println!("token = \"{}\"", token_keys(&token).verifier.to_text());
        }
        CredentialCommand::Key { file } => {
            let key = ClientKey::generate(&file)?;
            eprintln!(
                "wrote a new Ed25519 key to {} (public half in {}.pub); use it with --key, \
                 and put this under the user in the server's config:",
                file.display(),
                file.display()
            );
            println!("keys = [\"{}\"]", format_public_key(&key.public()));
        }
    }
    Ok(ExitCode::SUCCESS)
}
