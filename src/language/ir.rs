//! The elaborated policy: what the checker produces from a clean syntax tree.
//! Every name is resolved to what it reads, string literals compared with
//! enumerations are members, and errors are indices. The compiler and the
//! evaluator work on this, never on the syntax tree.

use crate::language::ast::{
    Aggregate, BinaryOp, HealthScope, Level, MergeOp, OutcomeKind, PinTarget, TimeoutKind,
};
use crate::language::check::EnumTy;
use crate::source::Span;
use crate::value::Value;
use std::sync::Arc;

/// An expression, resolved and typed.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    pub kind: TermKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TermKind {
    Const(Value),
    Read(Read),
    /// Reads `inner` for another candidate than the current one.
    At(Who, Box<Term>),
    Let(usize),
    Merge(usize),
    Not(Box<Term>),
    Negate(Box<Term>),
    Binary(BinaryOp, Box<Term>, Box<Term>),
    If(Box<Term>, Box<Term>, Box<Term>),
    Call(Function, Vec<Term>),
    Aggregate(Aggregate, Box<Term>, Option<Box<Term>>),
    List(Vec<Term>),
    Record(Vec<(Arc<str>, Term)>),
    /// A field of a record value.
    Field(Box<Term>, Arc<str>),
    /// A string taken as a member of an enumeration (absent if it is none).
    ToEnum(Arc<EnumTy>, Box<Term>),
    /// Made by the compiler, never the checker: a part that reads only the
    /// catalog, precomputed per route and credential in this slot. The term
    /// is evaluated for a candidate the catalog does not describe.
    Static(usize, Box<Term>),
    /// Made by the compiler: a part that reads only the request, computed
    /// once per request into this slot.
    Hoisted(usize, Box<Term>),
    /// Made by the compiler: an aggregate over the candidate set (the last
    /// term) that reads the candidate it scores only through the listed
    /// terms (the `X` of each `scored.X`). It has one value per set and
    /// values of those terms, so a machine computes it once per group of
    /// candidates that agree on them (say, per model), kept under this slot.
    Grouped(usize, Vec<Term>, Box<Term>),
}

/// Which candidate `At` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    Prev,
    First,
    Served,
    /// The candidate being scored, inside an aggregate.
    Scored,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Function {
    Min,
    Max,
    Clamp,
    Coalesce,
    Present,
    Empty,
    Len,
    Intersects,
    Subset,
    IndexOf,
    Contains,
    StartsWith,
    Lower,
    Seconds,
    Backoff,
}

impl Term {
    pub fn new(kind: TermKind, span: Span) -> Term {
        Term { kind, span }
    }

    pub fn constant(value: Value, span: Span) -> Term {
        Term::new(TermKind::Const(value), span)
    }

    pub fn read(read: Read, span: Span) -> Term {
        Term::new(TermKind::Read(read), span)
    }
}

/// A `let` or `merge` definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefRef {
    Let(usize),
    Merge(usize),
}

impl Function {
    pub fn by_name(name: &str) -> Option<Function> {
        Some(match name {
            "min" => Function::Min,
            "max" => Function::Max,
            "clamp" => Function::Clamp,
            "coalesce" => Function::Coalesce,
            "present" => Function::Present,
            "empty" => Function::Empty,
            "len" => Function::Len,
            "intersects" => Function::Intersects,
            "subset" => Function::Subset,
            "index_of" => Function::IndexOf,
            "contains" => Function::Contains,
            "starts_with" => Function::StartsWith,
            "lower" => Function::Lower,
            "seconds" => Function::Seconds,
            "backoff" => Function::Backoff,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PriceField {
    Input,
    Output,
    CacheRead,
    CacheWrite,
}

/// Something an expression reads from the request, the data, the state or
/// an attempt's outcome. Attribute reads carry the schema index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Read {
    RequestId,
    RequestModel,
    /// Whether the requested model matches a pin template naming a provider
    /// or credential.
    RequestPinned,
    RequestEndpoint,
    RequestWire,
    RequestKind,
    RequestStream,
    RequestParameters,
    RequestEstimatedTokens,
    /// An input's value, or a field inside it.
    Input(usize, Vec<Arc<str>>),
    TenantId,
    TenantAttr(usize),
    WorkspaceId,
    WorkspaceAttr(usize),
    KeyId,
    KeyAttr(usize),
    Setting(usize),
    DeploymentAttr(usize),
    ModelId,
    ModelKind,
    ModelAliases,
    ModelAttr(usize),
    ProviderId,
    ProviderName,
    ProviderAliases,
    ProviderFormat,
    ProviderEndpoints,
    ProviderPriority,
    ProviderListed,
    ProviderAttr(usize),
    RouteUpstreamModel,
    RoutePrice(PriceField),
    RouteCapabilities,
    RouteAttr(usize),
    CredentialId,
    CredentialOwned,
    CredentialAttr(usize),
    HealthPaused,
    HealthPenalized,
    HealthStrikes,
    StatsSamples,
    StatsSuccessRate,
    StatsTtft,
    StatsLatency,
    StatsThroughput,
    CapacityFull,
    CapacityInFlight,
    RequestedIndex,
    RequestedKind,
    RequestedId,
    UpstreamStatus,
    UpstreamRetryAfter,
    UpstreamErrorCode,
    UpstreamErrorType,
    UpstreamErrorMessage,
    Attempt,
    Attempts,
    Retries,
    Elapsed,
    FreeIn,
    ShorthandValue,
    Succeeded,
}

impl Read {
    /// Whether the value depends on the candidate being looked at.
    pub fn is_candidate(&self) -> bool {
        use Read::*;
        matches!(
            self,
            ModelId
                | ModelKind
                | ModelAliases
                | ModelAttr(_)
                | ProviderId
                | ProviderName
                | ProviderAliases
                | ProviderFormat
                | ProviderEndpoints
                | ProviderPriority
                | ProviderListed
                | ProviderAttr(_)
                | RouteUpstreamModel
                | RoutePrice(_)
                | RouteCapabilities
                | RouteAttr(_)
                | CredentialId
                | CredentialOwned
                | CredentialAttr(_)
                | HealthPaused
                | HealthPenalized
                | HealthStrikes
                | StatsSamples
                | StatsSuccessRate
                | StatsTtft
                | StatsLatency
                | StatsThroughput
                | CapacityFull
                | CapacityInFlight
                | RequestedIndex
                | RequestedKind
                | RequestedId
        )
    }

    /// Whether the value depends on health, measurements or capacity, which
    /// change while the catalog does not.
    pub fn is_live(&self) -> bool {
        use Read::*;
        matches!(
            self,
            HealthPaused
                | HealthPenalized
                | HealthStrikes
                | StatsSamples
                | StatsSuccessRate
                | StatsTtft
                | StatsLatency
                | StatsThroughput
                | CapacityFull
                | CapacityInFlight
        )
    }
}

/// An error the policy raises: a declared one, or the provider's own answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorRef {
    Declared(usize),
    Passthrough,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ErrorSpec {
    pub name: String,
    pub status: Term,
    pub message: Term,
    pub retry_after: Option<Term>,
    pub should_retry: Option<Term>,
    pub error_type: Option<Term>,
}

/// The type an input's raw value must have.
#[derive(Debug, Clone, PartialEq)]
pub enum InputType {
    Bool,
    Number,
    Int { low: f64, high: f64 },
    String,
    Duration,
    Provider,
    Model,
    Enum(Arc<EnumTy>),
    List(Box<InputType>),
    Csv(Box<InputType>),
    Object(Vec<(Arc<str>, InputType)>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSourceKind {
    Body,
    Header,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InputSpec {
    pub name: String,
    pub source: InputSourceKind,
    /// The body field or header name (headers in lowercase).
    pub field: String,
    pub ty: InputType,
    pub shorthand: Option<(InputType, Term)>,
    /// A value of the wrong shape.
    pub malformed: ErrorRef,
    /// An unknown field of an object, or a number out of its range.
    pub invalid: ErrorRef,
    /// A provider or model name the catalog does not have.
    pub unknown: ErrorRef,
    /// When this request-level condition holds, the input is not read.
    pub unless: Option<Term>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reject {
    pub condition: Term,
    pub error: ErrorRef,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    pub level: Level,
    pub per_model: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MergeSpec {
    pub name: String,
    pub op: MergeOp,
    pub request: Term,
    pub default: Term,
    pub strict: Option<ErrorRef>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LetSpec {
    pub name: String,
    pub term: Term,
    /// Reads the candidate (evaluated per candidate).
    pub candidate: bool,
    /// Uses an aggregate over the candidate set.
    pub aggregate: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SortKeySpec {
    pub term: Term,
    pub descending: bool,
    pub nulls_first: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PinSpec {
    pub target: PinTarget,
    pub prefix: String,
    pub separator: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CredentialSpec {
    Each,
    One(Vec<SortKeySpec>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct UnknownServe {
    pub condition: Term,
    pub keys: Vec<SortKeySpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelsSpec {
    pub sources: Vec<Term>,
    pub pins: Vec<PinSpec>,
    pub credentials: CredentialSpec,
    pub credentials_error: ErrorRef,
    pub unknown_serve: Vec<UnknownServe>,
    pub unknown_error: ErrorRef,
}

impl ModelsSpec {
    /// Whether a request asks for one id, the body's `model` (no `from`
    /// list): then every candidate shares `requested.kind` and
    /// `requested.id`, and they are known once per request.
    pub fn requests_one_id(&self) -> bool {
        matches!(
            self.sources.as_slice(),
            [Term {
                kind: TermKind::Read(Read::RequestModel),
                ..
            }]
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    Require(ErrorRef),
    PreferExclusively,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    pub kind: StepKind,
    pub condition: Term,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum OrderPart {
    By(SortKeySpec),
    /// `use sort`: the selector's value names one of the sorts.
    UseSort {
        selector: Term,
        sorts: Vec<(String, Vec<SortKeySpec>)>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum StrategySpec {
    Random,
    RoundRobin,
    LeastBusy,
    Weighted(Term),
    Share {
        key: SortKeySpec,
        tolerance: f64,
        among: Vec<Term>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct BalanceSpec {
    pub when: Option<Term>,
    pub strategy: StrategySpec,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Next,
    Stop,
    Retry(Option<Term>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ErrorChoiceSpec {
    Fixed(ErrorRef),
    Conditional(Term, ErrorRef, Box<ErrorChoiceSpec>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    pub outcomes: Vec<OutcomeKind>,
    pub when: Option<Term>,
    pub action: Action,
    pub pauses: Vec<(HealthScope, Term)>,
    pub penalties: Vec<HealthScope>,
    pub error: Option<ErrorChoiceSpec>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FailoverSpec {
    pub attempts: Term,
    pub reorder: Vec<SortKeySpec>,
    pub keep: Vec<Term>,
    pub budget: Option<(Term, ErrorRef)>,
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PenaltySpec {
    pub base: Term,
    pub factor: Term,
    pub max: Term,
    pub reset: Term,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldSpec {
    pub name: String,
    pub term: Term,
}

/// A checked policy, elaborated.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub name: String,
    pub inputs: Vec<InputSpec>,
    pub rejects: Vec<Reject>,
    /// The error for a body that is not a JSON object (default: a built-in one).
    pub malformed_body: Option<ErrorRef>,
    pub layers: Vec<LayerSpec>,
    pub merges: Vec<MergeSpec>,
    pub lets: Vec<LetSpec>,
    pub models: ModelsSpec,
    pub steps: Vec<StepSpec>,
    pub order: Vec<OrderPart>,
    pub balance: Vec<BalanceSpec>,
    pub failover: FailoverSpec,
    pub penalty: Option<PenaltySpec>,
    pub stats_window: Option<Term>,
    pub capacity_wait: Option<Term>,
    pub capacity_error: Option<ErrorRef>,
    pub timeouts: Vec<(TimeoutKind, Term)>,
    pub hold_headers: Option<Term>,
    pub late_comment: Option<Term>,
    /// `stream.after_commit`: the limit of a committed stream, in place of
    /// the attempt's and the budget's; `None` when the policy leaves those.
    pub after_commit: Option<Term>,
    pub errors: Vec<ErrorSpec>,
    pub headers: Vec<FieldSpec>,
    pub listing: Vec<FieldSpec>,
}
