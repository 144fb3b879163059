//! Compile: a checked policy and its data become one immutable [`Snapshot`].
//!
//! Everything that depends only on the data is done here, once: model ids and
//! aliases become a lookup table, each model's routes are paired with their
//! credentials, provider names and credential ids for pins are indexed, and
//! each credential's secret is read from the environment. Per request, the
//! evaluator then only looks at the requested model's own candidates.

use crate::data::{Credential, Data, Provider};
use crate::language::CheckedPolicy;
use crate::language::ir::Program;
use crate::value::Value;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A credential's secret, read from the environment when the snapshot was
/// built. It never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where the snapshot reads credential secrets from.
pub trait SecretSource {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct Environment;

impl SecretSource for Environment {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|value| !value.is_empty())
    }
}

/// Secrets from a fixed table (tests, `explain`, `switchyard test`): every
/// credential named in the table is usable.
#[derive(Debug, Default, Clone)]
pub struct FixedSecrets(pub HashMap<String, String>);

impl SecretSource for FixedSecrets {
    fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

/// Treats every credential as configured, with a placeholder secret: for
/// evaluating decisions where no request is sent.
pub struct AllSecrets;

impl SecretSource for AllSecrets {
    fn get(&self, _name: &str) -> Option<String> {
        Some(String::from("unused"))
    }
}

/// What a model id (or alias) stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelName {
    Model(usize),
    /// An alias for several models, in order.
    Alias(Vec<usize>),
}

/// One route of a model with the credentials that can reach it.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteEntry {
    pub route: usize,
    pub provider: usize,
    /// Indices into the provider's credentials.
    pub credentials: Vec<usize>,
}

/// The compiled policy and data: immutable, shared by every request that
/// starts while it is live.
#[derive(Debug)]
pub struct Snapshot {
    pub name: String,
    /// A content hash of the policy and data, identifying this snapshot.
    pub version: String,
    pub program: Program,
    pub data: Data,
    models: HashMap<String, ModelName>,
    /// Lowercase provider ids, names and aliases → providers answering to them.
    provider_names: HashMap<String, Vec<usize>>,
    /// Credential ids → (provider, credential index).
    credential_ids: HashMap<String, (usize, usize)>,
    /// Per model, its routes with their credentials.
    routes: Vec<Vec<RouteEntry>>,
    /// Per provider and credential, the secret if its variable is set.
    secrets: Vec<Vec<Option<Secret>>>,
    /// Key hashes → key index.
    keys: HashMap<[u8; 32], usize>,
    /// Deployment attribute values, constant for the snapshot.
    pub deployment: Vec<Value>,
}

impl Snapshot {
    /// Builds a snapshot of a checked policy, reading secrets from `secrets`.
    pub fn build(policy: CheckedPolicy, version: String, secrets: &dyn SecretSource) -> Snapshot {
        let CheckedPolicy {
            name,
            program,
            data,
            ..
        } = policy;
        let catalog = &data.catalog;

        let mut models = HashMap::new();
        for (index, model) in catalog.models.iter().enumerate() {
            models.insert(model.id.clone(), ModelName::Model(index));
        }
        for alias in &catalog.aliases {
            let name = match alias.targets.as_slice() {
                [only] => ModelName::Model(*only),
                targets => ModelName::Alias(targets.to_vec()),
            };
            models.entry(alias.name.clone()).or_insert(name);
        }

        let mut provider_names: HashMap<String, Vec<usize>> = HashMap::new();
        let mut credential_ids = HashMap::new();
        for (index, provider) in catalog.providers.iter().enumerate() {
            let mut names: Vec<String> = std::iter::once(&provider.id)
                .chain(std::iter::once(&provider.name))
                .chain(provider.aliases.iter())
                .map(|name| name.to_ascii_lowercase())
                .collect();
            names.sort();
            names.dedup();
            for name in names {
                provider_names.entry(name).or_default().push(index);
            }
            for (credential_index, credential) in provider.credentials.iter().enumerate() {
                credential_ids.insert(credential.id.clone(), (index, credential_index));
            }
        }

        let routes = catalog
            .models
            .iter()
            .map(|model| {
                model
                    .routes
                    .iter()
                    .enumerate()
                    .map(|(route_index, route)| RouteEntry {
                        route: route_index,
                        provider: route.provider,
                        credentials: catalog
                            .providers
                            .get(route.provider)
                            .map_or_else(Vec::new, |provider| {
                                (0..provider.credentials.len()).collect()
                            }),
                    })
                    .collect()
            })
            .collect();

        let secrets = catalog
            .providers
            .iter()
            .map(|provider| {
                provider
                    .credentials
                    .iter()
                    .map(|credential| {
                        secrets
                            .get(&credential.env)
                            .map(|value| Secret(Arc::from(value)))
                    })
                    .collect()
            })
            .collect();

        let keys = data
            .tenants
            .keys
            .iter()
            .enumerate()
            .map(|(index, key)| (key.sha256, index))
            .collect();
        let deployment = data
            .schema
            .deployment
            .entries
            .iter()
            .enumerate()
            .map(|(index, decl)| {
                catalog
                    .deployment
                    .get(index)
                    .cloned()
                    .or_else(|| decl.fallback())
                    .unwrap_or(Value::Null)
            })
            .collect();

        Snapshot {
            name,
            version,
            program,
            data,
            models,
            provider_names,
            credential_ids,
            routes,
            secrets,
            keys,
            deployment,
        }
    }

    pub fn model_named(&self, id: &str) -> Option<&ModelName> {
        self.models.get(id)
    }

    /// Providers a pin's or input's provider reference means (ignoring case).
    pub fn providers_named(&self, text: &str) -> &[usize] {
        self.provider_names
            .get(&text.to_ascii_lowercase())
            .map_or(&[], Vec::as_slice)
    }

    pub fn credential_with_id(&self, id: &str) -> Option<(usize, usize)> {
        self.credential_ids.get(id).copied()
    }

    pub fn routes_of(&self, model: usize) -> &[RouteEntry] {
        self.routes.get(model).map_or(&[], Vec::as_slice)
    }

    pub fn provider(&self, index: usize) -> Option<&Provider> {
        self.data.catalog.providers.get(index)
    }

    pub fn credential(&self, provider: usize, credential: usize) -> Option<&Credential> {
        self.provider(provider)?.credentials.get(credential)
    }

    pub fn secret(&self, provider: usize, credential: usize) -> Option<&Secret> {
        self.secrets.get(provider)?.get(credential)?.as_ref()
    }

    /// The key with this SHA-256 digest.
    pub fn key_by_hash(&self, digest: &[u8; 32]) -> Option<usize> {
        self.keys.get(digest).copied()
    }
}

/// Checks a policy file with its data and compiles it: the path `check`,
/// `explain`, `test` and live reloads all take. On failure, the report says why.
pub fn compile_file(
    path: &std::path::Path,
    secrets: &dyn SecretSource,
) -> Result<Snapshot, Box<crate::language::CheckReport>> {
    compile_report(crate::language::check_file(path), secrets).map(|(snapshot, _)| snapshot)
}

/// Compiles a check report's policy, keeping the files read (for commands
/// that quote policy lines).
pub fn compile_report(
    mut report: crate::language::CheckReport,
    secrets: &dyn SecretSource,
) -> Result<(Snapshot, crate::source::SourceMap), Box<crate::language::CheckReport>> {
    match report.policy.take() {
        Some(policy) => {
            let mut texts: Vec<&str> = Vec::new();
            let mut index = 0;
            while let Some(file) = report.sources.file_at(index) {
                texts.push(file.text.as_str());
                index += 1;
            }
            let version = content_version(texts);
            Ok((Snapshot::build(policy, version, secrets), report.sources))
        }
        None => Err(Box::new(report)),
    }
}

/// A stable content hash of files, for snapshot versions: FNV-1a, 64 bits,
/// printed as 16 hex digits. It identifies a version; it is not a security
/// measure.
pub fn content_version<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0xff)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_depend_on_every_part_and_its_boundaries() {
        assert_eq!(content_version(["a", "b"]), content_version(["a", "b"]));
        assert_ne!(content_version(["a", "b"]), content_version(["ab", ""]));
        assert_eq!(content_version(["x"]).len(), 16);
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret(Arc::from("sk-live-123"));
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert_eq!(secret.expose(), "sk-live-123");
    }
}
