//! The policy syntax tree. Every node carries its span; spans take no part in
//! equality, so trees parsed from differently laid-out text compare equal.

use crate::source::Span;

#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StringLit {
    pub value: String,
    pub span: Span,
}

/// A parsed policy file: its items in source order. The checker enforces which
/// sections may appear once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyFile {
    pub items: Vec<Item>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Policy(PolicyDecl),
    Models(ModelsBlock),
    Input(Box<InputDecl>),
    Validate(ValidateBlock),
    Defaults(DefaultsBlock),
    Merge(MergeBlock),
    Let(LetDecl),
    Eligibility(EligibilityBlock),
    Order(OrderBlock),
    Sort(SortDecl),
    Balance(BalanceDecl),
    Failover(FailoverBlock),
    Health(HealthBlock),
    Capacity(CapacityBlock),
    Timeouts(TimeoutsBlock),
    Stream(StreamBlock),
    Errors(ErrorsBlock),
    Headers(HeadersBlock),
    Listing(ListingBlock),
}

impl Item {
    /// The section keyword, as written in the file.
    pub fn keyword(&self) -> &'static str {
        match self {
            Item::Policy(_) => "policy",
            Item::Models(_) => "models",
            Item::Input(_) => "input",
            Item::Validate(_) => "validate",
            Item::Defaults(_) => "defaults",
            Item::Merge(_) => "merge",
            Item::Let(_) => "let",
            Item::Eligibility(_) => "eligibility",
            Item::Order(_) => "order",
            Item::Sort(_) => "sort",
            Item::Balance(_) => "balance",
            Item::Failover(_) => "failover",
            Item::Health(_) => "health",
            Item::Capacity(_) => "capacity",
            Item::Timeouts(_) => "timeouts",
            Item::Stream(_) => "stream",
            Item::Errors(_) => "errors",
            Item::Headers(_) => "headers",
            Item::Listing(_) => "listing",
        }
    }

    /// The span of the section keyword, where "declared twice" points.
    pub fn keyword_span(&self) -> Span {
        match self {
            Item::Policy(x) => x.keyword,
            Item::Models(x) => x.keyword,
            Item::Input(x) => x.keyword,
            Item::Validate(x) => x.keyword,
            Item::Defaults(x) => x.keyword,
            Item::Merge(x) => x.keyword,
            Item::Let(x) => x.keyword,
            Item::Eligibility(x) => x.keyword,
            Item::Order(x) => x.keyword,
            Item::Sort(x) => x.keyword,
            Item::Balance(x) => x.keyword,
            Item::Failover(x) => x.keyword,
            Item::Health(x) => x.keyword,
            Item::Capacity(x) => x.keyword,
            Item::Timeouts(x) => x.keyword,
            Item::Stream(x) => x.keyword,
            Item::Errors(x) => x.keyword,
            Item::Headers(x) => x.keyword,
            Item::Listing(x) => x.keyword,
        }
    }
}

// ------------------------------------------------------------------ header

#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDecl {
    pub keyword: Span,
    pub name: Ident,
    pub settings: Vec<PolicySetting>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PolicySetting {
    pub kind: DataFileKind,
    pub kind_span: Span,
    pub path: StringLit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFileKind {
    Catalog,
    Tenants,
}

// ------------------------------------------------------------------ candidates

#[derive(Debug, Clone, PartialEq)]
pub struct ModelsBlock {
    pub keyword: Span,
    pub statements: Vec<ModelsStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ModelsStmt {
    /// `from request.model, input.models`: where requested model ids come from.
    Sources { keyword: Span, sources: Vec<Expr> },
    /// `pin "{provider}:{model}"`.
    Pin(PinTemplate),
    /// `credentials each else E` / `credentials one by KEYS else E`.
    Credentials {
        keyword: Span,
        mode: CredentialMode,
        error: Ident,
    },
    /// `unknown serve where COND by KEYS`: a fallback tier for ids the catalog lacks.
    UnknownServe {
        keyword: Span,
        condition: Expr,
        keys: Vec<SortKey>,
    },
    /// `unknown error E`.
    UnknownError { keyword: Span, error: Ident },
    /// `one provider per model`: the data may route each model to one provider only.
    OneProviderPerModel { span: Span },
}

#[derive(Debug, Clone, PartialEq)]
pub enum CredentialMode {
    Each,
    One(Vec<SortKey>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct PinTemplate {
    pub span: Span,
    pub text: String,
    pub target: PinTarget,
    pub prefix: String,
    pub separator: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinTarget {
    Provider,
    Credential,
}

// ------------------------------------------------------------------ inputs

#[derive(Debug, Clone, PartialEq)]
pub struct InputDecl {
    pub keyword: Span,
    pub name: Ident,
    pub source: InputSource,
    pub source_name: StringLit,
    pub ty: TypeExpr,
    pub shorthand: Option<Shorthand>,
    pub malformed_error: Option<Ident>,
    /// `invalid error E`: an unknown field or an out-of-range number.
    pub invalid_error: Option<Ident>,
    pub unknown_error: Option<Ident>,
    /// `unless COND`: when the request's condition holds, the input is not
    /// read (absent, its errors never raised).
    pub unless: Option<Expr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputSource {
    Body,
    Header,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Shorthand {
    pub span: Span,
    pub ty: TypeExpr,
    pub value: Expr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    pub kind: TypeExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TypeExprKind {
    Named(Ident),
    List(Box<TypeExpr>),
    Csv(Box<TypeExpr>),
    Object(Vec<FieldDecl>),
    Enum(Vec<Ident>),
    IntRange { low: f64, high: f64 },
    Like(Ident),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldDecl {
    pub name: Ident,
    pub ty: TypeExpr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ValidateBlock {
    pub keyword: Span,
    pub rules: Vec<RejectRule>,
    /// `malformed body error E`: the error for a body that is not a JSON object.
    pub malformed_body: Vec<MalformedBody>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MalformedBody {
    pub keyword: Span,
    pub error: Ident,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RejectRule {
    pub keyword: Span,
    pub condition: Expr,
    pub error: Ident,
}

// ------------------------------------------------------------------ defaults and merges

#[derive(Debug, Clone, PartialEq)]
pub struct DefaultsBlock {
    pub keyword: Span,
    pub layers: Vec<LayerRef>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerRef {
    pub level: Level,
    pub per_model: bool,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    Key,
    Workspace,
    Tenant,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MergeBlock {
    pub keyword: Span,
    pub merges: Vec<MergeDecl>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MergeDecl {
    pub name: Ident,
    pub op: MergeOp,
    pub op_span: Span,
    pub request: Expr,
    pub default: Expr,
    pub strict: Option<Ident>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOp {
    Intersect,
    Union,
    Min,
    Max,
    All,
    Any,
    First,
}

impl MergeOp {
    pub fn name(self) -> &'static str {
        match self {
            MergeOp::Intersect => "intersect",
            MergeOp::Union => "union",
            MergeOp::Min => "min",
            MergeOp::Max => "max",
            MergeOp::All => "all",
            MergeOp::Any => "any",
            MergeOp::First => "first",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LetDecl {
    pub keyword: Span,
    pub name: Ident,
    pub value: Expr,
}

// ------------------------------------------------------------------ eligibility

#[derive(Debug, Clone, PartialEq)]
pub struct EligibilityBlock {
    pub keyword: Span,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Keep candidates for which the condition holds; none left is `error`.
    Require {
        keyword: Span,
        condition: Expr,
        error: Ident,
    },
    /// If any candidate satisfies the condition, keep only those.
    PreferExclusively { keyword: Span, condition: Expr },
}

// ------------------------------------------------------------------ order

#[derive(Debug, Clone, PartialEq)]
pub struct OrderBlock {
    pub keyword: Span,
    pub statements: Vec<OrderStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum OrderStmt {
    By(SortKey),
    UseSort { keyword: Span, selector: Expr },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SortDecl {
    pub keyword: Span,
    pub name: Ident,
    pub keys: Vec<SortKey>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    pub expr: Expr,
    pub descending: bool,
    pub nulls_first: bool,
}

// ------------------------------------------------------------------ load balancing

#[derive(Debug, Clone, PartialEq)]
pub struct BalanceDecl {
    pub keyword: Span,
    pub strategy: Strategy,
    pub strategy_span: Span,
    pub when: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    Random,
    RoundRobin,
    LeastBusy,
    Weighted(Expr),
    /// Shuffle the leading candidates whose key is within `tolerance` of the
    /// best one's and which agree on every `among` expression.
    Share {
        key: SortKey,
        tolerance: f64,
        among: Vec<Expr>,
    },
}

// ------------------------------------------------------------------ failover

#[derive(Debug, Clone, PartialEq)]
pub struct FailoverBlock {
    pub keyword: Span,
    pub statements: Vec<FailoverStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FailoverStmt {
    Attempts {
        keyword: Span,
        limit: Expr,
    },
    Reorder {
        keyword: Span,
        keys: Vec<SortKey>,
    },
    Keep {
        keyword: Span,
        condition: Expr,
    },
    Budget {
        keyword: Span,
        limit: Expr,
        error: Ident,
    },
    On(OutcomeRule),
}

#[derive(Debug, Clone, PartialEq)]
pub struct OutcomeRule {
    pub keyword: Span,
    pub outcomes: Vec<OutcomePattern>,
    pub when: Option<Expr>,
    pub consequences: Vec<Consequence>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OutcomePattern {
    pub kind: OutcomeKind,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    Any,
    /// An upstream HTTP status: `low..=high`, such as 500..=599 for `5xx`.
    Status {
        low: u16,
        high: u16,
    },
    ConnectError,
    Reset,
    Timeout,
    FirstTokenTimeout,
    Malformed,
    StreamBroken,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Consequence {
    Next {
        span: Span,
    },
    Stop {
        span: Span,
    },
    Retry {
        span: Span,
        after: Option<Expr>,
    },
    Pause {
        span: Span,
        scope: HealthScope,
        duration: Expr,
    },
    Penalize {
        span: Span,
        scope: HealthScope,
    },
    Error(ErrorChoice),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthScope {
    Route,
    Provider,
    Credential,
}

/// `error A if COND else B`: which error the client gets.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorChoice {
    pub error: Ident,
    pub otherwise: Option<(Expr, Box<ErrorChoice>)>,
}

impl ErrorChoice {
    /// Every error name this choice can produce.
    pub fn names(&self) -> Vec<&Ident> {
        let mut names = vec![&self.error];
        if let Some((_, rest)) = &self.otherwise {
            names.extend(rest.names());
        }
        names
    }
}

// ------------------------------------------------------------------ health, capacity, timeouts, streams

#[derive(Debug, Clone, PartialEq)]
pub struct HealthBlock {
    pub keyword: Span,
    pub statements: Vec<HealthStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum HealthStmt {
    Penalty(Box<PenaltyDecl>),
    Window { keyword: Span, window: Expr },
}

/// `penalty base 30s factor 2 max 5m reset 10m`: how long a failed candidate
/// stays demoted, by how many recent failures it has had.
#[derive(Debug, Clone, PartialEq)]
pub struct PenaltyDecl {
    pub keyword: Span,
    pub base: Expr,
    pub factor: Expr,
    pub max: Expr,
    pub reset: Expr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CapacityBlock {
    pub keyword: Span,
    pub statements: Vec<CapacityStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CapacityStmt {
    Wait { keyword: Span, limit: Expr },
    Error { keyword: Span, error: Ident },
}

#[derive(Debug, Clone, PartialEq)]
pub struct TimeoutsBlock {
    pub keyword: Span,
    pub timeouts: Vec<TimeoutDecl>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TimeoutDecl {
    pub kind: TimeoutKind,
    pub kind_span: Span,
    pub value: Expr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeoutKind {
    Connect,
    Headers,
    FirstToken,
    Idle,
    Attempt,
}

impl TimeoutKind {
    pub fn name(self) -> &'static str {
        match self {
            TimeoutKind::Connect => "connect",
            TimeoutKind::Headers => "headers",
            TimeoutKind::FirstToken => "first_token",
            TimeoutKind::Idle => "idle",
            TimeoutKind::Attempt => "attempt",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StreamBlock {
    pub keyword: Span,
    pub statements: Vec<StreamStmt>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StreamStmt {
    HoldHeaders { keyword: Span, limit: Expr },
    LateComment { keyword: Span, text: Expr },
    AfterCommit { keyword: Span, limit: Expr },
}

// ------------------------------------------------------------------ errors, headers, listing

#[derive(Debug, Clone, PartialEq)]
pub struct ErrorsBlock {
    pub keyword: Span,
    pub errors: Vec<ErrorDecl>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ErrorDecl {
    pub name: Ident,
    pub status: Expr,
    pub message: Expr,
    pub retry_after: Option<Expr>,
    pub should_retry: Option<Expr>,
    pub error_type: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeadersBlock {
    pub keyword: Span,
    pub fields: Vec<FieldValue>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListingBlock {
    pub keyword: Span,
    pub fields: Vec<FieldValue>,
}

/// `"name" = EXPR` in `headers` and `listing`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldValue {
    pub name: StringLit,
    pub value: Expr,
}

// ------------------------------------------------------------------ expressions

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    Literal(Literal),
    Path(Vec<Ident>),
    List(Vec<Expr>),
    Object(Vec<(Ident, Expr)>),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    If(Box<Expr>, Box<Expr>, Box<Expr>),
    Call(Ident, Vec<Expr>),
    Aggregate {
        function: Aggregate,
        function_span: Span,
        value: Box<Expr>,
        filter: Option<Box<Expr>>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Bool(bool),
    Number(f64),
    /// `10%` is the number 0.1; kept apart so messages can echo the input.
    Percent(f64),
    /// Milliseconds.
    Duration(u64),
    String(String),
    Null,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Not,
    Negate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Implies,
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Implies => "implies",
            BinaryOp::Or => "or",
            BinaryOp::And => "and",
            BinaryOp::Eq => "==",
            BinaryOp::Ne => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::Le => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::Ge => ">=",
            BinaryOp::In => "in",
            BinaryOp::NotIn => "not in",
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    MinOf,
    MaxOf,
    AvgOf,
    CountOf,
    AllOf,
    AnyOf,
    ListOf,
}

impl Aggregate {
    pub fn name(self) -> &'static str {
        match self {
            Aggregate::MinOf => "min_of",
            Aggregate::MaxOf => "max_of",
            Aggregate::AvgOf => "avg_of",
            Aggregate::CountOf => "count_of",
            Aggregate::AllOf => "all_of",
            Aggregate::AnyOf => "any_of",
            Aggregate::ListOf => "list_of",
        }
    }
}

impl Expr {
    /// `a.b.c` as text, if this expression is a path.
    pub fn path_text(&self) -> Option<String> {
        match &self.kind {
            ExprKind::Path(segments) => Some(
                segments
                    .iter()
                    .map(|segment| segment.name.as_str())
                    .collect::<Vec<_>>()
                    .join("."),
            ),
            _ => None,
        }
    }
}
