//! Properties of decisions over generated catalogs, tenants and requests:
//!
//! 1. deciding is deterministic — twice, traced or not, and across two
//!    snapshots compiled from the same text;
//! 2. a restrictive merge never loosens — a tighter tenant default never
//!    widens the candidate set, lowers a floor, raises a ceiling or an
//!    attempt count, and a strict merge refuses a request that loosens its
//!    default;
//! 3. every plan's failover sequence keeps the policy's `keep` constraints,
//!    re-derived here from the generated data;
//! 4. a refusal names the error of the first eligibility step that emptied
//!    the set, and the whole decision matches a reference model of the test
//!    policy written independently below;
//! 5. evaluating the five shipped policies never panics on arbitrary bodies,
//!    headers, callers and endpoints, and decides the same when given only
//!    the body members it reads (what the proxy gives it).
//! 6. a failover sequence follows plan order under any `keep`
//!    (`failover_order_minimal_counterexample` is the case that once broke it).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use proptest::prelude::*;
use proptest::sample::subsequence;
use serde_json::{Value as Json, json};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use switchyard::compile::{AllSecrets, Snapshot, compile_file, compile_report};
use switchyard::diagnostics::Diagnostics;
use switchyard::diagnostics::render::{self, Style};
use switchyard::evaluate::health::{HealthEntry, HealthTable, HealthView, Healthy, Stats};
use switchyard::evaluate::{
    Caller, Candidate, Decision, Endpoint, NOT_AN_OBJECT, Refusal, RequestContext, body_as_read,
    evaluate, evaluate_afresh, evaluate_traced,
};
use switchyard::language::check::Checker;
use switchyard::language::ir::{InputSourceKind, InputType};
use switchyard::language::{CheckReport, CheckedPolicy, parse};
use switchyard::source::SourceMap;

// ---------------------------------------------------------------------------
// The test policy and the shape of its data

/// A policy exercising inputs, layered defaults, every kind of merge (one
/// strict), an eligibility chain with an exclusive preference, sort keys,
/// a random balance, `reorder` and three `keep` constraints. The reference
/// model [`expect`] restates its eligibility, merges and attempts.
const POLICY: &str = r#"
policy properties {
  catalog "catalog.yaml"
  tenants "tenants.yaml"
}

input route from body "route" : {
  only: list<provider>,
  floor: tier,
  max_price: number,
  max_attempts: int 1..9,
  fallbacks: bool,
  regions: list<region>,
}
  malformed error invalid_route
  unknown error unknown_provider

defaults {
  layers key.model, key, workspace.model, workspace, tenant.model, tenant
}

merge {
  only = intersect(input.route.only, defaults.only)
  floor = max(input.route.floor, defaults.floor)
  max_price = min(input.route.max_price, defaults.max_price)
  max_attempts = min(input.route.max_attempts, defaults.max_attempts)
  fallbacks = all(input.route.fallbacks, defaults.fallbacks)
  regions = intersect(input.route.regions, defaults.regions) strict region_not_permitted
}

models {
  credentials each else no_credential
  unknown error unknown_model
}

let own = credential.owned
let price = 3 * route.price.input + route.price.output

eligibility {
  require model.kind == request.kind and provider.format == request.wire else wrong_endpoint
  prefer exclusively own
  require own or tenant.managed else managed_disabled
  require empty(key.regions) or provider.region in key.regions else region_not_allowed_for_key
  require not present(regions) or provider.region in regions else region_not_requested
  require not present(only) or provider.name in only else provider_not_allowed
  require not present(floor) or route.tier >= floor else floor_not_met
  require not present(max_price) or (present(price) and price <= max_price) else too_expensive
}

order {
  by own desc
  by health.penalized
  by price
  by provider.priority desc
}

balance random when request.stream

failover {
  attempts if coalesce(fallbacks, true) then max_attempts else 1
  reorder by provider.priority desc, price
KEEPS
  on 429, 5xx, timeout, connect_error, reset, first_token_timeout, malformed
    => next, error upstream_failed
  on any => stop, error upstream_failed
}

headers {
  "x-provider" = served.provider.name
  "x-attempts" = attempts
}

errors {
  invalid_route = 400, "the route object is malformed"
  unknown_provider = 400, "the route object names an unknown provider"
  region_not_permitted = 403, "the request asks for a region its defaults do not permit"
  no_credential = 503, "no route of the model has a usable credential"
  unknown_model = 404, "there is no such model"
  wrong_endpoint = 400, "the model is not served on this endpoint"
  managed_disabled = 403, "managed providers are disabled for this tenant"
  region_not_allowed_for_key = 403, "the key does not allow these regions"
  region_not_requested = 400, "no provider is in a requested region"
  provider_not_allowed = 403, "no allowed provider serves the model"
  floor_not_met = 403, "no route meets the privacy floor"
  too_expensive = 402, "no route is within the price ceiling"
  upstream_failed = 502, "every provider failed"
}
"#;

/// The `require` errors of [`POLICY`]'s eligibility, in order; `None` marks
/// the `prefer exclusively` step.
const STEP_ERRORS: [Option<&str>; 8] = [
    Some("wrong_endpoint"),
    None,
    Some("managed_disabled"),
    Some("region_not_allowed_for_key"),
    Some("region_not_requested"),
    Some("provider_not_allowed"),
    Some("floor_not_met"),
    Some("too_expensive"),
];

/// The `keep` constraints of [`POLICY`]; [`keeps`] restates them.
const KEEPS: [&str; 3] = [
    "prev.own implies own",
    "route.tier >= prev.route.tier",
    "provider.region == first.provider.region or route.tier > first.route.tier",
];

/// The test policy with these `keep` constraints.
fn policy_with_keeps(keeps: &[&str]) -> String {
    let lines: Vec<String> = keeps
        .iter()
        .map(|keep| format!("  keep {keep}\n"))
        .collect();
    POLICY.replace("KEEPS\n", &lines.concat())
}

/// The test policy as the reference model knows it.
fn policy_text() -> String {
    policy_with_keeps(&KEEPS)
}

const TIERS: [&str; 4] = ["anonymous", "private", "tee", "e2ee"];
const REGIONS: [&str; 3] = ["eu", "us", "ap"];
const KINDS: [&str; 3] = ["chat", "completion", "embedding"];
/// The public name some providers share, so one name can mean several.
const SHARED_NAME: &str = "grp";
/// The `max_attempts` setting's declared default.
const DEFAULT_ATTEMPTS: u32 = 3;

#[derive(Debug, Clone)]
struct ProviderSpec {
    /// Named [`SHARED_NAME`] instead of its id.
    shared_name: bool,
    anthropic: bool,
    priority: u8,
    region: usize,
    /// One entry per credential: the tenant that owns it (BYOK), or none
    /// for the platform's.
    credentials: Vec<Option<usize>>,
}

#[derive(Debug, Clone)]
struct RouteSpec {
    provider: usize,
    tier: usize,
    /// Input and output price in cents.
    price: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
struct ModelSpec {
    kind: usize,
    routes: Vec<RouteSpec>,
}

/// One layer's settings; `None` is "not set here".
#[derive(Debug, Clone, Default, PartialEq)]
struct Settings {
    only: Option<Vec<usize>>,
    floor: Option<usize>,
    /// Cents.
    max_price: Option<u32>,
    max_attempts: Option<u32>,
    fallbacks: Option<bool>,
    regions: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Default)]
struct Layer {
    all: Settings,
    /// Per model index, distinct.
    per_model: Vec<(usize, Settings)>,
}

#[derive(Debug, Clone)]
struct KeySpec {
    workspace: usize,
    regions: Vec<usize>,
    layer: Layer,
}

#[derive(Debug, Clone)]
struct TenantSpec {
    managed: bool,
    layer: Layer,
    workspaces: Vec<Layer>,
    keys: Vec<KeySpec>,
}

#[derive(Debug, Clone)]
struct World {
    providers: Vec<ProviderSpec>,
    models: Vec<ModelSpec>,
    tenants: Vec<TenantSpec>,
}

impl World {
    fn provider_id(index: usize) -> String {
        format!("p{index}")
    }

    fn provider_name(&self, index: usize) -> String {
        if self.providers[index].shared_name {
            SHARED_NAME.to_string()
        } else {
            World::provider_id(index)
        }
    }

    fn model_id(index: usize) -> String {
        format!("m{index}")
    }

    fn key_id(tenant: usize, key: usize) -> String {
        format!("t{tenant}-k{key}")
    }

    fn catalog_yaml(&self) -> String {
        let mut out = String::from(
            "enums:\n  tier: [anonymous, private, tee, e2ee]\n  region: [eu, us, ap]\n\
             attributes:\n  provider:\n    region: {type: region, required: true}\n  \
             route:\n    tier: {type: tier, required: true}\nproviders:\n",
        );
        for (index, provider) in self.providers.iter().enumerate() {
            let id = World::provider_id(index);
            writeln!(out, "  - id: {id}").unwrap();
            if provider.shared_name {
                writeln!(out, "    name: {SHARED_NAME}").unwrap();
            }
            let format = if provider.anthropic {
                "anthropic"
            } else {
                "openai"
            };
            writeln!(out, "    format: {format}").unwrap();
            writeln!(out, "    base_url: http://127.0.0.1:9100/{id}/v1").unwrap();
            writeln!(out, "    priority: {}", provider.priority).unwrap();
            writeln!(out, "    credentials:").unwrap();
            for (credential, owner) in provider.credentials.iter().enumerate() {
                let tenant = owner.map_or_else(String::new, |t| format!(", tenant: t{t}"));
                writeln!(
                    out,
                    "      - {{id: {id}-c{credential}, key: \"${{P{index}_C{credential}}}\"{tenant}}}"
                )
                .unwrap();
            }
            writeln!(
                out,
                "    attributes: {{region: {}}}",
                REGIONS[provider.region]
            )
            .unwrap();
        }
        out.push_str("models:\n");
        for (index, model) in self.models.iter().enumerate() {
            writeln!(out, "  - id: {}", World::model_id(index)).unwrap();
            writeln!(out, "    kind: {}", KINDS[model.kind]).unwrap();
            writeln!(out, "    routes:").unwrap();
            for route in &model.routes {
                let price = route.price.map_or_else(String::new, |(input, output)| {
                    format!(
                        ", price: {{input: {}, output: {}}}",
                        cents(input),
                        cents(output)
                    )
                });
                writeln!(
                    out,
                    "      - {{provider: {}{price}, attributes: {{tier: {}}}}}",
                    World::provider_id(route.provider),
                    TIERS[route.tier]
                )
                .unwrap();
            }
        }
        out
    }

    fn tenants_yaml(&self) -> String {
        let mut out = String::from(
            "attributes:\n  tenant:\n    managed: bool\n  key:\n    regions: list<region>\n\
             settings:\n  only: list<provider>\n  floor: tier\n  max_price: number\n",
        );
        writeln!(
            out,
            "  max_attempts: {{type: number, default: {DEFAULT_ATTEMPTS}}}"
        )
        .unwrap();
        out.push_str("  fallbacks: bool\n  regions: list<region>\ntenants:\n");
        let mut hash = 0u64;
        for (t, tenant) in self.tenants.iter().enumerate() {
            writeln!(out, "  - id: t{t}").unwrap();
            writeln!(out, "    attributes: {{managed: {}}}", tenant.managed).unwrap();
            layer_yaml(&mut out, "    ", &tenant.layer);
            writeln!(out, "    workspaces:").unwrap();
            for (w, workspace) in tenant.workspaces.iter().enumerate() {
                writeln!(out, "      - id: w{w}").unwrap();
                layer_yaml(&mut out, "        ", workspace);
            }
            if tenant.keys.is_empty() {
                writeln!(out, "    keys: []").unwrap();
            } else {
                writeln!(out, "    keys:").unwrap();
            }
            for (k, key) in tenant.keys.iter().enumerate() {
                hash += 1;
                writeln!(out, "      - id: {}", World::key_id(t, k)).unwrap();
                writeln!(out, "        sha256: {hash:064x}").unwrap();
                writeln!(out, "        workspace: w{}", key.workspace).unwrap();
                let regions: Vec<&str> = key.regions.iter().map(|r| REGIONS[*r]).collect();
                writeln!(
                    out,
                    "        attributes: {{regions: [{}]}}",
                    regions.join(", ")
                )
                .unwrap();
                layer_yaml(&mut out, "        ", &key.layer);
            }
        }
        out
    }
}

/// Cents as dollars, exactly as written in YAML and JSON.
fn cents(value: u32) -> String {
    format!("{}.{:02}", value / 100, value % 100)
}

fn layer_yaml(out: &mut String, indent: &str, layer: &Layer) {
    writeln!(out, "{indent}settings: {}", settings_yaml(&layer.all)).unwrap();
    if !layer.per_model.is_empty() {
        writeln!(out, "{indent}model_settings:").unwrap();
        for (model, settings) in &layer.per_model {
            writeln!(
                out,
                "{indent}  {}: {}",
                World::model_id(*model),
                settings_yaml(settings)
            )
            .unwrap();
        }
    }
}

fn settings_yaml(settings: &Settings) -> String {
    let mut fields = Vec::new();
    if let Some(only) = &settings.only {
        let ids: Vec<String> = only.iter().map(|p| World::provider_id(*p)).collect();
        fields.push(format!("only: [{}]", ids.join(", ")));
    }
    if let Some(floor) = settings.floor {
        fields.push(format!("floor: {}", TIERS[floor]));
    }
    if let Some(price) = settings.max_price {
        fields.push(format!("max_price: {}", cents(price)));
    }
    if let Some(attempts) = settings.max_attempts {
        fields.push(format!("max_attempts: {attempts}"));
    }
    if let Some(fallbacks) = settings.fallbacks {
        fields.push(format!("fallbacks: {fallbacks}"));
    }
    if let Some(regions) = &settings.regions {
        let names: Vec<&str> = regions.iter().map(|r| REGIONS[*r]).collect();
        fields.push(format!("regions: [{}]", names.join(", ")));
    }
    format!("{{{}}}", fields.join(", "))
}

// ---------------------------------------------------------------------------
// Requests

/// A provider as a request names it (in upper case when the flag is set:
/// names ignore case).
#[derive(Debug, Clone)]
enum ProviderRef {
    /// By name: its id, or the name it shares with others.
    Name(usize, bool),
    /// By id, which names no provider when the provider shares a name.
    Id(usize, bool),
    Unknown,
}

/// The request's `route` object; every field optional.
#[derive(Debug, Clone, Default)]
struct RouteInput {
    only: Option<Vec<ProviderRef>>,
    floor: Option<usize>,
    max_price: Option<u32>,
    /// 0 and 10 are out of the declared range 1..9.
    max_attempts: Option<u32>,
    fallbacks: Option<bool>,
    regions: Option<Vec<usize>>,
}

#[derive(Debug, Clone)]
struct RequestSpec {
    /// Reduced modulo the tenants, workspaces and keys there are.
    tenant: usize,
    workspace: usize,
    key: Option<usize>,
    /// An endpoint (modulo the five), or, when `fit` is set, a route of
    /// the requested model (modulo its routes) whose endpoint to call.
    endpoint: usize,
    fit: bool,
    /// A model index (modulo the models), or an id the catalog lacks.
    model: Option<usize>,
    route: Option<RouteInput>,
    stream: bool,
    seed: u64,
    /// Per provider (modulo): penalized, paused.
    health: Vec<(usize, bool, bool)>,
}

/// Who asks, as indices into the generated world.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Who {
    tenant: usize,
    workspace: usize,
    key: Option<usize>,
}

impl RequestSpec {
    fn who(&self, world: &World) -> Who {
        let tenant = self.tenant % world.tenants.len();
        let spec = &world.tenants[tenant];
        match self.key {
            Some(key) if !spec.keys.is_empty() => {
                let key = key % spec.keys.len();
                Who {
                    tenant,
                    workspace: spec.keys[key].workspace,
                    key: Some(key),
                }
            }
            _ => Who {
                tenant,
                workspace: self.workspace % spec.workspaces.len(),
                key: None,
            },
        }
    }

    fn endpoint(&self, world: &World) -> Endpoint {
        let Some(model) = self.model(world).filter(|_| self.fit) else {
            return Endpoint::ALL[self.endpoint % Endpoint::ALL.len()];
        };
        let spec = &world.models[model];
        let route = &spec.routes[self.endpoint % spec.routes.len()];
        match (KINDS[spec.kind], world.providers[route.provider].anthropic) {
            ("completion", _) => Endpoint::Completions,
            ("embedding", _) => Endpoint::Embeddings,
            (_, true) => Endpoint::Messages,
            _ if self.endpoint.is_multiple_of(2) => Endpoint::ChatCompletions,
            _ => Endpoint::Responses,
        }
    }

    fn model(&self, world: &World) -> Option<usize> {
        self.model.map(|m| m % world.models.len())
    }

    fn model_id(&self, world: &World) -> String {
        self.model(world)
            .map_or_else(|| String::from("no-such-model"), World::model_id)
    }

    fn body(&self, world: &World) -> Json {
        let mut body = json!({
            "model": self.model_id(world),
            "messages": [{"role": "user", "content": "hello"}],
            "stream": self.stream,
        });
        if let Some(route) = &self.route {
            let mut object = serde_json::Map::new();
            if let Some(only) = &route.only {
                let names: Vec<Json> = only
                    .iter()
                    .map(|reference| match reference {
                        ProviderRef::Name(p, upper) => {
                            let name = world.provider_name(p % world.providers.len());
                            Json::String(if *upper { name.to_uppercase() } else { name })
                        }
                        ProviderRef::Id(p, upper) => {
                            let id = World::provider_id(p % world.providers.len());
                            Json::String(if *upper { id.to_uppercase() } else { id })
                        }
                        ProviderRef::Unknown => Json::String(String::from("nobody")),
                    })
                    .collect();
                object.insert(String::from("only"), Json::Array(names));
            }
            if let Some(floor) = route.floor {
                object.insert(String::from("floor"), json!(TIERS[floor]));
            }
            if let Some(price) = route.max_price {
                let price: f64 = cents(price).parse().unwrap();
                object.insert(String::from("max_price"), json!(price));
            }
            if let Some(attempts) = route.max_attempts {
                object.insert(String::from("max_attempts"), json!(attempts));
            }
            if let Some(fallbacks) = route.fallbacks {
                object.insert(String::from("fallbacks"), json!(fallbacks));
            }
            if let Some(regions) = &route.regions {
                let names: Vec<&str> = regions.iter().map(|r| REGIONS[*r]).collect();
                object.insert(String::from("regions"), json!(names));
            }
            body["route"] = Json::Object(object);
        }
        body
    }

    fn health_entries(&self, world: &World) -> Vec<HealthEntry> {
        self.health
            .iter()
            .map(|(provider, penalized, paused)| HealthEntry {
                provider: World::provider_id(provider % world.providers.len()),
                penalized: *penalized,
                paused_for: paused.then(|| String::from("30s")),
                ..HealthEntry::default()
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Strategies

/// One layer's settings; each is set with probability `set` (a little
/// less for the flags).
fn settings_strategy(providers: usize, set: f64) -> impl Strategy<Value = Settings> {
    (
        prop::option::weighted(
            set,
            subsequence((0..providers).collect::<Vec<_>>(), 0..=providers),
        ),
        prop::option::weighted(set, 0..TIERS.len()),
        prop::option::weighted(set, 30u32..=1000),
        prop::option::weighted(set, 1u32..=5),
        prop::option::weighted(set * 0.8, any::<bool>()),
        prop::option::weighted(set * 0.8, subsequence(vec![0, 1, 2], 0..=3)),
    )
        .prop_map(
            |(only, floor, max_price, max_attempts, fallbacks, regions)| Settings {
                only,
                floor,
                max_price,
                max_attempts,
                fallbacks,
                regions,
            },
        )
}

fn layer_strategy(providers: usize, models: usize, set: f64) -> impl Strategy<Value = Layer> {
    (
        settings_strategy(providers, set),
        prop::collection::vec((0..models, settings_strategy(providers, set)), 0..=1),
    )
        .prop_map(|(all, mut per_model)| {
            per_model.dedup_by_key(|(model, _)| *model);
            Layer { all, per_model }
        })
}

fn tenant_strategy(providers: usize, models: usize, set: f64) -> impl Strategy<Value = TenantSpec> {
    (
        prop::bool::weighted(0.9),
        layer_strategy(providers, models, set),
        prop::collection::vec(layer_strategy(providers, models, set), 1..=2),
        prop::collection::vec(
            (
                0usize..2,
                prop::option::weighted(set * 4.0, subsequence(vec![0, 1, 2], 1..=2)),
                layer_strategy(providers, models, set),
            ),
            0..=2,
        ),
    )
        .prop_map(|(managed, layer, workspaces, keys)| {
            let count = workspaces.len();
            TenantSpec {
                managed,
                layer,
                workspaces,
                keys: keys
                    .into_iter()
                    .map(|(workspace, regions, layer)| KeySpec {
                        workspace: workspace % count,
                        regions: regions.unwrap_or_default(),
                        layer,
                    })
                    .collect(),
            }
        })
}

fn provider_strategy(tenants: usize, byok: f64) -> impl Strategy<Value = ProviderSpec> {
    (
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.25),
        0u8..4,
        0..REGIONS.len(),
        prop::collection::vec(prop::option::weighted(byok, 0..tenants), 1..=3),
    )
        .prop_map(
            |(shared_name, anthropic, priority, region, credentials)| ProviderSpec {
                shared_name,
                anthropic,
                priority,
                region,
                credentials,
            },
        )
}

fn model_strategy(providers: usize) -> impl Strategy<Value = ModelSpec> {
    (
        prop_oneof![3 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)],
        subsequence((0..providers).collect::<Vec<_>>(), 1..=providers).prop_shuffle(),
    )
        .prop_flat_map(|(kind, route_providers)| {
            let count = route_providers.len();
            (
                Just(kind),
                Just(route_providers),
                prop::collection::vec(
                    (
                        0..TIERS.len(),
                        prop::option::weighted(0.85, (1u32..=200, 1u32..=400)),
                    ),
                    count,
                ),
            )
        })
        .prop_map(|(kind, route_providers, details)| ModelSpec {
            kind,
            routes: route_providers
                .into_iter()
                .zip(details)
                .map(|(provider, (tier, price))| RouteSpec {
                    provider,
                    tier,
                    price,
                })
                .collect(),
        })
}

/// Worlds; `lenient` ones set fewer defaults and own fewer credentials, so
/// more requests get plans of several candidates.
fn world_strategy(lenient: bool) -> impl Strategy<Value = World> {
    let (set, byok) = if lenient { (0.04, 0.2) } else { (0.1, 0.4) };
    (1usize..=6, 1usize..=3, 1usize..=3).prop_flat_map(move |(providers, models, tenants)| {
        (
            prop::collection::vec(provider_strategy(tenants, byok), providers),
            prop::collection::vec(model_strategy(providers), models),
            prop::collection::vec(tenant_strategy(providers, models, set), tenants),
        )
            .prop_map(|(providers, models, tenants)| World {
                providers,
                models,
                tenants,
            })
    })
}

fn provider_ref_strategy() -> impl Strategy<Value = ProviderRef> {
    prop_oneof![
        8 => (0usize..8, prop::bool::weighted(0.2))
            .prop_map(|(p, upper)| ProviderRef::Name(p, upper)),
        4 => (0usize..8, prop::bool::weighted(0.2))
            .prop_map(|(p, upper)| ProviderRef::Id(p, upper)),
        1 => Just(ProviderRef::Unknown),
    ]
}

fn route_input_strategy() -> impl Strategy<Value = RouteInput> {
    (
        prop::option::weighted(0.25, prop::collection::vec(provider_ref_strategy(), 1..=4)),
        prop::option::weighted(0.25, 0..TIERS.len()),
        prop::option::weighted(0.25, 30u32..=1000),
        prop::option::weighted(
            0.25,
            prop_oneof![1 => Just(0u32), 12 => 1u32..=9, 1 => Just(10u32)],
        ),
        prop::option::weighted(0.2, any::<bool>()),
        prop::option::weighted(0.2, subsequence(vec![0, 1, 2], 1..=3)),
    )
        .prop_map(
            |(only, floor, max_price, max_attempts, fallbacks, regions)| RouteInput {
                only,
                floor,
                max_price,
                max_attempts,
                fallbacks,
                regions,
            },
        )
}

/// Requests; `lenient` ones call a known model on an endpoint that fits it
/// and rarely restrict the route, so most are planned.
fn request_strategy(lenient: bool) -> impl Strategy<Value = RequestSpec> {
    let (fit, known, restrict) = if lenient {
        (0.99, 0.99, 0.25)
    } else {
        (0.93, 0.93, 0.6)
    };
    (
        (0usize..3, 0usize..2, prop::option::weighted(0.7, 0usize..2)),
        (0usize..10, prop::bool::weighted(fit)),
        prop::option::weighted(known, 0usize..3),
        prop::option::weighted(restrict, route_input_strategy()),
        prop::bool::weighted(0.2),
        any::<u64>(),
        prop::collection::vec((0usize..5, any::<bool>(), prop::bool::weighted(0.2)), 0..=2),
    )
        .prop_map(
            |((tenant, workspace, key), (endpoint, fit), model, route, stream, seed, health)| {
                RequestSpec {
                    tenant,
                    workspace,
                    key,
                    endpoint,
                    fit,
                    model,
                    route,
                    stream,
                    seed,
                    health,
                }
            },
        )
}

fn case_strategy() -> impl Strategy<Value = (World, RequestSpec)> {
    (world_strategy(false), request_strategy(false))
}

fn lenient_case_strategy() -> impl Strategy<Value = (World, RequestSpec)> {
    (world_strategy(true), request_strategy(true))
}

// ---------------------------------------------------------------------------
// Compiling and deciding

/// Checks and compiles policy text over data given as text; generated data
/// must check without a single diagnostic.
fn compile(policy: &str, catalog: &str, tenants: &str) -> Snapshot {
    let mut sources = SourceMap::new();
    let catalog_source = sources.add("catalog.yaml", catalog);
    let tenants_source = sources.add("tenants.yaml", tenants);
    let policy_source = sources.add("properties.policy", policy);
    let (data, mut diagnostics) = switchyard::data::load(catalog_source, tenants_source, &sources);
    let parsed = parse::parse(policy_source, policy);
    let incomplete = !parsed.diagnostics.is_empty();
    diagnostics.extend(parsed.diagnostics);
    let program = data.as_ref().map(|data| {
        let (found, program) = Checker::run(
            policy_source,
            &parsed.file,
            &parsed.broken_names,
            incomplete,
            data,
        );
        diagnostics.extend(found);
        program
    });
    if !diagnostics.is_empty() || data.is_none() {
        let rendered: Vec<String> = diagnostics
            .iter()
            .map(|d| render::human(d, &sources, Style::Plain))
            .collect();
        panic!(
            "generated data does not check cleanly:\n{}\n--- catalog.yaml\n{catalog}\n--- tenants.yaml\n{tenants}",
            rendered.join("\n")
        );
    }
    let policy = CheckedPolicy {
        name: String::from("properties"),
        source: policy_source,
        program: program.unwrap(),
        data: std::sync::Arc::new(data.unwrap()),
    };
    let report = CheckReport {
        sources,
        diagnostics: Diagnostics::new(),
        policy: Some(policy),
        unread: Vec::new(),
    };
    match compile_report(report, &AllSecrets) {
        Ok((snapshot, _)) => snapshot,
        Err(report) => panic!("a checked policy did not compile: {:?}", report.diagnostics),
    }
}

fn compile_world(policy: &str, world: &World) -> Snapshot {
    compile(policy, &world.catalog_yaml(), &world.tenants_yaml())
}

fn caller(snapshot: &Snapshot, who: Who) -> Caller {
    let key = who.key.map(|key| {
        let id = World::key_id(who.tenant, key);
        snapshot
            .data
            .tenants
            .keys
            .iter()
            .position(|k| k.id == id)
            .unwrap()
    });
    Caller {
        tenant: who.tenant,
        workspace: who.workspace,
        key,
    }
}

/// Decides a generated request, traced or not.
fn decide(snapshot: &Snapshot, world: &World, request: &RequestSpec, traced: bool) -> Decision {
    let body = request.body(world);
    let health = HealthTable::new(snapshot, &request.health_entries(world)).unwrap();
    decide_with(snapshot, world, request, &body, &health, traced)
}

fn decide_with(
    snapshot: &Snapshot,
    world: &World,
    request: &RequestSpec,
    body: &Json,
    health: &dyn HealthView,
    traced: bool,
) -> Decision {
    let text = body.to_string();
    let context = RequestContext {
        id: std::sync::Arc::from("req-1"),
        endpoint: request.endpoint(world),
        body: Ok(body),
        body_bytes: text.len(),
        headers: &[],
        caller: caller(snapshot, request.who(world)),
        seed: request.seed,
        rotation: &0,
    };
    if traced {
        evaluate_traced(snapshot, &context, health)
    } else {
        evaluate(snapshot, &context, health)
    }
}

/// What a decision comes to, comparable across runs and snapshots.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Plan {
        candidates: Vec<Candidate>,
        attempts: usize,
        budget_ms: Option<u64>,
        capacity_wait_ms: u64,
        sequence: Vec<usize>,
    },
    Refused(Refusal),
}

fn outcome(snapshot: &Snapshot, decision: &Decision) -> Outcome {
    match &decision.result {
        Ok(plan) => Outcome::Plan {
            candidates: plan.candidates.clone(),
            attempts: plan.attempts,
            budget_ms: plan.budget_ms,
            capacity_wait_ms: plan.capacity_wait_ms,
            sequence: plan.failover_sequence(snapshot, &Healthy),
        },
        Err(refusal) => Outcome::Refused(refusal.clone()),
    }
}

/// A candidate by catalog indices: provider, model, credential.
type CandidateKey = (usize, usize, usize);

fn key_of(candidate: &Candidate) -> CandidateKey {
    (
        candidate.provider,
        candidate
            .model
            .expect("the test policy serves catalog models only"),
        candidate.credential,
    )
}

fn candidate_set(candidates: &[Candidate]) -> BTreeSet<CandidateKey> {
    candidates.iter().map(key_of).collect()
}

// ---------------------------------------------------------------------------
// The reference model of POLICY

/// The defaults a caller sees for a requested model id, resolved through
/// the layers `key.model, key, workspace.model, workspace, tenant.model,
/// tenant`, then the declared defaults.
fn resolve_defaults(world: &World, who: Who, model: Option<usize>) -> Settings {
    let tenant = &world.tenants[who.tenant];
    let mut layers: Vec<&Layer> = Vec::new();
    if let Some(key) = who.key {
        layers.push(&tenant.keys[key].layer);
    }
    layers.push(&tenant.workspaces[who.workspace]);
    layers.push(&tenant.layer);
    // Each level's per-model settings come before its settings for all models.
    let mut ordered: Vec<&Settings> = Vec::new();
    for layer in layers {
        if let Some(model) = model
            && let Some((_, settings)) = layer.per_model.iter().find(|(m, _)| *m == model)
        {
            ordered.push(settings);
        }
        ordered.push(&layer.all);
    }
    fn first<T: Clone>(ordered: &[&Settings], get: impl Fn(&Settings) -> Option<T>) -> Option<T> {
        ordered.iter().find_map(|settings| get(settings))
    }
    Settings {
        only: first(&ordered, |s| s.only.clone()),
        floor: first(&ordered, |s| s.floor),
        max_price: first(&ordered, |s| s.max_price),
        max_attempts: first(&ordered, |s| s.max_attempts).or(Some(DEFAULT_ATTEMPTS)),
        fallbacks: first(&ordered, |s| s.fallbacks),
        regions: first(&ordered, |s| s.regions.clone()),
    }
}

/// The request's values and the merged ones, as the reference model sees them.
#[derive(Debug, Clone, Default)]
struct Merged {
    /// Provider names.
    only: Option<Vec<String>>,
    floor: Option<usize>,
    max_price: Option<u32>,
    max_attempts: Option<u32>,
    fallbacks: Option<bool>,
    regions: Option<Vec<usize>>,
}

fn intersect<T: Clone + PartialEq>(
    request: Option<Vec<T>>,
    default: Option<Vec<T>>,
) -> Option<Vec<T>> {
    match (request, default) {
        (Some(request), Some(default)) => Some(
            request
                .into_iter()
                .filter(|item| default.contains(item))
                .collect(),
        ),
        (request, default) => request.or(default),
    }
}

fn combine<T: Copy>(request: Option<T>, default: Option<T>, op: fn(T, T) -> T) -> Option<T> {
    match (request, default) {
        (Some(request), Some(default)) => Some(op(request, default)),
        (request, default) => request.or(default),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// Refused with this error; `kept` holds the eligibility steps' counts
    /// up to the one that emptied the set (empty before eligibility).
    Refused { code: String, kept: Vec<usize> },
    Planned {
        candidates: BTreeSet<CandidateKey>,
        attempts: usize,
        kept: Vec<usize>,
    },
}

/// The request's `route` values, with provider references as names; `Err`
/// is the input error the request gets.
fn request_values(world: &World, route: Option<&RouteInput>) -> Result<Merged, &'static str> {
    let Some(route) = route else {
        return Ok(Merged::default());
    };
    // Fields are read in their declared order; the first bad one answers.
    let only = match &route.only {
        None => None,
        Some(references) => {
            let mut names = Vec::new();
            for reference in references {
                match reference {
                    ProviderRef::Name(p, _) => {
                        names.push(world.provider_name(p % world.providers.len()));
                    }
                    // Its id is its name, unless it shares one.
                    ProviderRef::Id(p, _) => {
                        let p = p % world.providers.len();
                        if world.providers[p].shared_name {
                            return Err("unknown_provider");
                        }
                        names.push(world.provider_name(p));
                    }
                    ProviderRef::Unknown => return Err("unknown_provider"),
                }
            }
            Some(names)
        }
    };
    if let Some(attempts) = route.max_attempts
        && !(1..=9).contains(&attempts)
    {
        return Err("invalid_route");
    }
    Ok(Merged {
        only,
        floor: route.floor,
        max_price: route.max_price,
        max_attempts: route.max_attempts,
        fallbacks: route.fallbacks,
        regions: route.regions.clone(),
    })
}

/// A route of the requested model with one credential: provider, route
/// index, credential index.
type RouteCredential = (usize, usize, usize);

/// An eligibility step of the reference model: whether it keeps a candidate.
type Step<'a> = &'a dyn Fn(&RouteCredential) -> bool;

/// What POLICY decides for a request, derived from the generated data
/// without the engine.
fn expect(world: &World, request: &RequestSpec) -> Expected {
    let refused = |code: &str, kept: Vec<usize>| Expected::Refused {
        code: code.to_string(),
        kept,
    };
    let who = request.who(world);
    let tenant = &world.tenants[who.tenant];
    let model = request.model(world);

    let asked = match request_values(world, request.route.as_ref()) {
        Ok(asked) => asked,
        Err(code) => return refused(code, Vec::new()),
    };
    let defaults = resolve_defaults(world, who, model);
    let default_only = defaults
        .only
        .map(|only| only.iter().map(|p| world.provider_name(*p)).collect());
    let merged = Merged {
        only: intersect(asked.only.clone(), default_only),
        floor: combine(asked.floor, defaults.floor, usize::max),
        max_price: combine(asked.max_price, defaults.max_price, u32::min),
        max_attempts: combine(asked.max_attempts, defaults.max_attempts, u32::min),
        fallbacks: combine(asked.fallbacks, defaults.fallbacks, |a, b| a && b),
        regions: intersect(asked.regions.clone(), defaults.regions.clone()),
    };
    if asked.regions.is_some() && merged.regions != asked.regions {
        return refused("region_not_permitted", Vec::new());
    }

    let Some(model) = model else {
        return refused("unknown_model", Vec::new());
    };
    let spec = &world.models[model];
    // In catalog order.
    let mut candidates: Vec<RouteCredential> = Vec::new();
    for (route_index, route) in spec.routes.iter().enumerate() {
        for (credential, owner) in world.providers[route.provider]
            .credentials
            .iter()
            .enumerate()
        {
            if owner.is_none_or(|owner| owner == who.tenant) {
                candidates.push((route.provider, route_index, credential));
            }
        }
    }
    if candidates.is_empty() {
        return refused("no_credential", Vec::new());
    }

    let endpoint = request.endpoint(world);
    let own = |c: &RouteCredential| world.providers[c.0].credentials[c.2] == Some(who.tenant);
    let key_regions: Vec<usize> = who
        .key
        .map_or_else(Vec::new, |key| tenant.keys[key].regions.clone());
    let steps: [Step<'_>; 8] = [
        &|c| {
            KINDS[spec.kind] == endpoint.kind().name()
                && world.providers[c.0].anthropic == (endpoint.wire().name() == "anthropic")
        },
        &|c| own(c),
        &|c| own(c) || tenant.managed,
        &|c| key_regions.is_empty() || key_regions.contains(&world.providers[c.0].region),
        &|c| {
            merged
                .regions
                .as_ref()
                .is_none_or(|regions| regions.contains(&world.providers[c.0].region))
        },
        &|c| {
            merged
                .only
                .as_ref()
                .is_none_or(|only| only.contains(&world.provider_name(c.0)))
        },
        &|c| {
            merged
                .floor
                .is_none_or(|floor| spec.routes[c.1].tier >= floor)
        },
        &|c| {
            merged.max_price.is_none_or(|ceiling| {
                spec.routes[c.1]
                    .price
                    .is_some_and(|(input, output)| 3 * input + output <= ceiling)
            })
        },
    ];
    let mut kept_counts = Vec::new();
    for (step, error) in steps.iter().zip(STEP_ERRORS) {
        let kept: Vec<_> = candidates.iter().copied().filter(|c| step(c)).collect();
        match error {
            None if kept.is_empty() => {}
            _ => candidates = kept,
        }
        kept_counts.push(candidates.len());
        if let Some(error) = error
            && candidates.is_empty()
        {
            return refused(error, kept_counts);
        }
    }
    let attempts = if merged.fallbacks.unwrap_or(true) {
        merged.max_attempts.unwrap_or(DEFAULT_ATTEMPTS) as usize
    } else {
        1
    };
    Expected::Planned {
        candidates: candidates.iter().map(|(p, _, c)| (*p, model, *c)).collect(),
        attempts,
        kept: kept_counts,
    }
}

// ---------------------------------------------------------------------------
// Tightening defaults

/// A source of choices for [`tighten`], cycling over generated bytes.
struct Tape<'a> {
    choices: &'a [u8],
    at: usize,
}

impl Tape<'_> {
    fn next(&mut self, range: usize) -> usize {
        let choice = self
            .choices
            .get(self.at % self.choices.len().max(1))
            .copied();
        self.at += 1;
        usize::from(choice.unwrap_or(0)) % range.max(1)
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.next(one_in) == 0
    }
}

/// The tightest value of each setting anywhere in a world: a value added
/// where none was set must be at least as tight as any it may shadow.
struct Tightest {
    only: Vec<usize>,
    floor: usize,
    max_price: Option<u32>,
    max_attempts: u32,
    regions: Vec<usize>,
}

fn every_settings(world: &World) -> Vec<&Settings> {
    let mut all = Vec::new();
    for tenant in &world.tenants {
        let layers = std::iter::once(&tenant.layer)
            .chain(&tenant.workspaces)
            .chain(tenant.keys.iter().map(|k| &k.layer));
        for layer in layers {
            all.push(&layer.all);
            all.extend(layer.per_model.iter().map(|(_, s)| s));
        }
    }
    all
}

fn tightest(world: &World) -> Tightest {
    let all = every_settings(world);
    let mut tightest = Tightest {
        only: (0..world.providers.len()).collect(),
        floor: 0,
        max_price: None,
        max_attempts: DEFAULT_ATTEMPTS,
        regions: vec![0, 1, 2],
    };
    for settings in all {
        if let Some(only) = &settings.only {
            tightest.only.retain(|p| only.contains(p));
        }
        if let Some(floor) = settings.floor {
            tightest.floor = tightest.floor.max(floor);
        }
        if let Some(price) = settings.max_price {
            tightest.max_price = Some(tightest.max_price.map_or(price, |p| p.min(price)));
        }
        if let Some(attempts) = settings.max_attempts {
            tightest.max_attempts = tightest.max_attempts.min(attempts);
        }
        if let Some(regions) = &settings.regions {
            tightest.regions.retain(|r| regions.contains(r));
        }
    }
    tightest
}

fn sublist(items: &[usize], tape: &mut Tape<'_>) -> Vec<usize> {
    items.iter().copied().filter(|_| !tape.chance(4)).collect()
}

/// Tightens one layer's settings: every value set becomes at least as tight,
/// and a value may appear where none was, at least as tight as any in the world.
fn tighten_settings(settings: &mut Settings, tightest: &Tightest, tape: &mut Tape<'_>) {
    settings.only = match settings.only.take() {
        Some(only) => Some(sublist(&only, tape)),
        None if tape.chance(5) => Some(sublist(&tightest.only, tape)),
        None => None,
    };
    settings.floor = match settings.floor {
        Some(floor) => Some((floor + tape.next(2)).min(TIERS.len() - 1)),
        None if tape.chance(5) => Some((tightest.floor + tape.next(2)).min(TIERS.len() - 1)),
        None => None,
    };
    settings.max_price = match settings.max_price {
        Some(price) => Some(price.saturating_sub(tape.next(80) as u32)),
        None if tape.chance(5) => Some(
            tightest
                .max_price
                .unwrap_or(1000)
                .saturating_sub(tape.next(400) as u32),
        ),
        None => None,
    };
    settings.max_attempts = match settings.max_attempts {
        Some(attempts) => Some(attempts.saturating_sub(tape.next(2) as u32).max(1)),
        None if tape.chance(5) => Some(
            tightest
                .max_attempts
                .saturating_sub(tape.next(2) as u32)
                .max(1),
        ),
        None => None,
    };
    settings.fallbacks = match settings.fallbacks {
        Some(true) => Some(!tape.chance(3)),
        Some(false) => Some(false),
        None if tape.chance(6) => Some(false),
        None => None,
    };
    settings.regions = match settings.regions.take() {
        Some(regions) => Some(sublist(&regions, tape)),
        None if tape.chance(6) => Some(sublist(&tightest.regions, tape)),
        None => None,
    };
}

fn tighten_layer(layer: &mut Layer, models: usize, tightest: &Tightest, tape: &mut Tape<'_>) {
    tighten_settings(&mut layer.all, tightest, tape);
    for (_, settings) in &mut layer.per_model {
        tighten_settings(settings, tightest, tape);
    }
    for model in 0..models {
        if !layer.per_model.iter().any(|(m, _)| *m == model) && tape.chance(6) {
            let mut settings = Settings::default();
            tighten_settings(&mut settings, tightest, tape);
            layer.per_model.push((model, settings));
        }
    }
}

/// The same world with every default at least as tight, some newly set.
fn tighten(world: &World, choices: &[u8]) -> World {
    let tightest = tightest(world);
    let mut tape = Tape { choices, at: 0 };
    let models = world.models.len();
    let mut tighter = world.clone();
    for tenant in &mut tighter.tenants {
        tighten_layer(&mut tenant.layer, models, &tightest, &mut tape);
        for workspace in &mut tenant.workspaces {
            tighten_layer(workspace, models, &tightest, &mut tape);
        }
        for key in &mut tenant.keys {
            tighten_layer(&mut key.layer, models, &tightest, &mut tape);
        }
    }
    tighter
}

/// Merged values as a trace prints them.
#[derive(Debug, Default)]
struct TracedMerges {
    only: Option<Option<BTreeSet<String>>>,
    floor: Option<Option<usize>>,
    max_price: Option<Option<f64>>,
    max_attempts: Option<Option<f64>>,
    fallbacks: Option<Option<bool>>,
}

fn traced_merges(decision: &Decision) -> TracedMerges {
    let mut merges = TracedMerges::default();
    for (name, value) in &decision.trace.merges {
        let text = value.to_string();
        let text = text.as_str();
        let present = text != "null";
        match name.as_str() {
            "only" => {
                merges.only = Some(present.then(|| {
                    let inner = text.trim_start_matches('[').trim_end_matches(']');
                    inner
                        .split(", ")
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                }));
            }
            "floor" => {
                merges.floor = Some(present.then(|| {
                    TIERS
                        .iter()
                        .position(|t| *t == text)
                        .unwrap_or_else(|| panic!("`{text}` is not a tier"))
                }));
            }
            "max_price" => merges.max_price = Some(present.then(|| text.parse().unwrap())),
            "max_attempts" => merges.max_attempts = Some(present.then(|| text.parse().unwrap())),
            "fallbacks" => merges.fallbacks = Some(present.then(|| text.parse().unwrap())),
            _ => {}
        }
    }
    merges
}

/// `tighter` is at least as tight as `looser` for a list that restricts
/// (absent: no restriction).
fn list_within(tighter: Option<&BTreeSet<String>>, looser: Option<&BTreeSet<String>>) -> bool {
    match (tighter, looser) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(tighter), Some(looser)) => tighter.is_subset(looser),
    }
}

fn floor_within(tighter: Option<usize>, looser: Option<usize>) -> bool {
    tighter.unwrap_or(0) >= looser.unwrap_or(0)
}

fn ceiling_within(tighter: Option<f64>, looser: Option<f64>) -> bool {
    tighter.unwrap_or(f64::INFINITY) <= looser.unwrap_or(f64::INFINITY)
}

fn flag_within(tighter: Option<bool>, looser: Option<bool>) -> bool {
    tighter.unwrap_or(true) <= looser.unwrap_or(true)
}

/// A proptest configuration with this many cases. Failures are not written
/// to a regressions file: the shrunk case is in the failure message.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        // `PROPTEST_CASES=5000 cargo test --test properties` for a longer hunt.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// 1. Determinism

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn deciding_is_deterministic((world, request) in case_strategy()) {
        let text = policy_text();
        let snapshot = compile_world(&text, &world);
        let again = compile_world(&text, &world);
        prop_assert_eq!(&snapshot.version, &again.version);

        let first = outcome(&snapshot, &decide(&snapshot, &world, &request, false));
        let second = outcome(&snapshot, &decide(&snapshot, &world, &request, false));
        prop_assert_eq!(&first, &second, "the same request decided twice");

        let traced = decide(&snapshot, &world, &request, true);
        prop_assert_eq!(
            &first,
            &outcome(&snapshot, &traced),
            "evaluate and evaluate_traced disagree"
        );
        let traced_again = decide(&snapshot, &world, &request, true);
        prop_assert_eq!(
            format!("{:?}", traced.trace),
            format!("{:?}", traced_again.trace),
            "two traces of one request differ"
        );

        let other = outcome(&again, &decide(&again, &world, &request, false));
        prop_assert_eq!(&first, &other, "two snapshots of the same text disagree");
    }
}

// ---------------------------------------------------------------------------
// 2. Restrictive merges never loosen

proptest! {
    #![proptest_config(config(192))]

    #[test]
    fn tighter_defaults_never_loosen_a_decision(
        (world, request) in case_strategy(),
        choices in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let text = policy_text();
        let tighter = tighten(&world, &choices);
        let loose = compile_world(&text, &world);
        let tight = compile_world(&text, &tighter);
        let before = decide(&loose, &world, &request, true);
        let after = decide(&tight, &tighter, &request, true);

        // The candidate set only shrinks; a refusal is the empty set.
        if let Ok(tight_plan) = &after.result {
            let loose_plan = before.result.as_ref().map_err(|refusal| {
                TestCaseError::fail(format!(
                    "refused with {} before tightening, planned after",
                    refusal.error.code
                ))
            })?;
            let (loose_set, tight_set) = (
                candidate_set(&loose_plan.candidates),
                candidate_set(&tight_plan.candidates),
            );
            prop_assert!(
                tight_set.is_subset(&loose_set),
                "tightening widened the candidates: {:?} → {:?}",
                loose_set,
                tight_set
            );
            prop_assert!(
                tight_plan.attempts <= loose_plan.attempts,
                "tightening raised attempts: {} → {}",
                loose_plan.attempts,
                tight_plan.attempts
            );
        }
        // Both refused by eligibility: the tighter set empties no later.
        let eligibility = |d: &Decision| {
            d.trace
                .refused
                .as_deref()
                .is_some_and(|r| r.starts_with("no candidate passed step"))
        };
        if eligibility(&before) && eligibility(&after) {
            prop_assert!(after.trace.steps.len() <= before.trace.steps.len());
        }

        // Merged values: no looser than before, than the request, or than
        // the tightened default.
        let (was, now) = (traced_merges(&before), traced_merges(&after));
        if let (Some(was), Some(now)) = (&was.only, &now.only) {
            prop_assert!(
                list_within(now.as_ref(), was.as_ref()),
                "only widened: {:?} → {:?}",
                was,
                now
            );
        }
        if let (Some(was), Some(now)) = (was.floor, now.floor) {
            prop_assert!(floor_within(now, was), "floor lowered: {:?} → {:?}", was, now);
        }
        if let (Some(was), Some(now)) = (was.max_price, now.max_price) {
            prop_assert!(ceiling_within(now, was), "price ceiling raised: {:?} → {:?}", was, now);
        }
        if let (Some(was), Some(now)) = (was.max_attempts, now.max_attempts) {
            prop_assert!(ceiling_within(now, was), "attempts raised: {:?} → {:?}", was, now);
        }
        if let (Some(was), Some(now)) = (was.fallbacks, now.fallbacks) {
            prop_assert!(flag_within(now, was), "fallbacks loosened: {:?} → {:?}", was, now);
        }

        let asked = request_values(&tighter, request.route.as_ref()).unwrap_or_default();
        let who = request.who(&tighter);
        let default = resolve_defaults(&tighter, who, request.model(&tighter));
        let names = |list: Option<&Vec<String>>| {
            list.map(|l| l.iter().cloned().collect::<BTreeSet<_>>())
        };
        let default_only: Option<Vec<String>> = default
            .only
            .as_ref()
            .map(|only| only.iter().map(|p| tighter.provider_name(*p)).collect());
        let price = |cents: Option<u32>| cents.map(|c| f64::from(c) / 100.0);
        if let Some(now) = &now.only {
            prop_assert!(list_within(now.as_ref(), names(asked.only.as_ref()).as_ref()));
            prop_assert!(list_within(now.as_ref(), names(default_only.as_ref()).as_ref()));
        }
        if let Some(now) = now.floor {
            prop_assert!(floor_within(now, asked.floor) && floor_within(now, default.floor));
        }
        if let Some(now) = now.max_price {
            prop_assert!(ceiling_within(now, price(asked.max_price)));
            prop_assert!(ceiling_within(now, price(default.max_price)));
        }
        if let Some(now) = now.max_attempts {
            let as_number = |n: Option<u32>| n.map(f64::from);
            prop_assert!(ceiling_within(now, as_number(asked.max_attempts)));
            prop_assert!(ceiling_within(now, as_number(default.max_attempts)));
        }
        if let Some(now) = now.fallbacks {
            prop_assert!(flag_within(now, asked.fallbacks) && flag_within(now, default.fallbacks));
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// `regions` merges with `intersect … strict`: a request that asks for
    /// a region its default does not permit is refused with the strict
    /// error; one within the default never is.
    #[test]
    fn a_strict_merge_refuses_a_request_that_loosens_its_default(
        (mut world, mut request) in case_strategy(),
        permitted in subsequence(vec![0usize, 1, 2], 0..=3),
        asked in subsequence(vec![0usize, 1, 2], 0..=3),
    ) {
        // The caller's default is the tenant's `regions`; no closer layer sets one.
        let who = request.who(&world);
        let tenant = &mut world.tenants[who.tenant];
        let mut layers: Vec<&mut Layer> = vec![&mut tenant.layer];
        layers.extend(tenant.workspaces.iter_mut());
        layers.extend(tenant.keys.iter_mut().map(|k| &mut k.layer));
        for layer in layers {
            layer.all.regions = None;
            for (_, settings) in &mut layer.per_model {
                settings.regions = None;
            }
        }
        tenant.layer.all.regions = Some(permitted.clone());
        // Every other input is well-formed, so only the merge can refuse.
        let mut route = request.route.take().unwrap_or_default();
        if let Some(only) = &mut route.only {
            only.retain(|p| matches!(p, ProviderRef::Name(..)));
        }
        route.max_attempts = route.max_attempts.map(|n| n.clamp(1, 9));
        route.regions = Some(asked.clone());
        request.route = Some(route);

        let snapshot = compile_world(&policy_text(), &world);
        let decision = decide(&snapshot, &world, &request, false);
        let loosens = asked.iter().any(|region| !permitted.contains(region));
        let code = decision.result.as_ref().err().map(|r| r.error.code.as_str());
        if loosens {
            prop_assert_eq!(code, Some("region_not_permitted"));
        } else {
            prop_assert_ne!(code, Some("region_not_permitted"));
            if let Ok(plan) = &decision.result {
                for candidate in &plan.candidates {
                    prop_assert!(asked.contains(&world.providers[candidate.provider].region));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// 3. Plans keep the between-attempt constraints

/// The catalog facts `keep` reads, for one candidate of a plan.
struct Facts {
    own: bool,
    tier: usize,
    region: usize,
}

fn facts(world: &World, who: Who, candidate: &Candidate) -> Facts {
    let model = &world.models[candidate.model.unwrap()];
    let route = &model.routes[candidate.route.unwrap()];
    assert_eq!(route.provider, candidate.provider);
    let provider = &world.providers[candidate.provider];
    Facts {
        own: provider.credentials[candidate.credential] == Some(who.tenant),
        tier: route.tier,
        region: provider.region,
    }
}

/// POLICY's three `keep` lines, restated over the generated data.
fn keeps(first: &Facts, prev: &Facts, next: &Facts) -> bool {
    (!prev.own || next.own)
        && next.tier >= prev.tier
        && (next.region == first.region || next.tier > first.tier)
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn failover_sequences_keep_the_policy_constraints((world, request) in lenient_case_strategy()) {
        let snapshot = compile_world(&policy_text(), &world);
        let decision = decide(&snapshot, &world, &request, false);
        let Ok(plan) = &decision.result else {
            return Ok(());
        };
        let who = request.who(&world);
        let sequence = plan.failover_sequence(&snapshot, &Healthy);
        prop_assert!(!sequence.is_empty(), "a plan with candidates tries none");
        prop_assert_eq!(sequence[0], 0, "the first attempt is not the plan's first");
        prop_assert!(
            sequence.len() <= plan.attempts,
            "{:?} exceeds {} attempts",
            sequence,
            plan.attempts
        );
        prop_assert!(
            sequence.windows(2).all(|pair| pair[0] < pair[1]),
            "{:?} repeats a candidate or leaves plan order",
            sequence
        );
        let all: Vec<Facts> = plan.candidates.iter().map(|c| facts(&world, who, c)).collect();
        let first = &all[sequence[0]];
        for pair in sequence.windows(2) {
            prop_assert!(
                keeps(first, &all[pair[0]], &all[pair[1]]),
                "attempt {} after {} breaks a keep constraint",
                pair[1],
                pair[0]
            );
        }
        // It stops early only when no untried candidate may follow.
        if sequence.len() < plan.attempts {
            let last = &all[*sequence.last().unwrap()];
            for (index, next) in all.iter().enumerate() {
                prop_assert!(
                    sequence.contains(&index) || !keeps(first, last, next),
                    "{:?} stops although candidate {} may follow",
                    sequence,
                    index
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Under a constraint on the previous attempt only, the sequence still
    /// follows plan order: a candidate `keep` passed over stays passed over.
    #[test]
    fn failover_sequences_follow_plan_order_under_any_keep(
        (world, request) in lenient_case_strategy(),
    ) {
        let policy = policy_with_keeps(&["provider.name != prev.provider.name"]);
        let snapshot = compile_world(&policy, &world);
        let decision = decide(&snapshot, &world, &request, false);
        let Ok(plan) = &decision.result else {
            return Ok(());
        };
        let sequence = plan.failover_sequence(&snapshot, &Healthy);
        prop_assert!(
            sequence.windows(2).all(|pair| pair[0] < pair[1]),
            "{:?} leaves plan order",
            sequence
        );
    }
}

/// The smallest case the property above finds. One chat model served by
/// `p0` (two platform credentials, priority 1) and `p1` (one, priority 0),
/// no prices, equal tiers, and `keep provider.name != prev.provider.name`:
/// the plan is
/// `[p0/c0, p0/c1, p1/c0]` with 3 attempts, and `failover_sequence` is
/// `[0, 2, 1]` — `p0/c1` is passed over after `p0/c0` (same provider), then
/// tried after `p1/c0`, when `Plan::next_candidate` scanned the whole plan
/// again for every attempt. Now the walk only moves forward: `[0, 2]`.
#[test]
fn failover_order_minimal_counterexample() {
    let platform = |credentials, priority| ProviderSpec {
        shared_name: false,
        anthropic: false,
        priority,
        region: 0,
        credentials: vec![None; credentials],
    };
    let route = |provider| RouteSpec {
        provider,
        tier: 0,
        price: None,
    };
    let world = World {
        providers: vec![platform(2, 1), platform(1, 0)],
        models: vec![ModelSpec {
            kind: 0,
            routes: vec![route(0), route(1)],
        }],
        tenants: vec![TenantSpec {
            managed: true,
            layer: Layer::default(),
            workspaces: vec![Layer::default()],
            keys: Vec::new(),
        }],
    };
    let request = RequestSpec {
        tenant: 0,
        workspace: 0,
        key: None,
        endpoint: 0,
        fit: false,
        model: Some(0),
        route: None,
        stream: false,
        seed: 0,
        health: Vec::new(),
    };
    let policy = policy_with_keeps(&["provider.name != prev.provider.name"]);
    let snapshot = compile_world(&policy, &world);
    let plan = decide(&snapshot, &world, &request, false).result.unwrap();
    let planned: Vec<(usize, usize)> = plan
        .candidates
        .iter()
        .map(|c| (c.provider, c.credential))
        .collect();
    assert_eq!(planned, [(0, 0), (0, 1), (1, 0)]);
    assert_eq!(plan.attempts, 3);
    // Passed over after p0/c0, p0/c1 stays passed over: p1/c0 is the last.
    assert_eq!(plan.failover_sequence(&snapshot, &Healthy), [0, 2]);
}

// ---------------------------------------------------------------------------
// 4. The error is the first emptying step's

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_refusal_names_the_first_step_that_emptied_the_set((world, request) in case_strategy()) {
        let snapshot = compile_world(&policy_text(), &world);
        let decision = decide(&snapshot, &world, &request, true);
        let steps = &decision.trace.steps;

        // The steps in the trace are POLICY's, in order.
        for (step, error) in steps.iter().zip(STEP_ERRORS) {
            match error {
                Some(error) => prop_assert_eq!(&step.label, &format!("require … else {error}")),
                None => prop_assert_eq!(step.label.as_str(), "prefer exclusively …"),
            }
        }
        // Each step starts from what the one before kept.
        let mut before = decision.trace.candidates.len();
        for step in steps {
            prop_assert_eq!(step.kept + step.removed, before);
            before = step.kept;
        }
        let emptied = steps.iter().position(|step| step.kept == 0);
        match &decision.result {
            Ok(_) => {
                prop_assert_eq!(emptied, None, "a plan although a step kept nothing");
                prop_assert_eq!(steps.len(), STEP_ERRORS.len());
            }
            Err(refusal) => {
                if let Some(at) = emptied {
                    prop_assert_eq!(at, steps.len() - 1, "steps ran after the set was empty");
                    prop_assert!(STEP_ERRORS[at].is_some(), "`prefer exclusively` emptied the set");
                    prop_assert_eq!(Some(refusal.error.code.as_str()), STEP_ERRORS[at]);
                } else {
                    prop_assert!(steps.is_empty(), "refused by no step after steps ran");
                }
            }
        }

        // And the decision is the reference model's.
        let expected = expect(&world, &request);
        let kept: Vec<usize> = steps.iter().map(|s| s.kept).collect();
        match (&decision.result, &expected) {
            (Err(refusal), Expected::Refused { code, kept: expected_kept }) => {
                prop_assert_eq!(&refusal.error.code, code);
                prop_assert_eq!(&kept, expected_kept, "eligibility kept other counts");
            }
            (Ok(plan), Expected::Planned { candidates, attempts, kept: expected_kept }) => {
                prop_assert_eq!(
                    plan.candidates.len(),
                    candidates.len(),
                    "the plan repeats a candidate"
                );
                prop_assert_eq!(&candidate_set(&plan.candidates), candidates);
                prop_assert_eq!(plan.attempts, *attempts);
                prop_assert_eq!(&kept, expected_kept, "eligibility kept other counts");
            }
            (result, expected) => {
                let got = match result {
                    Ok(plan) => format!("a plan of {:?}", candidate_set(&plan.candidates)),
                    Err(refusal) => format!("refused with {}", refusal.error.code),
                };
                prop_assert!(false, "got {}, the reference model expects {:?}", got, expected);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// 5. The shipped policies never panic

const SHIPPED: [&str; 5] = ["ai-setu", "anonrouter", "ngrok", "noeta", "noirdoc"];

fn shipped() -> &'static [Snapshot] {
    static SNAPSHOTS: std::sync::OnceLock<Vec<Snapshot>> = std::sync::OnceLock::new();
    SNAPSHOTS.get_or_init(|| {
        SHIPPED
            .iter()
            .map(|name| {
                let path = format!("{}/policies/{name}.policy", env!("CARGO_MANIFEST_DIR"));
                compile_file(Path::new(&path), &AllSecrets).unwrap_or_else(|report| {
                    panic!("{name} does not compile: {:?}", report.diagnostics)
                })
            })
            .collect()
    })
}

/// Words a request to a policy may plausibly use: its providers, models,
/// aliases, credentials, pins in every template, and some junk.
fn vocabulary(snapshot: &Snapshot) -> Vec<String> {
    let catalog = &snapshot.data.catalog;
    let mut words: Vec<String> = Vec::new();
    for provider in &catalog.providers {
        words.push(provider.id.clone());
        words.push(provider.name.clone());
        words.push(provider.id.to_uppercase());
        words.extend(provider.aliases.iter().cloned());
        words.extend(provider.credentials.iter().map(|c| c.id.clone()));
    }
    for model in &catalog.models {
        words.push(model.id.clone());
        words.extend(model.aliases.iter().cloned());
    }
    words.extend(catalog.aliases.iter().map(|a| a.name.clone()));
    if let (Some(provider), Some(model)) = (catalog.providers.first(), catalog.models.first()) {
        words.push(format!("{}/{}", provider.id, model.id));
        words.push(format!("{}:{}", provider.name, model.id));
        if let Some(credential) = provider.credentials.first() {
            words.push(format!("@{}/{}", credential.id, model.id));
        }
    }
    for junk in [
        "",
        " ",
        "/auto",
        "no-such-model",
        "a,b,,c",
        "🦀",
        "{\"x\":1}",
        "true",
        "-1",
        "1e999",
    ] {
        words.push(junk.to_string());
    }
    words
}

/// Cycles over generated numbers to pick among choices only known at run
/// time (a policy's input types, its vocabulary).
struct Picks<'a> {
    choices: &'a [u16],
    at: usize,
}

impl Picks<'_> {
    fn pick(&mut self, range: usize) -> usize {
        let choice = self
            .choices
            .get(self.at % self.choices.len().max(1))
            .copied();
        self.at += 1;
        usize::from(choice.unwrap_or(0)) % range.max(1)
    }

    fn word<'w>(&mut self, words: &'w [String]) -> &'w str {
        words.get(self.pick(words.len())).map_or("", String::as_str)
    }

    fn arbitrary(&mut self, pool: &[Json]) -> Json {
        pool.get(self.pick(pool.len()))
            .cloned()
            .unwrap_or(Json::Null)
    }
}

/// A JSON value that mostly fits an input type, sometimes not at all.
fn plausible_json(ty: &InputType, picks: &mut Picks<'_>, words: &[String], pool: &[Json]) -> Json {
    if picks.pick(8) == 0 {
        return picks.arbitrary(pool);
    }
    match ty {
        InputType::Bool => Json::Bool(picks.pick(2) == 0),
        InputType::Number => [
            json!(0),
            json!(1),
            json!(-1),
            json!(0.45),
            json!(1e300),
            json!(3),
        ][picks.pick(6)]
        .clone(),
        InputType::Int { low, high } => {
            let values = [
                *low - 1.0,
                *low,
                (*low + *high) / 2.0,
                *high,
                *high + 1.0,
                2.5,
            ];
            json!(values[picks.pick(values.len())])
        }
        InputType::String | InputType::Provider | InputType::Model => {
            Json::String(picks.word(words).to_string())
        }
        InputType::Duration => Json::String(
            ["10s", "250ms", "1d", "0s", "-1s", "366d", "x"][picks.pick(7)].to_string(),
        ),
        InputType::Enum(e) => match e.members.get(picks.pick(e.members.len() + 1)) {
            Some(member) => Json::String(member.clone()),
            None => Json::String(picks.word(words).to_string()),
        },
        InputType::List(item) | InputType::Csv(item) => {
            let count = picks.pick(4);
            Json::Array(
                (0..count)
                    .map(|_| plausible_json(item, picks, words, pool))
                    .collect(),
            )
        }
        InputType::Object(fields) => {
            let mut object = serde_json::Map::new();
            for (name, field) in fields {
                if picks.pick(3) != 0 {
                    object.insert(name.to_string(), plausible_json(field, picks, words, pool));
                }
            }
            if picks.pick(10) == 0 {
                object.insert(picks.word(words).to_string(), picks.arbitrary(pool));
            }
            Json::Object(object)
        }
    }
}

/// Header text that mostly fits an input type.
fn plausible_text(
    ty: &InputType,
    picks: &mut Picks<'_>,
    words: &[String],
    pool: &[Json],
) -> String {
    match ty {
        InputType::Bool => ["true", "false", "yes", "0", "maybe", ""][picks.pick(6)].to_string(),
        InputType::Csv(item) => {
            let count = picks.pick(4);
            (0..count)
                .map(|_| plausible_text(item, picks, words, pool))
                .collect::<Vec<_>>()
                .join(",")
        }
        InputType::List(_) | InputType::Object(_) => {
            plausible_json(ty, picks, words, pool).to_string()
        }
        _ => match plausible_json(ty, picks, words, pool) {
            Json::String(text) => text,
            other => other.to_string(),
        },
    }
}

/// What a request to a shipped policy looks like, before the policy's
/// vocabulary makes it concrete.
#[derive(Debug, Clone)]
struct Probe {
    /// 0: not JSON; 1: an arbitrary JSON value; otherwise a plausible object.
    shape: u8,
    picks: Vec<u16>,
    pool: Vec<Json>,
    junk_header: Option<(String, String)>,
    health: Vec<(u8, HealthEntry)>,
    seed: u64,
    rotation: u64,
}

fn arbitrary_json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| serde_json::Number::from_f64(n).map_or(Json::Null, Json::Number)),
        ".{0,12}".prop_map(Json::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|map| Json::Object(map.into_iter().collect())),
        ]
    })
}

fn health_entry_strategy() -> impl Strategy<Value = HealthEntry> {
    (
        any::<bool>(),
        0u32..5,
        prop::bool::weighted(0.2),
        prop::option::weighted(0.2, prop_oneof![Just("30s"), Just("0s"), Just("1d")]),
        prop::option::weighted(0.5, (0u32..60, 0.0f64..=1.0, 0u64..5000, 0.0f64..200.0)),
        0u32..8,
    )
        .prop_map(
            |(penalized, strikes, full, paused, stats, in_flight)| HealthEntry {
                penalized,
                strikes,
                full,
                in_flight,
                paused_for: paused.map(str::to_string),
                free_in: full.then(|| String::from("2s")),
                stats: stats.map_or_else(Stats::default, |(samples, rate, ttft, throughput)| {
                    Stats {
                        samples,
                        success_rate: Some(rate),
                        ttft_ms: Some(ttft),
                        latency_ms: Some(ttft * 3),
                        throughput: Some(throughput),
                    }
                }),
                ..HealthEntry::default()
            },
        )
}

fn probe_strategy() -> impl Strategy<Value = Probe> {
    (
        prop_oneof![1 => Just(0u8), 1 => Just(1u8), 8 => Just(2u8)],
        prop::collection::vec(any::<u16>(), 1..48),
        prop::collection::vec(arbitrary_json(), 1..4),
        prop::option::weighted(0.2, ("[a-z-]{1,12}", ".{0,16}")),
        prop::collection::vec((any::<u8>(), health_entry_strategy()), 0..4),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(shape, picks, pool, junk_header, health, seed, rotation)| Probe {
                shape,
                picks,
                pool,
                junk_header,
                health,
                seed,
                rotation,
            },
        )
}

/// A probe made concrete for one policy: the body (if JSON) and headers.
fn materialize(snapshot: &Snapshot, probe: &Probe) -> (Option<Json>, Vec<(String, String)>) {
    let words = vocabulary(snapshot);
    let mut picks = Picks {
        choices: &probe.picks,
        at: 0,
    };
    let pool = &probe.pool;
    let body = match probe.shape {
        0 => None,
        1 => Some(picks.arbitrary(pool)),
        _ => {
            let mut object = serde_json::Map::new();
            match picks.pick(10) {
                0 => {}
                1 => {
                    object.insert(String::from("model"), picks.arbitrary(pool));
                }
                _ => {
                    object.insert(
                        String::from("model"),
                        Json::String(picks.word(&words).to_string()),
                    );
                }
            }
            let stream = if picks.pick(6) == 0 {
                picks.arbitrary(pool)
            } else {
                Json::Bool(picks.pick(2) == 0)
            };
            object.insert(String::from("stream"), stream);
            object.insert(
                String::from("messages"),
                json!([{"role": "user", "content": "hi"}]),
            );
            for field in ["tools", "reasoning", "response_format", "logprobs"] {
                if picks.pick(4) == 0 {
                    object.insert(field.to_string(), picks.arbitrary(pool));
                }
            }
            for input in snapshot
                .program
                .inputs
                .iter()
                .filter(|i| i.source == InputSourceKind::Body)
            {
                if picks.pick(3) == 0 {
                    continue;
                }
                let value = match &input.shorthand {
                    Some((shorthand, _)) if picks.pick(3) == 0 => {
                        plausible_json(shorthand, &mut picks, &words, pool)
                    }
                    _ => plausible_json(&input.ty, &mut picks, &words, pool),
                };
                object.insert(input.field.clone(), value);
            }
            Some(Json::Object(object))
        }
    };
    let mut headers = Vec::new();
    for input in snapshot
        .program
        .inputs
        .iter()
        .filter(|i| i.source == InputSourceKind::Header)
    {
        if picks.pick(3) == 0 {
            continue;
        }
        let value = match &input.shorthand {
            Some((shorthand, _)) if picks.pick(3) == 0 => {
                plausible_text(shorthand, &mut picks, &words, pool)
            }
            _ => plausible_text(&input.ty, &mut picks, &words, pool),
        };
        headers.push((input.field.clone(), value));
    }
    if let Some((name, value)) = &probe.junk_header {
        headers.push((name.clone(), value.clone()));
    }
    (body, headers)
}

/// Every key of a policy's tenants, and every tenant and workspace without one.
fn callers(snapshot: &Snapshot) -> Vec<Caller> {
    let tenants = &snapshot.data.tenants;
    let mut callers: Vec<Caller> = tenants
        .keys
        .iter()
        .enumerate()
        .map(|(index, key)| Caller {
            tenant: key.tenant,
            workspace: key.workspace,
            key: Some(index),
        })
        .collect();
    for (tenant, spec) in tenants.tenants.iter().enumerate() {
        for workspace in 0..spec.workspaces.len() {
            callers.push(Caller {
                tenant,
                workspace,
                key: None,
            });
        }
    }
    callers
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn shipped_policies_decide_any_request_without_panicking(probe in probe_strategy()) {
        for (name, snapshot) in SHIPPED.iter().zip(shipped()) {
            let (body, headers) = materialize(snapshot, &probe);
            let text = body.as_ref().map_or_else(|| String::from("not json"), Json::to_string);
            let lean = body.as_ref().map(|body| body_as_read(snapshot, body));
            let providers = snapshot.data.catalog.providers.len();
            let entries: Vec<HealthEntry> = probe
                .health
                .iter()
                .map(|(provider, entry)| HealthEntry {
                    provider: snapshot.data.catalog.providers[usize::from(*provider) % providers]
                        .id
                        .clone(),
                    ..entry.clone()
                })
                .collect();
            let table = HealthTable::new(snapshot, &entries).unwrap();
            let views: [&dyn HealthView; 2] = [&Healthy, &table];
            for caller in callers(snapshot) {
                for endpoint in Endpoint::ALL {
                    for health in views {
                        let context = RequestContext {
                            id: std::sync::Arc::from("req-1"),
                            endpoint,
                            body: body.as_ref().ok_or(NOT_AN_OBJECT),
                            body_bytes: text.len(),
                            headers: &headers,
                            caller,
                            seed: probe.seed,
                            rotation: &probe.rotation,
                        };
                        let decision = evaluate(snapshot, &context, health);
                        let traced = evaluate_traced(snapshot, &context, health);
                        prop_assert_eq!(
                            outcome(snapshot, &decision),
                            outcome(snapshot, &traced),
                            "{}: evaluate and evaluate_traced disagree",
                            name
                        );
                        // The proxy gives the evaluator only the members it
                        // reads; nothing else may change a decision.
                        let read = lean.as_ref().ok_or(NOT_AN_OBJECT);
                        let lean_decision =
                            evaluate(snapshot, &RequestContext { body: read, ..context }, health);
                        prop_assert_eq!(
                            outcome(snapshot, &decision),
                            outcome(snapshot, &lean_decision),
                            "{}: a member the evaluator does not read changed its decision",
                            name
                        );
                        if let Ok(plan) = &decision.result {
                            prop_assert!(!plan.candidates.is_empty(), "{}: an empty plan", name);
                            prop_assert!(plan.attempts >= 1, "{}: a plan of no attempts", name);
                            let sequence = plan.failover_sequence(snapshot, &Healthy);
                            prop_assert_eq!(sequence.first(), Some(&0), "{}: {:?}", name, sequence);
                            prop_assert!(
                                sequence.len() <= plan.attempts,
                                "{}: {:?}",
                                name,
                                sequence
                            );
                            prop_assert!(
                                sequence.windows(2).all(|pair| pair[0] < pair[1]),
                                "{}: {:?} repeats a candidate or leaves plan order",
                                name,
                                sequence
                            );
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// 6. A remembered plan is the plan made afresh

/// [`POLICY`] made to read nothing of a request but its caller, model,
/// endpoint and inputs, so that its snapshots remember plans: the order
/// reads no health, and the balance applies by the merged `only` instead of
/// `stream` (a balanced plan is not remembered).
fn remembering_policy() -> String {
    let mut text = policy_text();
    for (read, instead) in [
        ("  by health.penalized\n", ""),
        (
            "balance random when request.stream\n",
            "balance random when present(only)\n",
        ),
    ] {
        assert!(
            text.contains(read),
            "the test policy no longer says `{read}`"
        );
        text = text.replace(read, instead);
    }
    text
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn a_remembered_plan_is_the_plan_made_afresh(
        world in world_strategy(false),
        requests in prop::collection::vec(request_strategy(false), 1..12),
    ) {
        let snapshot = compile_world(&remembering_policy(), &world);
        prop_assert_eq!(snapshot.remembered_plans(), Some(0));
        // Twice through: the second time, every plan the first made is
        // remembered; requests with one key share a plan meanwhile.
        for round in 0..2 {
            for request in &requests {
                let body = request.body(&world);
                let text = body.to_string();
                let context = RequestContext {
                    id: std::sync::Arc::from("req-1"),
                    endpoint: request.endpoint(&world),
                    body: Ok(&body),
                    body_bytes: text.len(),
                    headers: &[],
                    caller: caller(&snapshot, request.who(&world)),
                    seed: request.seed,
                    rotation: &0,
                };
                let remembered = evaluate(&snapshot, &context, &Healthy);
                let afresh = evaluate_afresh(&snapshot, &context, &Healthy);
                prop_assert_eq!(
                    outcome(&snapshot, &remembered),
                    outcome(&snapshot, &afresh),
                    "round {}: a remembered plan differs from the plan made afresh",
                    round
                );
                prop_assert_eq!(
                    outcome(&snapshot, &remembered),
                    outcome(&snapshot, &evaluate_traced(&snapshot, &context, &Healthy)),
                    "round {}: evaluate and evaluate_traced disagree",
                    round
                );
            }
        }
        // Plans were remembered if some were made unbalanced; refusals and
        // balanced plans are not.
        let remembered = requests.iter().any(|request| {
            let decision = decide(&snapshot, &world, request, true);
            decision.result.is_ok() && decision.trace.balance.is_none()
        });
        prop_assert_eq!(snapshot.remembered_plans().is_some_and(|n| n > 0), remembered);
    }
}
