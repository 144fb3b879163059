//! Validation of the tenants file: organisations, their workspaces, API keys
//! (stored as SHA-256 hashes) and layered settings.

use super::load::{Validator, unique};
use super::model::*;
use super::schema::Subject;
use super::yaml::*;
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::source::SourceId;
use foldhash::HashMap;
use serde_saphyr::Spanned;

/// The workspace a tenant without declared workspaces gets.
pub const DEFAULT_WORKSPACE: &str = "default";

pub(super) fn validate(
    v: &mut Validator<'_>,
    source: SourceId,
    raw: &RawTenants,
    catalog: &RawCatalog,
    catalog_source: SourceId,
) -> Tenants {
    // Ids end up in logs and metrics: an empty one names nothing, and one
    // that looks like an API key was pasted by mistake (a key's id in place
    // of its digest, most likely).
    for tenant in &raw.tenants {
        let tenant = &tenant.value;
        let ids = std::iter::once(&tenant.id)
            .chain(tenant.workspaces.iter().map(|w| &w.value.id))
            .chain(tenant.keys.iter().map(|k| &k.value.id));
        for id in ids {
            let span = v.span(source, id);
            v.check_name(source, span, "id", &id.value);
        }
    }
    unique(v, source, "tenant", raw.tenants.iter().map(|t| &t.value.id));
    unique(
        v,
        source,
        "key",
        raw.tenants
            .iter()
            .flat_map(|t| t.value.keys.iter().map(|k| &k.value.id)),
    );

    let mut tenants = Vec::new();
    let mut keys = Vec::new();
    let mut hashes: HashMap<[u8; 32], crate::source::Span> = HashMap::default();
    for (tenant_index, raw_tenant) in raw.tenants.iter().enumerate() {
        let t = &raw_tenant.value;
        unique(
            v,
            source,
            "workspace",
            t.workspaces.iter().map(|w| &w.value.id),
        );
        let attributes = v.attributes(
            source,
            Subject::Tenant,
            &t.attributes,
            (&t.id.value, v.span(source, &t.id)),
        );
        let settings = v.settings_layer(source, &t.settings, &t.model_settings);
        let mut workspaces: Vec<Workspace> = t
            .workspaces
            .iter()
            .map(|w| Workspace {
                id: w.value.id.value.clone(),
                attributes: v.attributes(
                    source,
                    Subject::Workspace,
                    &w.value.attributes,
                    (&w.value.id.value, v.span(source, &w.value.id)),
                ),
                settings: v.settings_layer(source, &w.value.settings, &w.value.model_settings),
                at: DataSpan {
                    source,
                    span: v.span(source, &w.value.id),
                },
            })
            .collect();
        let tenant_at = DataSpan {
            source,
            span: v.span(source, &t.id),
        };
        if workspaces.is_empty() {
            workspaces.push(Workspace {
                id: DEFAULT_WORKSPACE.to_string(),
                attributes: v.attributes(
                    source,
                    Subject::Workspace,
                    &SpannedMap::default(),
                    (&DEFAULT_WORKSPACE, tenant_at.span),
                ),
                settings: SettingsLayer::default(),
                at: tenant_at,
            });
        }
        for raw_key in &t.keys {
            if let Some(key) = validate_key(v, source, tenant_index, &workspaces, raw_key) {
                if let Some(first) = hashes.get(&key.sha256) {
                    let first = *first;
                    v.diagnostics.push(
                        Diagnostic::new(
                            codes::DUPLICATE_ID,
                            format!("key `{}` has the same hash as another key", key.id),
                        )
                        .at(source, key.at.span, "same hash")
                        .also(source, first, "first used here")
                        .help("every API key must be distinct; issue a new key for one of them"),
                    );
                } else {
                    hashes.insert(key.sha256, key.at.span);
                }
                keys.push(key);
            }
        }
        tenants.push(Tenant {
            id: t.id.value.clone(),
            attributes,
            settings,
            workspaces,
            at: tenant_at,
        });
    }

    // Credentials owned by a tenant must name one that exists.
    let tenant_ids: Vec<&str> = raw
        .tenants
        .iter()
        .map(|t| t.value.id.value.as_str())
        .collect();
    for provider in &catalog.providers {
        for credential in &provider.value.credentials {
            if let Some(owner) = &credential.value.tenant
                && !tenant_ids.contains(&owner.value.as_str())
            {
                let span = v.span(catalog_source, owner);
                let help = suggest(&owner.value, tenant_ids.iter().copied())
                    .map(|close| format!("did you mean {close}?"));
                v.report(
                    codes::UNKNOWN_REFERENCE,
                    catalog_source,
                    span,
                    format!("no tenant has the id `{}`", owner.value),
                    "unknown tenant",
                    help,
                );
            }
        }
    }

    Tenants {
        source,
        tenants,
        keys,
    }
}

fn validate_key(
    v: &mut Validator<'_>,
    source: SourceId,
    tenant: usize,
    workspaces: &[Workspace],
    raw: &Spanned<RawKey>,
) -> Option<Key> {
    let k = &raw.value;
    let Some(sha256) = parse_sha256(&k.sha256.value) else {
        let span = v.span(source, &k.sha256);
        // What is there instead of a hash may be the key itself: say where,
        // never quote it.
        let mut diagnostic = Diagnostic::new(
            codes::BAD_KEY_HASH,
            format!(
                "the hash of key `{}` is not a SHA-256 hex digest",
                k.id.value
            ),
        )
        .at(source, span, "expected 64 hexadecimal characters")
        .help("store the key's hash, never the key: `printf %s \"$KEY\" | sha256sum`");
        diagnostic.quote_source = false;
        v.diagnostics.push(diagnostic);
        return None;
    };
    let workspace = match &k.workspace {
        None => 0,
        Some(name) => match workspaces.iter().position(|w| w.id == name.value) {
            Some(index) => index,
            None => {
                let span = v.span(source, name);
                let names: Vec<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
                let help = Some(match suggest(&name.value, names.iter().copied()) {
                    Some(close) => format!("did you mean {close}?"),
                    None if names.is_empty() => String::from(
                        "declare it under the tenant's `workspaces:`, or leave `workspace:` out",
                    ),
                    None => format!(
                        "the tenant's workspaces are {}; declare others under its `workspaces:`",
                        names.join(", ")
                    ),
                });
                v.report(
                    codes::UNKNOWN_REFERENCE,
                    source,
                    span,
                    format!("the key's tenant has no workspace `{}`", name.value),
                    "unknown workspace",
                    help,
                );
                return None;
            }
        },
    };
    Some(Key {
        id: k.id.value.clone(),
        sha256,
        tenant,
        workspace,
        attributes: v.attributes(
            source,
            Subject::Key,
            &k.attributes,
            (&k.id.value, v.span(source, &k.id)),
        ),
        settings: v.settings_layer(source, &k.settings, &k.model_settings),
        at: DataSpan {
            source,
            span: v.span(source, &k.id),
        },
    })
}

fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *slot = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::parse_sha256;

    #[test]
    fn hashes_are_64_hex_digits() {
        let hash = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";
        assert_eq!(parse_sha256(hash).unwrap()[0], 0x5e);
        assert!(parse_sha256("abc").is_none());
        assert!(parse_sha256(&"g".repeat(64)).is_none());
    }
}
