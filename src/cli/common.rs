//! What several commands share: reading request files, finding the caller,
//! printing a failed check.

use crate::compile::Snapshot;
use crate::diagnostics::redact::{looks_like_secret, redact};
use crate::diagnostics::render::{self, Style};
use crate::diagnostics::{did_you_mean, io_reason};
use crate::evaluate::{Caller, Candidate, Endpoint};
use crate::language::CheckReport;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A request as written in a file: an endpoint, headers and a body. A file
/// holding only a body (an object with `model`) is a chat completion.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub body: Json,
}

fn default_endpoint() -> String {
    String::from("chat_completions")
}

impl RequestSpec {
    pub fn from_json(value: Json) -> Result<RequestSpec, String> {
        // A request file is a body, or a body with its endpoint and
        // headers: an endpoint without a body is a mistake, not a body.
        if value.get("endpoint").is_some() && value.get("body").is_none() {
            return Err(String::from(
                "the request file names an `endpoint` but has no `body`; \
                 write the body under `body`, or leave `endpoint` out for a chat completion",
            ));
        }
        // A body may have a `body` field of its own: with a `model` beside
        // it and no `endpoint` or `headers`, it is a body. Anything else
        // with a `body` is a wrapper, whose unknown fields are refused.
        let a_body_of_its_own = value.get("model").is_some()
            && value.get("endpoint").is_none()
            && value.get("headers").is_none();
        if value.get("body").is_some() && !a_body_of_its_own {
            serde_json::from_value(value)
                .map_err(|e| format!("the request file does not have the expected form: {e}"))
        } else {
            Ok(RequestSpec {
                endpoint: default_endpoint(),
                headers: BTreeMap::new(),
                body: value,
            })
        }
    }

    /// The endpoint by name (`messages`) or path (`/v1/messages`).
    pub fn endpoint(&self) -> Result<Endpoint, String> {
        Endpoint::parse(&self.endpoint)
            .or_else(|| Endpoint::from_path(&self.endpoint))
            .ok_or_else(|| {
                format!(
                    "`{}` is not an endpoint; use one of chat_completions, completions, embeddings, responses, messages",
                    self.endpoint
                )
            })
    }

    /// Header names in lowercase, as the evaluator reads them.
    pub fn header_list(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
            .collect()
    }
}

/// The caller a command acts as: a key (by id, or the key itself), or a
/// tenant (optionally a workspace) without a key.
pub fn resolve_caller(
    snapshot: &Snapshot,
    key: Option<&str>,
    tenant: Option<&str>,
    workspace: Option<&str>,
) -> Result<Caller, String> {
    let tenants = &snapshot.data.tenants;
    if key.is_some() && (tenant.is_some() || workspace.is_some()) {
        return Err(String::from(
            "give a key or a tenant (with its workspace), not both: a key belongs to its own tenant",
        ));
    }
    if let Some(key) = key {
        let by_id = tenants.keys.iter().position(|k| k.id == key);
        let by_secret = || {
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            snapshot.key_by_hash(&digest)
        };
        let index = by_id.or_else(by_secret).ok_or_else(|| {
            // A misspelt id is worth a hint; a pasted key is not compared
            // with ids, and is not repeated.
            let hint = if looks_like_secret(key) {
                String::new()
            } else {
                did_you_mean(key, tenants.keys.iter().map(|k| k.id.as_str()))
            };
            format!(
                "no key has the id `{}`, and it is not a known key{hint}",
                redact(key)
            )
        })?;
        let found = tenants.keys.get(index).ok_or("key index out of range")?;
        return Ok(Caller {
            tenant: found.tenant,
            workspace: found.workspace,
            key: Some(index),
        });
    }
    let Some(tenant) = tenant else {
        return Err(String::from("say who asks: --key KEY or --tenant ID"));
    };
    let tenant_index = tenants
        .tenants
        .iter()
        .position(|t| t.id == tenant)
        .ok_or_else(|| format!("no tenant has the id `{}`", redact(tenant)))?;
    let workspace_index = match workspace {
        None => 0,
        Some(workspace) => tenants
            .tenants
            .get(tenant_index)
            .and_then(|t| t.workspaces.iter().position(|w| w.id == workspace))
            .ok_or_else(|| {
                format!(
                    "tenant `{}` has no workspace `{}`",
                    redact(tenant),
                    redact(workspace)
                )
            })?,
    };
    Ok(Caller {
        tenant: tenant_index,
        workspace: workspace_index,
        key: None,
    })
}

/// Prints the diagnostics of a policy that did not check.
pub fn print_report(report: &CheckReport) {
    for diagnostic in report.diagnostics.iter() {
        say_err!(
            "{}\n",
            render::human(diagnostic, &report.sources, Style::Plain)
        );
    }
}

/// The files that paths name: a file as given, a directory's files whose
/// names end in `suffix` (sorted); no paths means `policies/`. A directory
/// holding none of them is an error, as a path that does not exist is.
pub fn files_named(paths: &[PathBuf], suffix: &str) -> Result<Vec<PathBuf>, String> {
    let paths = if paths.is_empty() {
        let default = PathBuf::from("policies");
        if !default.exists() {
            return Err(String::from(
                "no path given, and there is no `policies` directory here (the default); \
                 name the files or directories to use",
            ));
        }
        vec![default]
    } else {
        paths.to_vec()
    };
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|e| format!("cannot read `{}`: {}", path.display(), io_reason(&e)))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|file| {
                    file.file_name()
                        .is_some_and(|name| name.to_string_lossy().ends_with(suffix))
                })
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(format!("`{}` holds no `*{suffix}` files", path.display()));
            }
            files.extend(found);
        } else if path.is_file() {
            files.push(path);
        } else {
            return Err(why_no_file(&path));
        }
    }
    // A file named twice (`policies/x policies/*`) is run once.
    let mut seen = std::collections::HashSet::new();
    files.retain(|file| seen.insert(std::fs::canonicalize(file).unwrap_or_else(|_| file.clone())));
    Ok(files)
}

/// Why a path that is neither a file nor a directory names no file to read:
/// it does not exist, it is another kind of file (a pipe, a device), or it
/// cannot be looked at (a loop of symbolic links).
pub fn why_no_file(path: &std::path::Path) -> String {
    match std::fs::metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            format!("`{}` does not exist", path.display())
        }
        Err(error) => format!("cannot look at `{}`: {}", path.display(), io_reason(&error)),
        Ok(_) => format!(
            "`{}` is not a regular file (a pipe or a device?); give a file or a directory",
            path.display()
        ),
    }
}

/// Why a policy path given on the command line names no file: a misuse of
/// the command (exit 2), not a problem in a policy.
pub fn not_a_policy_file(path: &std::path::Path) -> Option<String> {
    if path.is_dir() {
        Some(format!(
            "`{}` is a directory; give the policy file",
            path.display()
        ))
    } else if path.exists() {
        // A file, or something read like one (a pipe, `/dev/fd/N`).
        None
    } else {
        Some(why_no_file(path))
    }
}

/// How `serve`, `demo` and `sim` let a user pick another address.
#[cfg(feature = "server")]
pub const CHOOSE_ANOTHER: &str = "choose another address with `--listen ADDR`";

/// Why `who` could not listen on `address`, and what to do about it.
/// `choose_another` says how to pick another address; `None` where the
/// address is fixed (the demo's simulated providers, which the shipped
/// catalog names).
#[cfg(feature = "server")]
pub fn listen_failure(
    who: &str,
    address: impl std::fmt::Display,
    error: &std::io::Error,
    choose_another: Option<&str>,
) -> String {
    use std::io::ErrorKind;
    let help = match (error.kind(), choose_another) {
        (ErrorKind::AddrInUse, Some(choose)) => {
            format!("another process listens there: stop it, or {choose}")
        }
        (ErrorKind::AddrInUse, None) => {
            String::from("another process listens there: stop it (the catalog names this address)")
        }
        (ErrorKind::AddrNotAvailable, Some(choose)) => format!(
            "{choose}: 127.0.0.1:PORT for this machine alone, 0.0.0.0:PORT for all its networks"
        ),
        (ErrorKind::PermissionDenied, Some(choose)) => {
            format!("ports below 1024 need privileges: {choose}, on a port above 1023")
        }
        (_, Some(choose)) => String::from(choose),
        (_, None) => return format!("{who} cannot listen on {address}: {}", io_reason(error)),
    };
    format!(
        "{who} cannot listen on {address}: {}\n = help: {help}",
        io_reason(error)
    )
}

/// How precisely a plan's entries must be shown to tell its candidates
/// apart: with their credentials when two share a provider and a model,
/// with their models when they serve more than one.
pub fn entry_detail(candidates: &[Candidate]) -> (bool, bool) {
    let with_model = candidates.windows(2).any(
        |pair| matches!(pair, [a, b] if a.model != b.model || a.requested.id != b.requested.id),
    );
    let with_credential = candidates.iter().enumerate().any(|(n, a)| {
        candidates.iter().skip(n + 1).any(|b| {
            a.provider == b.provider && a.model == b.model && a.requested.id == b.requested.id
        })
    });
    (with_credential, with_model)
}

/// A plan's candidates as `explain` shows them and test cases write them:
/// with the credential and model where they tell candidates apart.
pub fn plan_entries(snapshot: &Snapshot, candidates: &[Candidate]) -> Vec<String> {
    let (with_credential, with_model) = entry_detail(candidates);
    candidates
        .iter()
        .map(|c| plan_entry(snapshot, c, with_credential, with_model))
        .collect()
}

/// A plan entry in the test files' notation, which `explain` shows too:
/// `provider`, `provider/credential`, `provider@model` or
/// `provider/credential@model`. The model is its catalog id, or the id
/// requested of an `unknown serve` tier.
pub fn plan_entry(
    snapshot: &Snapshot,
    candidate: &Candidate,
    with_credential: bool,
    with_model: bool,
) -> String {
    let mut text = snapshot
        .provider(candidate.provider)
        .map_or_else(|| String::from("?"), |p| p.id.clone());
    if with_credential {
        text.push('/');
        text.push_str(
            snapshot
                .credential(candidate.provider, candidate.credential)
                .map_or("?", |c| c.id.as_str()),
        );
    }
    if with_model {
        text.push('@');
        let model = candidate
            .model
            .and_then(|m| snapshot.data.catalog.models.get(m))
            .map_or(candidate.requested.id.as_ref(), |m| m.id.as_str());
        text.push_str(model);
    }
    text
}

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;

    #[test]
    fn a_busy_address_says_what_to_do() {
        let busy = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        assert_eq!(
            listen_failure("the proxy", "127.0.0.1:8080", &busy, Some(CHOOSE_ANOTHER)),
            "the proxy cannot listen on 127.0.0.1:8080: the address is in use\n \
             = help: another process listens there: stop it, or choose another address with `--listen ADDR`"
        );
        assert!(
            listen_failure("the simulated providers", "127.0.0.1:9100", &busy, None).ends_with(
                "= help: another process listens there: stop it (the catalog names this address)"
            )
        );
    }

    #[test]
    fn an_unexplained_failure_keeps_the_systems_words() {
        let other = std::io::Error::other("something else");
        assert_eq!(
            listen_failure("the proxy", "127.0.0.1:8080", &other, None),
            "the proxy cannot listen on 127.0.0.1:8080: something else"
        );
    }

    #[test]
    fn a_request_file_is_a_body_or_a_body_with_its_endpoint() {
        let bare = RequestSpec::from_json(serde_json::json!({"model": "m"})).unwrap();
        assert_eq!(bare.endpoint, "chat_completions");
        assert_eq!(bare.body, serde_json::json!({"model": "m"}));
        let wrapped = RequestSpec::from_json(
            serde_json::json!({"endpoint": "messages", "body": {"model": "m"}}),
        )
        .unwrap();
        assert_eq!(wrapped.endpoint, "messages");
        // An endpoint next to a model, not a body: the endpoint would be lost.
        let error =
            RequestSpec::from_json(serde_json::json!({"endpoint": "messages", "model": "m"}))
                .err()
                .unwrap();
        assert!(error.contains("no `body`"), "{error}");
        // A body with a `body` field of its own is still a body.
        let own = serde_json::json!({"model": "m", "body": "hi"});
        let bare = RequestSpec::from_json(own.clone()).unwrap();
        assert_eq!(bare.body, own);
        // A wrapper with a stray `model` is refused, not read as a body.
        let stray =
            serde_json::json!({"endpoint": "embeddings", "model": "m", "body": {"model": "m"}});
        let error = RequestSpec::from_json(stray).err().unwrap();
        assert!(error.contains("unknown field `model`"), "{error}");
    }
}
