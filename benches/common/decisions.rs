//! What the decision benchmark and the `decide` driver share: each
//! reference policy's snapshot on a generated catalog, its benchmark
//! request, and the Noirdoc rules written by hand.

use serde_json::{Value as Json, json};
use std::cmp::Ordering;
use switchyard::compile::{AllSecrets, ModelName, Snapshot, compile_file};
use switchyard::evaluate::{Caller, Endpoint, RequestContext};
use switchyard::value::Value;

pub fn generate(policy: &str, routes: usize) -> Snapshot {
    let path = super::generate_policy(policy, routes);
    match compile_file(&path, &AllSecrets) {
        Ok(snapshot) => snapshot,
        Err(report) => panic!(
            "generated {policy} does not check: {:#?}",
            report.diagnostics
        ),
    }
}

pub fn caller(snapshot: &Snapshot, key: &str) -> Caller {
    let (index, found) = snapshot
        .data
        .tenants
        .keys
        .iter()
        .enumerate()
        .find(|(_, k)| k.id == key)
        .unwrap();
    Caller {
        tenant: found.tenant,
        workspace: found.workspace,
        key: Some(index),
    }
}

/// The request context of a policy's benchmark request, as the proxy
/// would build it.
pub fn context<'a>(
    snapshot: &Snapshot,
    key: &str,
    endpoint: Endpoint,
    body: &'a Json,
    headers: &'a [(String, String)],
) -> RequestContext<'a> {
    RequestContext {
        id: std::sync::Arc::from("bench"),
        endpoint,
        body: Ok(body),
        body_bytes: body.to_string().len(),
        headers,
        caller: caller(snapshot, key),
        seed: 7,
        rotation: &0,
    }
}

/// A typical request for each policy: (key, endpoint, body, headers).
pub fn request(policy: &str) -> (&'static str, Endpoint, Json, Vec<(String, String)>) {
    match policy {
        "noirdoc" => (
            "acme-default",
            Endpoint::ChatCompletions,
            json!({"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "Hello"}]}),
            vec![],
        ),
        "anonrouter" => (
            "lumen-default",
            Endpoint::ChatCompletions,
            json!({"model": "deepseek/deepseek-v3.2", "messages": [{"role": "user", "content": "Hello"}]}),
            vec![],
        ),
        "noeta" => (
            "team-workers",
            Endpoint::Messages,
            json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}),
            vec![],
        ),
        "ngrok" => (
            "tunnelco-default",
            Endpoint::ChatCompletions,
            json!({"model": "gpt-4o", "models": ["claude-sonnet-4-5"], "messages": [{"role": "user", "content": "Hello"}]}),
            vec![],
        ),
        _ => (
            "globex-default",
            Endpoint::Messages,
            json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}),
            vec![(
                String::from("x-ai-setu-provider-order"),
                String::from("bedrock,anthropic"),
            )],
        ),
    }
}

/// The Noirdoc rules by hand: the same steps, keys and failover re-sort as
/// policies/noirdoc.policy, over the same snapshot.
pub struct NativeNoirdoc {
    region: usize,
    cloud_act: usize,
    s203: usize,
    starter: usize,
    secrecy_bound: usize,
    starter_only: usize,
    managed_models: usize,
    allowed_models: usize,
    allowed_providers: usize,
    residency: usize,
    no_cloud_act: usize,
    require_s203: usize,
}

#[derive(Clone, Copy)]
pub struct NativeCandidate {
    pub route: usize,
    pub provider: usize,
    pub credential: usize,
    pub own: bool,
}

impl NativeNoirdoc {
    pub fn new(snapshot: &Snapshot) -> NativeNoirdoc {
        let schema = &snapshot.data.schema;
        NativeNoirdoc {
            region: schema.provider.index_of("region").unwrap(),
            cloud_act: schema.provider.index_of("cloud_act").unwrap(),
            s203: schema.provider.index_of("s203_approved").unwrap(),
            starter: schema.route.index_of("starter_credit").unwrap(),
            secrecy_bound: schema.tenant.index_of("secrecy_bound").unwrap(),
            starter_only: schema.tenant.index_of("starter_only").unwrap(),
            managed_models: schema.tenant.index_of("managed_models").unwrap(),
            allowed_models: schema.key.index_of("allowed_models").unwrap(),
            allowed_providers: schema.key.index_of("allowed_providers").unwrap(),
            residency: schema.key.index_of("residency").unwrap(),
            no_cloud_act: schema.key.index_of("no_cloud_act").unwrap(),
            require_s203: schema.key.index_of("require_s203").unwrap(),
        }
    }

    pub fn decide(
        &self,
        snapshot: &Snapshot,
        caller: Caller,
        model_id: &str,
        endpoint: Endpoint,
    ) -> Result<Vec<NativeCandidate>, &'static str> {
        let data = &snapshot.data;
        let Some(ModelName::Model(model_index)) = snapshot.model_named(model_id) else {
            return Err("model_not_available");
        };
        let model = &data.catalog.models[*model_index];
        let tenant = &data.tenants.tenants[caller.tenant];
        let key = &data.tenants.keys[caller.key.unwrap()];
        let flag = |v: Option<&Value>| matches!(v, Some(Value::Bool(true)));
        fn items(value: Option<&Value>) -> &[Value] {
            value.map(Value::items).unwrap_or(&[])
        }

        let mut candidates: Vec<NativeCandidate> = Vec::new();
        for entry in snapshot.routes_of(*model_index) {
            let provider = &data.catalog.providers[entry.provider];
            let mut best: Option<(usize, bool)> = None;
            for (index, credential) in provider.credentials.iter().enumerate() {
                let own = credential.tenant.as_deref() == Some(tenant.id.as_str());
                let usable = (credential.tenant.is_none() || own)
                    && snapshot.secret(entry.provider, index).is_some();
                if usable && best.is_none_or(|(_, best_own)| own && !best_own) {
                    best = Some((index, own));
                }
            }
            if let Some((credential, own)) = best {
                candidates.push(NativeCandidate {
                    route: entry.route,
                    provider: entry.provider,
                    credential,
                    own,
                });
            }
        }
        if candidates.is_empty() {
            return Err("model_not_available");
        }
        if candidates.iter().any(|c| c.own) {
            candidates.retain(|c| c.own);
        }
        let step = |candidates: &mut Vec<NativeCandidate>,
                    keep: &dyn Fn(&NativeCandidate) -> bool,
                    error: &'static str| {
            candidates.retain(|c| keep(c));
            if candidates.is_empty() {
                Err(error)
            } else {
                Ok(())
            }
        };
        let provider = |c: &NativeCandidate| &data.catalog.providers[c.provider];
        step(
            &mut candidates,
            &|c| model.kind == endpoint.kind() && provider(c).format == endpoint.wire(),
            "wrong_endpoint_for_model",
        )?;
        let allowed_models = items(key.attributes.get(self.allowed_models));
        step(
            &mut candidates,
            &|_| {
                allowed_models.is_empty()
                    || allowed_models.iter().any(|m| m.as_str() == Some(&model.id))
            },
            "model_not_allowed_for_key",
        )?;
        step(
            &mut candidates,
            &|c| {
                !flag(tenant.attributes.get(self.secrecy_bound))
                    || flag(provider(c).attributes.get(self.s203))
            },
            "provider_not_allowed_for_tenant",
        )?;
        let allowed_providers = items(key.attributes.get(self.allowed_providers));
        let residency = items(key.attributes.get(self.residency));
        step(
            &mut candidates,
            &|c| {
                let p = provider(c);
                (allowed_providers.is_empty()
                    || allowed_providers
                        .iter()
                        .any(|a| a.as_str() == Some(&p.name)))
                    && (residency.is_empty()
                        || p.attributes
                            .get(self.region)
                            .is_some_and(|r| residency.contains(r)))
                    && (!flag(key.attributes.get(self.no_cloud_act))
                        || !flag(p.attributes.get(self.cloud_act)))
                    && (!flag(key.attributes.get(self.require_s203))
                        || flag(p.attributes.get(self.s203)))
            },
            "provider_not_allowed_for_key",
        )?;
        step(
            &mut candidates,
            &|c| {
                c.own
                    || !flag(tenant.attributes.get(self.starter_only))
                    || flag(model.routes[c.route].attributes.get(self.starter))
            },
            "starter_model_not_allowed",
        )?;
        step(
            &mut candidates,
            &|c| c.own || flag(tenant.attributes.get(self.managed_models)),
            "model_not_available",
        )?;

        let price = |c: &NativeCandidate| {
            let p = model.routes[c.route].price;
            match (p.input, p.output) {
                (Some(i), Some(o)) => Some(((3.0 * i + o) * 1e9).round() / 1e9),
                _ => None,
            }
        };
        let by_price = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        candidates.sort_by(|a, b| {
            b.own
                .cmp(&a.own)
                .then(price(b).is_some().cmp(&price(a).is_some()))
                .then(by_price(price(a), price(b)))
                .then(
                    provider(b)
                        .priority
                        .partial_cmp(&provider(a).priority)
                        .unwrap_or(Ordering::Equal),
                )
                .then(match (provider(a).listed, provider(b).listed) {
                    (Some(x), Some(y)) => x.cmp(&y),
                    (Some(_), None) => Ordering::Less,
                    (None, Some(_)) => Ordering::Greater,
                    (None, None) => Ordering::Equal,
                })
        });
        if candidates.len() > 1 {
            candidates[1..].sort_by(|a, b| {
                provider(b)
                    .priority
                    .partial_cmp(&provider(a).priority)
                    .unwrap_or(Ordering::Equal)
                    .then(by_price(price(a), price(b)))
            });
        }
        Ok(candidates)
    }
}
