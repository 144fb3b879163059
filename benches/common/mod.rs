//! What the benchmarks share: catalogs generated to a given size.

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{Value as Json, json};
use std::path::{Path, PathBuf};

pub mod decisions;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Copies a policy's catalog until it has at least `routes` routes: copy `k`
/// suffixes every provider, credential and model id with `-k` (copy 0 keeps
/// the original ids, so the policy's tenants and requests still fit). The
/// policy and its data are written to a directory of their own; returns the
/// policy's path.
pub fn generate_policy(policy: &str, routes: usize) -> PathBuf {
    let source_dir = Path::new(ROOT).join("policies");
    let policy_text = std::fs::read_to_string(source_dir.join(format!("{policy}.policy"))).unwrap();
    let data_dir = source_dir.join(policy);
    let catalog: Json =
        serde_saphyr::from_str(&std::fs::read_to_string(data_dir.join("catalog.yaml")).unwrap())
            .unwrap();
    let tenants = std::fs::read_to_string(data_dir.join("tenants.yaml")).unwrap();

    let template_routes: usize = catalog["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["routes"].as_array().map_or(0, Vec::len))
        .sum();
    let copies = routes.div_ceil(template_routes.max(1));
    let mut providers = Vec::new();
    let mut models = Vec::new();
    for copy in 0..copies {
        let suffix = |id: &str| {
            if copy == 0 {
                id.to_string()
            } else {
                format!("{id}-{copy}")
            }
        };
        for provider in catalog["providers"].as_array().unwrap() {
            let mut provider = provider.clone();
            let id = provider["id"].as_str().unwrap().to_string();
            provider["id"] = json!(suffix(&id));
            if let Some(name) = provider
                .get("name")
                .and_then(Json::as_str)
                .map(str::to_string)
            {
                provider["name"] = json!(suffix(&name));
            }
            if copy > 0 {
                provider.as_object_mut().unwrap().remove("aliases");
            }
            if let Some(credentials) = provider.get_mut("credentials").and_then(Json::as_array_mut)
            {
                for credential in credentials {
                    let id = credential["id"].as_str().unwrap().to_string();
                    credential["id"] = json!(suffix(&id));
                }
            }
            providers.push(provider);
        }
        for model in catalog["models"].as_array().unwrap() {
            let mut model = model.clone();
            let id = model["id"].as_str().unwrap().to_string();
            model["id"] = json!(suffix(&id));
            if copy > 0 {
                model.as_object_mut().unwrap().remove("aliases");
            }
            for route in model["routes"].as_array_mut().unwrap() {
                let provider = route["provider"].as_str().unwrap().to_string();
                route["provider"] = json!(suffix(&provider));
            }
            models.push(model);
        }
    }
    let mut generated = catalog.clone();
    generated["providers"] = Json::Array(providers);
    generated["models"] = Json::Array(models);

    let dir: PathBuf = std::env::temp_dir().join(format!("switchyard-bench-{policy}-{routes}"));
    std::fs::create_dir_all(&dir).unwrap();
    // YAML is a superset of JSON.
    std::fs::write(
        dir.join("catalog.yaml"),
        serde_json::to_string_pretty(&generated).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("tenants.yaml"), tenants).unwrap();
    let header_start = policy_text.find("\npolicy ").unwrap() + 1;
    let header_end = header_start + policy_text[header_start..].find('}').unwrap() + 1;
    let name = policy.replace('-', "_");
    let rewritten = format!(
        "{}policy {name} {{\n  catalog \"catalog.yaml\"\n  tenants \"tenants.yaml\"\n}}{}",
        &policy_text[..header_start],
        &policy_text[header_end..]
    );
    let path = dir.join("policy.policy");
    std::fs::write(&path, rewritten).unwrap();
    path
}
