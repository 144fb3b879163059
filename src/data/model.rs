//! The validated data model: catalog (providers, credentials, models, routes)
//! and tenants (organisations, workspaces, keys, layered settings).

use super::schema::Schema;
use crate::source::{SourceId, Span};
use crate::value::Value;

/// Where a data entry was written, for diagnostics that point into YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSpan {
    pub source: SourceId,
    pub span: Span,
}

/// Declared attribute values of one entry, indexed like its schema table;
/// `None` where the entry does not set the attribute and it has no fallback.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attributes(pub Vec<Option<Value>>);

impl Attributes {
    pub fn get(&self, index: usize) -> Option<&Value> {
        self.0.get(index).and_then(Option::as_ref)
    }
}

/// The wire format a provider speaks and an endpoint accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireFormat {
    OpenAi,
    Anthropic,
}

impl WireFormat {
    pub const NAMES: [&'static str; 2] = ["openai", "anthropic"];

    pub fn parse(text: &str) -> Option<WireFormat> {
        match text {
            "openai" => Some(WireFormat::OpenAi),
            "anthropic" => Some(WireFormat::Anthropic),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WireFormat::OpenAi => "openai",
            WireFormat::Anthropic => "anthropic",
        }
    }
}

/// The client-facing endpoints the proxy serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    Responses,
    Messages,
}

impl Endpoint {
    pub const ALL: [Endpoint; 5] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Messages,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
        }
    }

    pub fn parse(name: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The path after `/v1`.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Completions => "/completions",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Responses => "/responses",
            Endpoint::Messages => "/messages",
        }
    }

    pub fn from_path(path: &str) -> Option<Endpoint> {
        let rest = path.strip_prefix("/v1")?;
        Endpoint::ALL.into_iter().find(|e| e.path() == rest)
    }

    pub fn wire(self) -> WireFormat {
        match self {
            Endpoint::Messages => WireFormat::Anthropic,
            _ => WireFormat::OpenAi,
        }
    }

    pub fn kind(self) -> ModelKind {
        match self {
            Endpoint::Completions => ModelKind::Completion,
            Endpoint::Embeddings => ModelKind::Embedding,
            _ => ModelKind::Chat,
        }
    }

    /// Whether an answer here can come as a stream: embeddings never do,
    /// whatever the body's `stream` says.
    pub fn streams(self) -> bool {
        self != Endpoint::Embeddings
    }
}

/// What a model does, which decides the endpoints it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    Chat,
    Completion,
    Embedding,
}

impl ModelKind {
    pub const NAMES: [&'static str; 3] = ["chat", "completion", "embedding"];

    pub fn parse(text: &str) -> Option<ModelKind> {
        match text {
            "chat" => Some(ModelKind::Chat),
            "completion" => Some(ModelKind::Completion),
            "embedding" => Some(ModelKind::Embedding),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Completion => "completion",
            ModelKind::Embedding => "embedding",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    pub source: SourceId,
    pub providers: Vec<Provider>,
    pub models: Vec<Model>,
    pub aliases: Vec<Alias>,
    pub deployment: Attributes,
}

impl Catalog {
    pub fn model(&self, id: &str) -> Option<&Model> {
        self.models.iter().find(|model| model.id == id)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub id: String,
    /// The public name reported in headers; several providers (regions,
    /// variants) may share one.
    pub name: String,
    /// Other names requests may use for this provider.
    pub aliases: Vec<String>,
    /// The format of the provider's own API.
    pub format: WireFormat,
    /// The endpoints its base URL serves, in `Endpoint::ALL`'s order: by
    /// default every endpoint of its format. A catalog may name fewer, or
    /// some of the other format (Anthropic's API also serves OpenAI's chat
    /// completions). The proxy does not translate, so a request is
    /// understood only where its endpoint is served.
    pub endpoints: Vec<Endpoint>,
    pub base_url: String,
    pub priority: f64,
    /// When the provider joined the catalog, as days since 1970-01-01.
    pub listed: Option<i64>,
    pub capacity: Option<CapacityLimits>,
    pub credentials: Vec<Credential>,
    pub attributes: Attributes,
    pub at: DataSpan,
}

impl Provider {
    pub fn serves(&self, endpoint: Endpoint) -> bool {
        self.endpoints.contains(&endpoint)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityLimits {
    pub concurrent: Option<u32>,
    /// At most `requests` per `window_ms`.
    pub window: Option<(u32, u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    pub id: String,
    /// The environment variable that holds the secret; the secret itself is
    /// never in the data.
    pub env: String,
    /// The tenant whose own key this is (BYOK); `None` for the platform's.
    pub tenant: Option<String>,
    pub attributes: Attributes,
    pub at: DataSpan,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub id: String,
    pub kind: ModelKind,
    pub aliases: Vec<String>,
    pub attributes: Attributes,
    pub routes: Vec<Route>,
    pub at: DataSpan,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Index into [`Catalog::providers`].
    pub provider: usize,
    /// The model name sent upstream.
    pub upstream_model: String,
    pub price: Price,
    pub capabilities: Vec<String>,
    pub attributes: Attributes,
    pub at: DataSpan,
}

/// Prices in USD per million tokens; absent where the catalog has none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub cache_read: Option<f64>,
    pub cache_write: Option<f64>,
}

/// A name that stands for one model or, as a fallback list, several.
#[derive(Debug, Clone, PartialEq)]
pub struct Alias {
    pub name: String,
    /// Indices into [`Catalog::models`], in order of preference.
    pub targets: Vec<usize>,
    pub at: DataSpan,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tenants {
    pub source: SourceId,
    pub tenants: Vec<Tenant>,
    pub keys: Vec<Key>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub id: String,
    pub attributes: Attributes,
    pub settings: SettingsLayer,
    pub workspaces: Vec<Workspace>,
    pub at: DataSpan,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workspace {
    pub id: String,
    pub attributes: Attributes,
    pub settings: SettingsLayer,
    pub at: DataSpan,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub id: String,
    pub sha256: [u8; 32],
    /// Index into [`Tenants::tenants`].
    pub tenant: usize,
    /// Index into that tenant's workspaces.
    pub workspace: usize,
    pub attributes: Attributes,
    pub settings: SettingsLayer,
    pub at: DataSpan,
}

/// Settings one level (key, workspace or tenant) sets: for every model, and
/// per model id. `None` in a slot means "not set here, ask the next layer".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SettingsLayer {
    pub all_models: Attributes,
    pub per_model: Vec<(String, Attributes)>,
}

/// A catalog, its tenants and the schema both were validated against.
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    pub schema: Schema,
    pub catalog: Catalog,
    pub tenants: Tenants,
    /// Whether every [`DataSpan`] points where its value was written; false
    /// when a file was read as JSON without positions (see
    /// [`Reading`](super::load::Reading)).
    pub located: bool,
}
