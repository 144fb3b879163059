//! Compile: a checked policy and its data become one immutable [`Snapshot`].
//!
//! Everything that depends only on the data is done here, once: model ids and
//! aliases become a lookup table, each model's routes are paired with their
//! credentials, provider names and credential ids for pins are indexed, and
//! each credential's secret is read from the environment. Per request, the
//! evaluator then only looks at the requested model's own candidates.

mod stage;

pub use stage::Guard;

use crate::data::{Credential, Data, ModelKind, Provider, WireFormat};
use crate::evaluate::compiled::{Compiled, Ranking, reads_only_catalog_and_endpoint};
use crate::evaluate::health::{CandidateHealth, HealthSettings};
use crate::evaluate::machine::{Focus, Machine, Operand};
use crate::evaluate::memo::PlanMemo;
use crate::evaluate::order;
use crate::evaluate::{Candidate, Endpoint, RequestState, ResolutionKind};
use crate::language::CheckedPolicy;
use crate::language::ir::{LetSpec, Program, Term};
use crate::value::Value;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A credential's secret, read from the environment when the snapshot was
/// built. It never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// A variable's value as a secret: without the whitespace around it (a
    /// secret mounted from a file often ends in a line break), and none
    /// when it is empty or holds a control character, which no request
    /// header can carry: its routes are skipped rather than every attempt
    /// at them failing as if the provider were unreachable.
    pub fn from_value(value: &str) -> Option<Secret> {
        let value = value.trim();
        let sendable = value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80);
        (!value.is_empty() && sendable).then(|| Secret(Arc::from(value)))
    }

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

    /// Whether `name` is set to something that is not UTF-8 text, which
    /// `get` gives as none.
    fn holds_other_than_text(&self, _name: &str) -> bool {
        false
    }
}

/// The process environment.
pub struct Environment;

impl SecretSource for Environment {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|value| !value.is_empty())
    }

    fn holds_other_than_text(&self, name: &str) -> bool {
        matches!(std::env::var(name), Err(std::env::VarError::NotUnicode(_)))
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

/// Values of the catalog's names, built once so evaluating a request clones
/// shared strings instead of allocating new ones.
#[derive(Debug, Default)]
pub struct Interned {
    pub provider_id: Vec<Value>,
    pub provider_name: Vec<Value>,
    pub provider_format: Vec<Value>,
    pub provider_endpoints: Vec<Value>,
    pub provider_aliases: Vec<Value>,
    pub model_id: Vec<Value>,
    pub model_kind: Vec<Value>,
    pub model_aliases: Vec<Value>,
    /// Per model, per route.
    pub route_capabilities: Vec<Vec<Value>>,
    /// Per model, per route: the name the provider knows the model by.
    pub route_upstream: Vec<Vec<Arc<str>>>,
    /// Per provider, per credential.
    pub credential_id: Vec<Vec<Value>>,
    /// Per provider, per credential: whose key it is, the owning tenant by
    /// its index, so `credential.owned` compares no text.
    pub credential_owner: Vec<Vec<Owner>>,
}

/// Whose key a credential is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The platform's: usable by every tenant.
    Platform,
    /// A tenant's own (BYOK), by its index (tenant ids are unique).
    Tenant(usize),
    /// A tenant's that the tenants file does not list: no caller's.
    Unlisted,
}

impl Owner {
    /// Whether it is the key of the caller's tenant `tenant`.
    pub fn is(self, tenant: usize) -> bool {
        self == Owner::Tenant(tenant)
    }
}

impl Interned {
    fn new(data: &Data) -> Interned {
        let strings =
            |items: &[String]| Value::List(items.iter().map(|s| Value::string(s)).collect());
        let catalog = &data.catalog;
        Interned {
            provider_id: catalog
                .providers
                .iter()
                .map(|p| Value::string(&p.id))
                .collect(),
            provider_name: catalog
                .providers
                .iter()
                .map(|p| Value::string(&p.name))
                .collect(),
            provider_format: catalog
                .providers
                .iter()
                .map(|p| wire_member(p.format).clone())
                .collect(),
            provider_endpoints: catalog
                .providers
                .iter()
                .map(|p| {
                    Value::List(
                        p.endpoints
                            .iter()
                            .map(|&endpoint| endpoint_member(endpoint).clone())
                            .collect(),
                    )
                })
                .collect(),
            provider_aliases: catalog
                .providers
                .iter()
                .map(|p| strings(&p.aliases))
                .collect(),
            model_id: catalog
                .models
                .iter()
                .map(|m| Value::string(&m.id))
                .collect(),
            model_kind: catalog
                .models
                .iter()
                .map(|m| kind_member(m.kind).clone())
                .collect(),
            model_aliases: catalog.models.iter().map(|m| strings(&m.aliases)).collect(),
            route_capabilities: catalog
                .models
                .iter()
                .map(|m| m.routes.iter().map(|r| strings(&r.capabilities)).collect())
                .collect(),
            route_upstream: catalog
                .models
                .iter()
                .map(|m| {
                    m.routes
                        .iter()
                        .map(|r| Arc::from(r.upstream_model.as_str()))
                        .collect()
                })
                .collect(),
            credential_id: catalog
                .providers
                .iter()
                .map(|p| p.credentials.iter().map(|c| Value::string(&c.id)).collect())
                .collect(),
            credential_owner: catalog
                .providers
                .iter()
                .map(|p| {
                    p.credentials
                        .iter()
                        .map(|c| match c.tenant.as_deref() {
                            None => Owner::Platform,
                            Some(owner) => data
                                .tenants
                                .tenants
                                .iter()
                                .position(|t| t.id == owner)
                                .map_or(Owner::Unlisted, Owner::Tenant),
                        })
                        .collect()
                })
                .collect(),
        }
    }
}

/// The members of the built-in enumerations (endpoints, wire formats, model
/// kinds, resolutions).
const BUILTIN_MEMBERS: [&str; 14] = [
    "chat_completions",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "openai",
    "anthropic",
    "chat",
    "completion",
    "embedding",
    "bare",
    "alias",
    "pin",
    "unknown",
];

/// The shared values of [`BUILTIN_MEMBERS`], in its order: members compare
/// by name, so every read of one shares its text.
fn builtin_members() -> &'static [Value] {
    static MEMBERS: std::sync::LazyLock<Vec<Value>> = std::sync::LazyLock::new(|| {
        BUILTIN_MEMBERS
            .into_iter()
            .map(|name| {
                Value::Enum(crate::value::EnumMember {
                    rank: 0,
                    name: Arc::from(name),
                })
            })
            .collect()
    });
    &MEMBERS
}

/// The built-in member at a position in [`BUILTIN_MEMBERS`], borrowed: the
/// request's endpoint, wire format and kind and a candidate's resolution
/// are read per candidate, so they are found by their enumeration's
/// variant, with no name matched and no reference counted.
fn builtin_at(index: usize) -> &'static Value {
    static ABSENT: Value = Value::Null;
    builtin_members().get(index).unwrap_or(&ABSENT)
}

pub fn endpoint_member(endpoint: Endpoint) -> &'static Value {
    builtin_at(match endpoint {
        Endpoint::ChatCompletions => 0,
        Endpoint::Completions => 1,
        Endpoint::Embeddings => 2,
        Endpoint::Responses => 3,
        Endpoint::Messages => 4,
    })
}

pub fn wire_member(wire: WireFormat) -> &'static Value {
    builtin_at(match wire {
        WireFormat::OpenAi => 5,
        WireFormat::Anthropic => 6,
    })
}

pub fn kind_member(kind: ModelKind) -> &'static Value {
    builtin_at(match kind {
        ModelKind::Chat => 7,
        ModelKind::Completion => 8,
        ModelKind::Embedding => 9,
    })
}

pub fn resolution_member(kind: ResolutionKind) -> &'static Value {
    builtin_at(match kind {
        ResolutionKind::Bare => 10,
        ResolutionKind::Alias => 11,
        ResolutionKind::Pin => 12,
        ResolutionKind::Unknown => 13,
    })
}

/// The compiled policy and data: immutable, shared by every request that
/// starts while it is live.
#[derive(Debug)]
pub struct Snapshot {
    pub name: String,
    /// A content hash of the policy and data, identifying this snapshot.
    pub version: String,
    pub program: Program,
    pub data: Arc<Data>,
    /// Found per request by the id the caller sent: hashed with foldhash,
    /// a fraction of SipHash's cost for short keys, seeded per map.
    models: foldhash::HashMap<String, ModelName>,
    /// Lowercase provider ids, names and aliases → providers answering to them.
    provider_names: foldhash::HashMap<String, Vec<usize>>,
    /// Lowercase provider names and aliases (not ids) → the first provider
    /// of that name: what a request's `provider` input may say.
    public_provider_names: foldhash::HashMap<String, usize>,
    /// Credential ids → (provider, credential index).
    credential_ids: foldhash::HashMap<String, (usize, usize)>,
    /// Per model, its routes with their credentials.
    routes: Vec<Vec<RouteEntry>>,
    /// Per provider and credential, the secret if its variable is set.
    secrets: Vec<Vec<Option<Secret>>>,
    /// Key hashes → key index.
    keys: foldhash::HashMap<[u8; 32], usize>,
    /// Deployment attribute values, constant for the snapshot.
    pub deployment: Vec<Value>,
    pub interned: Interned,
    /// Catalog-only parts of the program's terms, per route and credential.
    pub statics: StaticTable,
    /// How many request-only parts the staged program caches per request.
    pub hoisted: usize,
    /// Where the program's definitions are cached in an evaluation.
    pub let_slots: LetSlots,
    /// Per eligibility step, what the request alone settles of it.
    pub guards: Vec<Guard>,
    /// Per eligibility step, whether it is asked once for the whole set.
    pub once_per_set: Vec<bool>,
    /// The staged steps, guards and sort keys, compiled.
    pub(crate) compiled: Compiled,
    /// The `health` section's constants.
    pub health: HealthSettings,
    /// Plans made for one caller, model name, endpoint and input values,
    /// when the policy's plans depend on nothing else.
    pub(crate) plans: PlanMemo,
}

/// Where each definition's value is cached: request-level definitions once
/// per request, the others once per candidate, in two groups. Those that
/// use an aggregate are forgotten when the candidate set changes, whether
/// they read a candidate or not: `count_of(true)` before a step and after
/// it differ. Each definition's slot is its place within its group, so a
/// candidate's cache holds only the definitions that can differ between
/// candidates.
#[derive(Debug, Default)]
pub struct LetSlots {
    slots: Vec<usize>,
    /// How many definitions each group holds.
    pub request: usize,
    pub candidate: usize,
    pub set: usize,
    /// Definitions that read no candidate but aggregate over the set.
    pub set_wide: usize,
}

impl LetSlots {
    fn of(lets: &[LetSpec]) -> LetSlots {
        let mut table = LetSlots::default();
        for spec in lets {
            let group = match (spec.candidate, spec.aggregate) {
                (false, false) => &mut table.request,
                (false, true) => &mut table.set_wide,
                (true, false) => &mut table.candidate,
                (true, true) => &mut table.set,
            };
            table.slots.push(*group);
            *group += 1;
        }
        table
    }

    /// Definition `index`'s place within its group.
    pub fn slot(&self, index: usize) -> Option<usize> {
        self.slots.get(index).copied()
    }
}

/// The values of the staged program's catalog-only terms: one row of
/// `slots` values per route and credential. For model `m`, route `r` and
/// credential `c` the row is `base[m][r] + c`, and its slot `s` is at
/// `row * slots + s`. Rows are kept by number, not by where they start,
/// so that a row is also the index of per-row tables without a division.
#[derive(Debug, Default)]
pub struct StaticTable {
    slots: usize,
    rows: usize,
    base: Vec<Vec<usize>>,
    values: Vec<Value>,
}

impl StaticTable {
    /// A catalog route and credential's row; `None` for a candidate outside
    /// the catalog (an unknown model served by a fallback).
    pub fn row(
        &self,
        model: Option<usize>,
        route: Option<usize>,
        credential: usize,
    ) -> Option<usize> {
        let base = *self.base.get(model?)?.get(route?)?;
        Some(self.credential_row(base, credential))
    }

    /// The row of credential `credential` of the route whose first row is
    /// `first`.
    pub fn credential_row(&self, first: usize, credential: usize) -> usize {
        first + credential
    }

    /// Slot `slot` of row `row`.
    pub fn get(&self, row: usize, slot: usize) -> Option<&Value> {
        self.values.get(row * self.slots + slot)
    }

    /// How many rows (routes and credentials) the table holds.
    pub fn rows(&self) -> usize {
        self.rows
    }
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

        let mut models = foldhash::HashMap::default();
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

        let mut provider_names: foldhash::HashMap<String, Vec<usize>> =
            foldhash::HashMap::default();
        let mut public_provider_names: foldhash::HashMap<String, usize> =
            foldhash::HashMap::default();
        let mut credential_ids = foldhash::HashMap::default();
        for (index, provider) in catalog.providers.iter().enumerate() {
            for public in std::iter::once(&provider.name).chain(provider.aliases.iter()) {
                public_provider_names
                    .entry(public.to_ascii_lowercase())
                    .or_insert(index);
            }
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
                            .and_then(|value| Secret::from_value(&value))
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

        let interned = Interned::new(&data);
        let staged = stage::stage(&program);
        let let_slots = LetSlots::of(&program.lets);
        let compiled = Compiled::of(&staged.program, &staged.guards, staged.statics.len());
        let mut snapshot = Snapshot {
            name,
            version,
            program,
            interned,
            data,
            models,
            provider_names,
            public_provider_names,
            credential_ids,
            routes,
            secrets,
            keys,
            deployment,
            statics: StaticTable::default(),
            hoisted: staged.hoisted,
            let_slots,
            guards: staged.guards,
            once_per_set: staged.once_per_set,
            compiled,
            health: HealthSettings::default(),
            plans: PlanMemo::for_program(&staged.program),
        };
        // Static terms are evaluated by the program as checked, then the
        // staged program that reads them takes its place.
        let (statics, usable) = snapshot.precompute(&staged.statics, &snapshot.compiled.rankings);
        snapshot.statics = statics;
        snapshot.compiled.keep_usable_rankings(&usable);
        snapshot.program = staged.program;
        snapshot.let_slots = LetSlots::of(&snapshot.program.lets);
        snapshot.health = HealthSettings::of(&snapshot);
        let settled_by_key = Compiled::settle_per_key(&snapshot);
        snapshot.compiled.set_settled_by_key(settled_by_key);
        let settled_by_endpoint = snapshot.settle_per_endpoint();
        snapshot
            .compiled
            .set_settled_by_endpoint(settled_by_endpoint);
        snapshot
    }

    /// Evaluates the catalog-only terms for every route and credential,
    /// then ranks the rows by each ranking's keys into the slots after the
    /// terms'. Also says which rankings could be made.
    fn precompute(&self, terms: &[Term], rankings: &[Ranking]) -> (StaticTable, Vec<bool>) {
        let slots = terms.len() + rankings.len();
        let mut table = StaticTable {
            slots,
            ..StaticTable::default()
        };
        if slots == 0 {
            return (table, Vec::new());
        }
        let request = RequestState::placeholder();
        for model_index in 0..self.data.catalog.models.len() {
            let (candidates, firsts) = self.catalog_candidates(model_index);
            let bases = firsts
                .into_iter()
                .map(|first| table.values.len() / slots + first)
                .collect();
            let health = vec![CandidateHealth::default(); candidates.len()];
            let mut machine = Machine::new(self, &request, &candidates, &health);
            for candidate in 0..candidates.len() {
                for term in terms {
                    table.values.push(machine.eval(term, &Focus::on(candidate)));
                }
                let ranks = table.values.len() + rankings.len();
                table.values.resize(ranks, Value::Null);
            }
            table.base.push(bases);
        }
        let rows = table.values.len() / slots;
        table.rows = rows;
        let usable = rankings
            .iter()
            .enumerate()
            .map(|(index, ranking)| {
                let value = |row: usize, key: usize| {
                    let slot = ranking.slots.get(key).copied().unwrap_or(usize::MAX);
                    table.values.get(row * slots + slot).unwrap_or(&Value::Null)
                };
                let Some(ranks) = order::dense_ranks(rows, &ranking.directions, value) else {
                    return false;
                };
                for (row, rank) in ranks.into_iter().enumerate() {
                    if let Some(slot) = table.values.get_mut(row * slots + terms.len() + index) {
                        *slot = Value::Number(f64::from(rank));
                    }
                }
                true
            })
            .collect();
        (table, usable)
    }

    /// A candidate for every route and credential of model `model_index`,
    /// with their rows in the static table once it is built; and where each
    /// route's candidates start.
    fn catalog_candidates(&self, model_index: usize) -> (Vec<Candidate>, Vec<usize>) {
        let mut candidates = Vec::new();
        let mut firsts = Vec::new();
        let Some(model) = self.data.catalog.models.get(model_index) else {
            return (candidates, firsts);
        };
        for (route_index, route) in model.routes.iter().enumerate() {
            firsts.push(candidates.len());
            let credentials = self
                .provider(route.provider)
                .map_or(0, |p| p.credentials.len());
            for credential in 0..credentials {
                let mut candidate =
                    Candidate::of_route(model_index, route_index, route, credential);
                candidate.static_row =
                    self.statics
                        .row(Some(model_index), Some(route_index), credential);
                candidates.push(candidate);
            }
        }
        (candidates, firsts)
    }

    /// Settles, for every endpoint and catalog row, the eligibility steps
    /// that read only the catalog and the endpoint called (such as "the
    /// model fits the endpoint"): a request whose candidates are all in the
    /// catalog looks each one's answer up instead of asking the step. Costs
    /// a byte per such step, endpoint and row.
    fn settle_per_endpoint(&self) -> Vec<Option<Box<[bool]>>> {
        let rows = self.statics.rows();
        let mut tables: Vec<Option<Box<[bool]>>> = self
            .program
            .steps
            .iter()
            .map(|step| {
                (rows > 0 && reads_only_catalog_and_endpoint(&step.condition))
                    .then(|| vec![false; rows * Endpoint::ALL.len()].into_boxed_slice())
            })
            .collect();
        if tables.iter().all(Option::is_none) {
            return tables;
        }
        let requests = Endpoint::ALL.map(|endpoint| {
            let mut request = RequestState::placeholder();
            request.endpoint = endpoint;
            request
        });
        for model_index in 0..self.data.catalog.models.len() {
            let (candidates, _) = self.catalog_candidates(model_index);
            let health = vec![CandidateHealth::default(); candidates.len()];
            for (at, request) in requests.iter().enumerate() {
                let mut machine = Machine::new(self, request, &candidates, &health);
                for (step, table) in self.compiled.steps.iter().zip(&mut tables) {
                    let Some(table) = table else {
                        continue;
                    };
                    for (index, candidate) in candidates.iter().enumerate() {
                        let Some(row) = candidate.static_row else {
                            continue;
                        };
                        let truth = step.truth(&mut machine, &Focus::on(index));
                        if let Some(slot) = table.get_mut(at * rows + row) {
                            *slot = truth;
                        }
                    }
                }
            }
        }
        tables
    }

    /// Whether this snapshot remembers a plan per caller, model name,
    /// endpoint and input values (its policy's plans depend on nothing
    /// else), and how many it holds.
    pub fn remembered_plans(&self) -> Option<usize> {
        self.plans.applies().then(|| self.plans.len())
    }

    /// Where this snapshot makes every plan afresh, the first term found
    /// that reads more than the caller, model, endpoint and inputs.
    pub fn plans_made_afresh_by(&self) -> Option<crate::source::Span> {
        self.plans.made_afresh_by()
    }

    pub fn model_named(&self, id: &str) -> Option<&ModelName> {
        self.models.get(id)
    }

    /// Providers a pin's or input's provider reference means (ignoring case).
    pub fn providers_named(&self, text: &str) -> &[usize] {
        self.provider_names
            .get(lowercase(text).as_ref())
            .map_or(&[], Vec::as_slice)
    }

    /// The name of the provider a request's `provider` input means: one
    /// named or aliased so, ignoring case. An id that is not also a name
    /// means none: the value is a name, so a region's id would silently
    /// widen to every provider of its name.
    pub fn provider_called(&self, text: &str) -> Option<&Value> {
        self.public_provider_names
            .get(lowercase(text).as_ref())
            .and_then(|index| self.interned.provider_name.get(*index))
    }

    pub fn credential_with_id(&self, id: &str) -> Option<(usize, usize)> {
        self.credential_ids.get(id).copied()
    }

    /// Whether a caller of `tenant` may use the credential: the platform's
    /// keys, and its own tenant's.
    pub fn credential_usable_by(&self, provider: usize, credential: usize, tenant: usize) -> bool {
        self.interned
            .credential_owner
            .get(provider)
            .and_then(|owners| owners.get(credential))
            .is_some_and(|owner| *owner == Owner::Platform || owner.is(tenant))
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

/// A credential of the catalog the proxy cannot send: its routes are
/// skipped until a reload finds its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnusableCredential {
    pub provider: String,
    pub credential: String,
    pub variable: String,
    pub why: &'static str,
}

/// The credentials of `snapshot` without a secret it can send, and why.
pub fn unusable_credentials(
    snapshot: &Snapshot,
    secrets: &dyn SecretSource,
) -> Vec<UnusableCredential> {
    let mut unusable = Vec::new();
    for (provider_index, provider) in snapshot.data.catalog.providers.iter().enumerate() {
        for (credential_index, credential) in provider.credentials.iter().enumerate() {
            if snapshot.secret(provider_index, credential_index).is_some() {
                continue;
            }
            let why = match secrets.get(&credential.env) {
                Some(value) if value.trim().is_empty() => {
                    "the credential's variable holds only whitespace; its routes are skipped"
                }
                Some(_) => {
                    "the credential's variable holds a control character (a line break \
                     inside it?) that no request header can carry; its routes are skipped"
                }
                None if secrets.holds_other_than_text(&credential.env) => {
                    "the credential's variable holds bytes that are not UTF-8 text; \
                     its routes are skipped"
                }
                // The environment gives an empty variable as none.
                None => "the credential's variable is not set, or empty; its routes are skipped",
            };
            unusable.push(UnusableCredential {
                provider: provider.id.clone(),
                credential: credential.id.clone(),
                variable: credential.env.clone(),
                why,
            });
        }
    }
    unusable
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

/// A stable content hash of files, for snapshot versions: XXH3, 64 bits,
/// over each part followed by its length, printed as 16 hex digits. It
/// identifies a version; it is not a security measure.
pub fn content_version<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update(&(part.len() as u64).to_le_bytes());
    }
    format!("{:016x}", hasher.digest())
}

/// `text` in lower case, copied only when it has an upper-case letter:
/// the name tables are keyed in lower case, and most references are.
fn lowercase(text: &str) -> std::borrow::Cow<'_, str> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(text.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(text)
    }
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
    fn builtin_members_are_found_by_their_variants() {
        for endpoint in Endpoint::ALL {
            assert_eq!(endpoint_member(endpoint).as_str(), Some(endpoint.name()));
        }
        for wire in [WireFormat::OpenAi, WireFormat::Anthropic] {
            assert_eq!(wire_member(wire).as_str(), Some(wire.name()));
        }
        for kind in [ModelKind::Chat, ModelKind::Completion, ModelKind::Embedding] {
            assert_eq!(kind_member(kind).as_str(), Some(kind.name()));
        }
        for (kind, name) in [
            (ResolutionKind::Bare, "bare"),
            (ResolutionKind::Alias, "alias"),
            (ResolutionKind::Pin, "pin"),
            (ResolutionKind::Unknown, "unknown"),
        ] {
            assert_eq!(resolution_member(kind).as_str(), Some(name));
        }
    }

    #[test]
    fn steps_reading_only_the_catalog_and_endpoint_are_settled_per_row() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/noirdoc.policy");
        let snapshot = compile_file(&path, &AllSecrets).expect("noirdoc compiles");
        let rows = snapshot.statics.rows();
        assert!(rows > 0);
        // Step 2: the model fits the endpoint (its kind and wire format).
        let fits = |endpoint| {
            snapshot
                .compiled
                .settled_by_endpoint(1, endpoint, rows)
                .expect("step 2 reads only the catalog and the endpoint")
        };
        let chat = fits(Endpoint::ChatCompletions);
        let messages = fits(Endpoint::Messages);
        assert!(chat.contains(&true) && messages.contains(&true));
        assert!(
            chat.iter()
                .zip(messages)
                .all(|(chat, messages)| !(*chat && *messages))
        );
        // Step 1 reads whose credential it is: asked per request.
        assert!(
            snapshot
                .compiled
                .settled_by_endpoint(0, Endpoint::ChatCompletions, rows)
                .is_none()
        );

        // ai-setu's second step reads the endpoints a provider serves.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/ai-setu.policy");
        let snapshot = compile_file(&path, &AllSecrets).expect("ai-setu compiles");
        let rows = snapshot.statics.rows();
        let serves = |endpoint| {
            snapshot
                .compiled
                .settled_by_endpoint(1, endpoint, rows)
                .expect("the endpoint step reads only the catalog and the endpoint")
        };
        // Every provider serves OpenAI's chat completions; only the Claude
        // ones serve Anthropic's messages, and only the others Responses.
        assert!(serves(Endpoint::ChatCompletions).iter().all(|fits| *fits));
        for other in [Endpoint::Messages, Endpoint::Responses] {
            let served = serves(other);
            assert!(served.contains(&true) && served.contains(&false));
        }
    }

    #[test]
    fn definitions_of_how_the_one_requested_id_resolved_are_worked_out_per_request() {
        let compile = |name: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("policies/{name}.policy"));
            compile_file(&path, &AllSecrets).expect("the policy compiles")
        };
        // ai-setu asks for the body's model alone: `pinned` reads only
        // `requested.kind`, and both steps that read `requested` have a part
        // the request settles (the endpoint step reads only the request's
        // endpoint and the provider).
        let ai_setu = compile("ai-setu");
        let pinned = ai_setu
            .program
            .lets
            .iter()
            .find(|spec| spec.name == "pinned");
        assert!(pinned.is_some_and(|spec| !spec.candidate));
        assert_eq!(ai_setu.guards.len(), 3);
        assert!(!ai_setu.guards[0].parts().is_empty());
        assert!(ai_setu.guards[1].parts().is_empty());
        assert!(!ai_setu.guards[2].parts().is_empty());
        // ngrok asks for several ids (a `from` list), so each candidate
        // keeps its own.
        let ngrok = compile("ngrok");
        assert!(!ngrok.program.models.requests_one_id());
        assert!(ai_setu.program.models.requests_one_id());
    }

    #[test]
    fn a_secret_is_its_value_without_the_whitespace_around_it() {
        let secret = |value: &str| Secret::from_value(value).map(|s| s.expose().to_string());
        assert_eq!(secret("sk-live-123\n").as_deref(), Some("sk-live-123"));
        assert_eq!(secret("  sk-live-123\r\n").as_deref(), Some("sk-live-123"));
        // Nothing a header can send: no secret, so its routes are skipped.
        assert_eq!(secret(" \n"), None);
        assert_eq!(secret("sk-live\n123"), None);
        assert_eq!(secret("sk-live\u{7f}"), None);
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret(Arc::from("sk-live-123"));
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert_eq!(secret.expose(), "sk-live-123");
    }
}
