//! What names mean: the roots a policy can read (`request`, `provider`,
//! `upstream`, ...), their types built from the data schema, and which roots
//! each place in a policy may use.

use super::types::{EnumTy, RecordTy, Ty};
use crate::data::schema::{AttrDecl, AttrTable, AttrType, Schema};
use std::sync::Arc;

/// Every root name an expression can start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Root {
    Request,
    Input,
    Tenant,
    Workspace,
    Key,
    Defaults,
    Deployment,
    Model,
    Provider,
    Route,
    Credential,
    Health,
    Stats,
    Capacity,
    Requested,
    Prev,
    First,
    Served,
    Upstream,
    Attempt,
    Attempts,
    Retries,
    Elapsed,
    FreeIn,
    It,
    Succeeded,
}

impl Root {
    pub const ALL: [Root; 26] = [
        Root::Request,
        Root::Input,
        Root::Tenant,
        Root::Workspace,
        Root::Key,
        Root::Defaults,
        Root::Deployment,
        Root::Model,
        Root::Provider,
        Root::Route,
        Root::Credential,
        Root::Health,
        Root::Stats,
        Root::Capacity,
        Root::Requested,
        Root::Prev,
        Root::First,
        Root::Served,
        Root::Upstream,
        Root::Attempt,
        Root::Attempts,
        Root::Retries,
        Root::Elapsed,
        Root::FreeIn,
        Root::It,
        Root::Succeeded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Root::Request => "request",
            Root::Input => "input",
            Root::Tenant => "tenant",
            Root::Workspace => "workspace",
            Root::Key => "key",
            Root::Defaults => "defaults",
            Root::Deployment => "deployment",
            Root::Model => "model",
            Root::Provider => "provider",
            Root::Route => "route",
            Root::Credential => "credential",
            Root::Health => "health",
            Root::Stats => "stats",
            Root::Capacity => "capacity",
            Root::Requested => "requested",
            Root::Prev => "prev",
            Root::First => "first",
            Root::Served => "served",
            Root::Upstream => "upstream",
            Root::Attempt => "attempt",
            Root::Attempts => "attempts",
            Root::Retries => "retries",
            Root::Elapsed => "elapsed",
            Root::FreeIn => "free_in",
            Root::It => "it",
            Root::Succeeded => "succeeded",
        }
    }

    pub fn from_name(name: &str) -> Option<Root> {
        Root::ALL.into_iter().find(|root| root.name() == name)
    }

    /// Roots that describe one candidate route.
    pub fn is_candidate(self) -> bool {
        matches!(
            self,
            Root::Model
                | Root::Provider
                | Root::Route
                | Root::Credential
                | Root::Health
                | Root::Stats
                | Root::Capacity
                | Root::Requested
        )
    }

    /// Why a root is unavailable somewhere: where it can be used instead.
    pub fn available_in(self) -> &'static str {
        match self {
            Root::Upstream => {
                "`on` rules in `failover`, the errors they raise, and `keep` constraints (the previous attempt's answer)"
            }
            Root::Attempt => "`on` rules in `failover` and the errors they raise",
            Root::Retries => "`on` rules in `failover`",
            Root::Attempts | Root::Elapsed => "`on` rules, errors and headers",
            Root::Prev | Root::First => "`keep` constraints in `failover`",
            Root::Served => "errors, headers and `late_comment`",
            Root::FreeIn => "error declarations",
            Root::It => "the value of an input's `shorthand`",
            Root::Input => "most places; not in `credentials` or an input's `unless`",
            Root::Defaults => {
                "most places; not in `credentials`, `unknown serve` or an input's `unless`"
            }
            Root::Request | Root::Deployment => "most places; not in `credentials`",
            Root::Tenant | Root::Workspace | Root::Key => "most places; not in `unknown serve`",
            _ => {
                "places that look at one candidate (eligibility, order, sorts, balance strategies but not a balance's `when`, failover rules, timeouts and listings) and inside aggregates such as `any_of(…)`"
            }
        }
    }
}

/// A set of roots, as a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Roots(u32);

impl Roots {
    pub const fn of(roots: &[Root]) -> Roots {
        let mut bits = 0u32;
        let mut rest = roots;
        while let [root, tail @ ..] = rest {
            bits |= 1 << (*root as u32);
            rest = tail;
        }
        Roots(bits)
    }

    pub const fn with(self, other: Roots) -> Roots {
        Roots(self.0 | other.0)
    }

    pub fn contains(self, root: Root) -> bool {
        self.0 & (1 << (root as u32)) != 0
    }
}

pub const REQUEST: Roots = Roots::of(&[
    Root::Request,
    Root::Input,
    Root::Tenant,
    Root::Workspace,
    Root::Key,
    Root::Defaults,
    Root::Deployment,
]);
pub const CANDIDATE: Roots = Roots::of(&[
    Root::Model,
    Root::Provider,
    Root::Route,
    Root::Credential,
    Root::Health,
    Root::Stats,
    Root::Capacity,
    Root::Requested,
]);
pub const OUTCOME: Roots = Roots::of(&[
    Root::Upstream,
    Root::Attempt,
    Root::Attempts,
    Root::Retries,
    Root::Elapsed,
]);

/// A place in a policy: the roots it may read and whether a candidate set
/// exists there for aggregates.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    pub name: &'static str,
    pub roots: Roots,
    pub aggregates: bool,
    /// Whether `let` definitions that depend on the candidate may be used.
    pub candidate_lets: bool,
}

impl Place {
    pub const fn request(name: &'static str) -> Place {
        Place {
            name,
            roots: REQUEST,
            aggregates: false,
            candidate_lets: false,
        }
    }

    pub const fn candidate(name: &'static str) -> Place {
        Place {
            name,
            roots: REQUEST.with(CANDIDATE),
            aggregates: false,
            candidate_lets: true,
        }
    }

    pub const fn candidate_set(name: &'static str) -> Place {
        Place {
            name,
            roots: REQUEST.with(CANDIDATE),
            aggregates: true,
            candidate_lets: true,
        }
    }

    pub const fn with_roots(mut self, roots: Roots) -> Place {
        self.roots = self.roots.with(roots);
        self
    }

    pub const fn only(name: &'static str, roots: Roots) -> Place {
        Place {
            name,
            roots,
            aggregates: false,
            candidate_lets: false,
        }
    }
}

/// Built-in enumerations.
pub struct Builtins {
    pub endpoint: Arc<EnumTy>,
    pub wire: Arc<EnumTy>,
    pub kind: Arc<EnumTy>,
    pub resolution: Arc<EnumTy>,
}

impl Builtins {
    pub fn new() -> Builtins {
        Builtins {
            endpoint: EnumTy::new(
                "endpoint",
                &[
                    "chat_completions",
                    "completions",
                    "embeddings",
                    "responses",
                    "messages",
                ],
                false,
            ),
            wire: EnumTy::new("wire format", &["openai", "anthropic"], false),
            kind: EnumTy::new("model kind", &["chat", "completion", "embedding"], false),
            resolution: EnumTy::new(
                "requested kind",
                &["bare", "alias", "pin", "unknown"],
                false,
            ),
        }
    }
}

impl Default for Builtins {
    fn default() -> Self {
        Builtins::new()
    }
}

/// The type of a declared attribute.
pub fn attr_ty(decl: &AttrDecl, schema: &Schema) -> Ty {
    let ty = attr_type_ty(&decl.ty, schema);
    if decl.always_present() {
        ty
    } else {
        ty.optional()
    }
}

pub fn attr_type_ty(ty: &AttrType, schema: &Schema) -> Ty {
    match ty {
        AttrType::Bool => Ty::Bool,
        AttrType::Number => Ty::Number,
        AttrType::String | AttrType::Provider | AttrType::Model => Ty::String,
        AttrType::Duration => Ty::Duration,
        AttrType::Date => Ty::Date,
        AttrType::Enum(id) => schema.enum_def(*id).map_or(Ty::Unknown, |def| {
            Ty::Enum(Arc::new(EnumTy {
                name: def.name.clone(),
                members: def.members.iter().cloned().collect(),
                ordered: true,
            }))
        }),
        AttrType::List(inner) => Ty::List(Box::new(attr_type_ty(inner, schema))),
    }
}

fn record(name: &str, builtins: Vec<(&str, Ty)>, table: &AttrTable, schema: &Schema) -> Ty {
    let mut fields: Vec<(String, Ty)> = builtins
        .into_iter()
        .map(|(field, ty)| (field.to_string(), ty))
        .collect();
    fields.extend(
        table
            .entries
            .iter()
            .map(|decl| (decl.name.clone(), attr_ty(decl, schema))),
    );
    Ty::Record(Arc::new(RecordTy {
        name: name.to_string(),
        fields,
    }))
}

/// The types of every root, built from the data schema and declared inputs.
pub struct RootTypes {
    pub request: Ty,
    pub tenant: Ty,
    pub workspace: Ty,
    pub key: Ty,
    pub defaults: Ty,
    pub deployment: Ty,
    pub model: Ty,
    pub provider: Ty,
    pub route: Ty,
    pub credential: Ty,
    pub health: Ty,
    pub stats: Ty,
    pub capacity: Ty,
    pub requested: Ty,
    pub upstream: Ty,
}

impl RootTypes {
    pub fn new(schema: &Schema, builtins: &Builtins) -> RootTypes {
        let strings = || Ty::List(Box::new(Ty::String));
        let opt_number = || Ty::Number.optional();
        let simple = |name: &str, fields: Vec<(&str, Ty)>| {
            Ty::Record(Arc::new(RecordTy {
                name: name.to_string(),
                fields: fields
                    .into_iter()
                    .map(|(f, t)| (f.to_string(), t))
                    .collect(),
            }))
        };
        RootTypes {
            request: simple(
                "request",
                vec![
                    ("id", Ty::String),
                    ("model", Ty::String),
                    ("pinned", Ty::Bool),
                    ("endpoint", Ty::Enum(builtins.endpoint.clone())),
                    ("wire", Ty::Enum(builtins.wire.clone())),
                    ("kind", Ty::Enum(builtins.kind.clone())),
                    ("stream", Ty::Bool),
                    ("parameters", strings()),
                    ("estimated_tokens", Ty::Number),
                ],
            ),
            tenant: record("tenant", vec![("id", Ty::String)], &schema.tenant, schema),
            workspace: record(
                "workspace",
                vec![("id", Ty::String)],
                &schema.workspace,
                schema,
            ),
            key: record("key", vec![("id", Ty::String)], &schema.key, schema),
            defaults: record("defaults", Vec::new(), &schema.settings, schema)
                .settings_optional(schema),
            deployment: record("deployment", Vec::new(), &schema.deployment, schema),
            model: record(
                "model",
                vec![
                    ("id", Ty::String),
                    ("kind", Ty::Enum(builtins.kind.clone())),
                    ("aliases", strings()),
                ],
                &schema.model,
                schema,
            ),
            provider: record(
                "provider",
                vec![
                    ("id", Ty::String),
                    ("name", Ty::String),
                    ("aliases", strings()),
                    ("format", Ty::Enum(builtins.wire.clone())),
                    (
                        "endpoints",
                        Ty::List(Box::new(Ty::Enum(builtins.endpoint.clone()))),
                    ),
                    ("priority", Ty::Number),
                    ("listed", Ty::Date.optional()),
                ],
                &schema.provider,
                schema,
            ),
            route: record(
                "route",
                vec![
                    ("upstream_model", Ty::String),
                    (
                        "price",
                        simple(
                            "route.price",
                            vec![
                                ("input", opt_number()),
                                ("output", opt_number()),
                                ("cache_read", opt_number()),
                                ("cache_write", opt_number()),
                            ],
                        ),
                    ),
                    ("capabilities", strings()),
                ],
                &schema.route,
                schema,
            ),
            credential: record(
                "credential",
                vec![("id", Ty::String), ("owned", Ty::Bool)],
                &schema.credential,
                schema,
            ),
            health: simple(
                "health",
                vec![
                    ("paused", Ty::Bool),
                    ("penalized", Ty::Bool),
                    ("strikes", Ty::Number),
                ],
            ),
            stats: simple(
                "stats",
                vec![
                    ("samples", Ty::Number),
                    ("success_rate", opt_number()),
                    ("ttft", Ty::Duration.optional()),
                    ("latency", Ty::Duration.optional()),
                    ("throughput", opt_number()),
                ],
            ),
            capacity: simple(
                "capacity",
                vec![("full", Ty::Bool), ("in_flight", Ty::Number)],
            ),
            requested: simple(
                "requested",
                vec![
                    ("index", Ty::Number),
                    ("kind", Ty::Enum(builtins.resolution.clone())),
                    ("id", Ty::String),
                ],
            ),
            upstream: simple(
                "upstream",
                vec![
                    ("status", opt_number()),
                    ("retry_after", Ty::Duration.optional()),
                    (
                        "error",
                        simple(
                            "upstream.error",
                            vec![
                                ("code", Ty::String.optional()),
                                ("type", Ty::String.optional()),
                                ("message", Ty::String.optional()),
                            ],
                        ),
                    ),
                ],
            ),
        }
    }

    /// The candidate roots, as fields of a candidate value (`prev.provider`).
    pub fn candidate_field(&self, name: &str) -> Option<&Ty> {
        Some(match name {
            "model" => &self.model,
            "provider" => &self.provider,
            "route" => &self.route,
            "credential" => &self.credential,
            "health" => &self.health,
            "stats" => &self.stats,
            "capacity" => &self.capacity,
            "requested" => &self.requested,
            _ => return None,
        })
    }
}

trait SettingsOptional {
    fn settings_optional(self, schema: &Schema) -> Ty;
}

impl SettingsOptional for Ty {
    /// A setting no layer sets and that has no default is absent, even for
    /// booleans and lists: layers decide, not the type.
    fn settings_optional(self, schema: &Schema) -> Ty {
        let Ty::Record(record) = self else {
            return self;
        };
        let fields = record
            .fields
            .iter()
            .map(|(name, ty)| {
                let has_default = schema
                    .settings
                    .get(name)
                    .is_some_and(|decl| decl.default.is_some());
                let ty = if has_default {
                    ty.required().clone()
                } else {
                    ty.clone().optional()
                };
                (name.clone(), ty)
            })
            .collect();
        Ty::Record(Arc::new(RecordTy {
            name: record.name.clone(),
            fields,
        }))
    }
}
