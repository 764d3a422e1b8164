//! `dmover config check`: reads the client's configuration file (docs/client.md) as a
//! command would, and tells which file it is, each host profile as it resolves
//! (what is dialed, the user, the credential file: readable, and its mode), the job
//! service's URL. Exit 0 when it is fine (a credential file others can read is a
//! warning), 2 naming the key and its line when not, as `dmover serve --check`.

use std::path::Path;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::env::Env;
use crate::resolve::profile::{self, HostProfile, Profiles};

/// `dmover config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check the client's configuration file (DMOVER_CONFIG, else
    /// ~/.config/dmover/config.toml) and show each host profile as it resolves: exit 0
    /// when it is fine, 2 naming the key and its line when not.
    Check {
        /// Print one JSON object instead.
        #[arg(long)]
        json: bool,
    },
}

/// `dmover config`.
pub fn run(a: ConfigArgs, env: &Env) -> ExitCode {
    let ConfigCommand::Check { json } = a.command;
    match check(env) {
        Ok((report, warnings)) => {
            for w in &warnings {
                eprintln!("dmover: warning: {w}");
            }
            if json {
                let mut report = report;
                report["warnings"] = json!(warnings);
                println!("{report}");
            } else {
                print!("{}", text(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "dmover: error: {}",
                crate::output::printable(&format!("{e:#}"))
            );
            ExitCode::from(2)
        }
    }
}

/// The report of the file, and the warnings.
fn check(env: &Env) -> anyhow::Result<(Value, Vec<String>)> {
    let Some((path, _)) = profile::path(env) else {
        anyhow::bail!("no configuration directory: set HOME, XDG_CONFIG_HOME or DMOVER_CONFIG");
    };
    let Some(p) = profile::load(env)? else {
        let report = json!({ "file": path, "exists": false, "hosts": [] });
        return Ok((report, Vec::new()));
    };
    let text = std::fs::read_to_string(&p.path).unwrap_or_default();
    let mut warnings = Vec::new();
    let mut hosts = Vec::new();
    for (name, h) in &p.file.host {
        let at = Some(line_of(&text, &format!("host.{name}")))
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| line_of(&text, &format!("host.\"{name}\"")));
        let credential = credential(h.token_file.as_deref(), h.key.as_deref(), &mut warnings)
            .map_err(|e| anyhow::anyhow!("[host.{name}]{at}: {e:#}"))?;
        hosts.push(host(&p, name, h, credential));
    }
    let d = &p.file.defaults;
    let at = line_of(&text, "defaults");
    let defaults_credential = credential(d.token_file.as_deref(), d.key.as_deref(), &mut warnings)
        .map_err(|e| anyhow::anyhow!("[defaults]{at}: {e:#}"))?;
    let report = json!({
        "file": p.path,
        "exists": true,
        "service": d.service,
        "defaults": {
            "user": d.user,
            "credential": defaults_credential,
            "known_hosts": d.known_hosts,
            "streams": d.streams,
            "retries": d.retries,
            "retry_wait": d.retry_wait.map(secs),
            "busy_wait": d.busy_wait.map(secs),
        },
        "hosts": hosts,
    });
    Ok((report, warnings))
}

/// A duration as `N s`.
fn secs(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// The options of cp and sync that `v` (`[defaults]` or a host) sets, as
/// `KEY VALUE`s.
fn options(v: &Value) -> Vec<String> {
    ["streams", "retries", "retry_wait", "busy_wait"]
        .iter()
        .filter(|k| !v[**k].is_null())
        .map(|k| format!("{k} {}", v[*k].to_string().trim_matches('"')))
        .collect()
}

/// ` (line N)` of the table `[NAME]` in `text`, or nothing.
fn line_of(text: &str, table: &str) -> String {
    text.lines()
        .position(|l| {
            let l = l.trim();
            l == format!("[{table}]") || l.starts_with(&format!("[{table}]"))
        })
        .map_or(String::new(), |n| format!(" (line {})", n + 1))
}

/// A host profile as it resolves.
fn host(p: &Profiles, name: &str, h: &HostProfile, credential: Value) -> Value {
    let d = &p.file.defaults;
    let address = h.address.clone().unwrap_or_else(|| name.to_string());
    let port = h.port.unwrap_or(dmover_proto::DEFAULT_PORT);
    let credential = if credential.is_null() {
        json!({ "from": "defaults", "file": d.key.as_ref().or(d.token_file.as_ref()) })
    } else {
        credential
    };
    json!({
        "name": name,
        "dial": format!("{address}:{port}"),
        "user": h.user.as_ref().or(d.user.as_ref()),
        "credential": credential,
        "streams": h.streams,
        "retries": h.retries,
        "retry_wait": h.retry_wait.map(secs),
        "busy_wait": h.busy_wait.map(secs),
    })
}

/// A credential file's report (a key first, as a command takes it), or null when
/// none is named; an error when it cannot be read or is no credential.
fn credential(
    token_file: Option<&Path>,
    key: Option<&Path>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Value> {
    let (kind, file) = match (key, token_file) {
        (Some(k), _) => ("key", k),
        (None, Some(t)) => ("token", t),
        (None, None) => return Ok(Value::Null),
    };
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(file)
            .map(|m| m.permissions().mode() & 0o777)
            .map_err(|e| anyhow::anyhow!("{kind} file {}: {e}", file.display()))?
    };
    match kind {
        "key" => drop(dmover_core::access::ClientKey::load(file)?),
        _ => drop(crate::resolve::token_file(file)?),
    }
    let loose = profile::loose_mode(file);
    warnings.extend(loose.clone());
    Ok(json!({
        "kind": kind,
        "file": file,
        "readable": true,
        "mode": format!("{mode:03o}"),
        "mode_ok": loose.is_none(),
    }))
}

/// The report as lines.
fn text(r: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let file = s(&r["file"]);
    if r["exists"] == json!(false) {
        return format!("config {file}: none (built-in defaults)\n");
    }
    let cred = |c: &Value| match c["kind"].as_str() {
        Some(kind) => format!(
            "{kind} {} (readable, mode {}{})",
            s(&c["file"]),
            s(&c["mode"]),
            if c["mode_ok"] == json!(true) {
                ""
            } else {
                ": chmod 600"
            }
        ),
        None => match c["file"].as_str() {
            Some(f) => format!("[defaults]' {f}"),
            None => "none".into(),
        },
    };
    let mut out = format!("config {file}: OK\n");
    out.push_str(&format!(
        "service: {}\n",
        r["service"].as_str().unwrap_or("none")
    ));
    let d = &r["defaults"];
    out.push_str(&format!(
        "defaults: user {}, credential {}\n",
        d["user"].as_str().unwrap_or("none"),
        cred(&d["credential"])
    ));
    let set = options(d);
    if !set.is_empty() {
        out.push_str(&format!("options: {}\n", set.join(", ")));
    }
    for h in r["hosts"].as_array().into_iter().flatten() {
        let set = options(h);
        out.push_str(&format!(
            "host {}: {}, user {}, credential {}{}{}\n",
            s(&h["name"]),
            s(&h["dial"]),
            h["user"].as_str().unwrap_or("none"),
            cred(&h["credential"]),
            if set.is_empty() { "" } else { ", " },
            set.join(", ")
        ));
    }
    out
}
