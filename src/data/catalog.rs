//! Validation of the catalog file: providers, credentials, models, routes and
//! aliases.

use super::load::{UNKNOWN_MODEL_HELP, Validator, env_reference, secret_diagnostic, unique};
use super::model::*;
use super::schema::Subject;
use super::yaml::*;
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::source::{SourceId, Span};
use foldhash::HashMap;
use serde_saphyr::Spanned;

pub(super) fn validate(v: &mut Validator<'_>, source: SourceId, raw: &RawCatalog) -> Catalog {
    check_names(v, source, raw);
    unique(
        v,
        source,
        "provider",
        raw.providers.iter().map(|p| &p.value.id),
    );
    unique(
        v,
        source,
        "credential",
        raw.providers
            .iter()
            .flat_map(|p| p.value.credentials.iter().map(|c| &c.value.id)),
    );
    unique(v, source, "model", raw.models.iter().map(|m| &m.value.id));

    let providers: Vec<Provider> = raw
        .providers
        .iter()
        .filter_map(|provider| validate_provider(v, source, provider))
        .collect();
    let provider_index: HashMap<&str, usize> = providers
        .iter()
        .enumerate()
        .map(|(index, provider)| (provider.id.as_str(), index))
        .collect();

    let models: Vec<Model> = raw
        .models
        .iter()
        .filter_map(|model| validate_model(v, source, model, &provider_index))
        .collect();
    let aliases = validate_aliases(v, source, raw, &models);
    let deployment = v.attributes(
        source,
        Subject::Deployment,
        &raw.deployment,
        (&"deployment", Span::default()),
    );

    Catalog {
        source,
        providers,
        models,
        aliases,
        deployment,
    }
}

/// Ids, names, aliases and upstream names end up in logs, metrics and
/// model listings: an empty one or one with a control character names
/// nothing a client can send, and one that looks like an API key was pasted
/// by mistake, refused as an attribute holding one is.
fn check_names(v: &mut Validator<'_>, source: SourceId, raw: &RawCatalog) {
    let mut named: Vec<(&str, &Spanned<String>)> = Vec::new();
    for provider in &raw.providers {
        let provider = &provider.value;
        named.push(("id", &provider.id));
        named.extend(provider.name.iter().map(|name| ("name", name)));
        named.extend(provider.aliases.iter().map(|alias| ("aliases", alias)));
        for credential in &provider.credentials {
            named.push(("id", &credential.value.id));
        }
    }
    for model in &raw.models {
        let model = &model.value;
        named.push(("id", &model.id));
        named.extend(model.aliases.iter().map(|alias| ("aliases", alias)));
        for route in &model.routes {
            let route = &route.value;
            named.extend(route.upstream.iter().map(|upstream| ("upstream", upstream)));
            named.extend(route.capabilities.iter().map(|c| ("capabilities", c)));
        }
    }
    named.extend(raw.aliases.0.iter().map(|(alias, _)| ("aliases", alias)));
    for (field, text) in named {
        let span = v.span(source, text);
        v.check_name(source, span, field, &text.value);
    }
}

fn at<T>(v: &Validator<'_>, source: SourceId, value: &Spanned<T>) -> DataSpan {
    DataSpan {
        source,
        span: v.span(source, value),
    }
}

fn validate_provider(
    v: &mut Validator<'_>,
    source: SourceId,
    raw: &Spanned<RawProvider>,
) -> Option<Provider> {
    let p = &raw.value;
    // A bad format is reported; the provider stays so its routes are not
    // reported as naming a missing provider.
    let format = wire_format(v, source, &p.format).unwrap_or(WireFormat::OpenAi);
    let endpoints = served_endpoints(v, source, format, p.endpoints.as_ref());
    check_base_url(v, source, &p.base_url);
    let listed = p.listed.as_ref().and_then(|listed| {
        let parsed = super::schema::parse_date(&listed.value);
        if parsed.is_none() {
            let span = v.span(source, listed);
            v.report(
                codes::DATA_SCHEMA,
                source,
                span,
                format!("`{}` is not a date", listed.value),
                "not a date",
                Some(String::from("write the listing date as `YYYY-MM-DD`")),
            );
        }
        parsed
    });
    let capacity = p
        .capacity
        .as_ref()
        .and_then(|capacity| validate_capacity(v, source, capacity));
    let credentials = p
        .credentials
        .iter()
        .filter_map(|credential| validate_credential(v, source, credential))
        .collect();
    let attributes = v.attributes(
        source,
        Subject::Provider,
        &p.attributes,
        (&p.id.value, v.span(source, &p.id)),
    );
    let priority = match &p.priority {
        None => 0.0,
        Some(priority) if priority.value.0.is_finite() && priority.value.0.abs() <= MAX_NUMBER => {
            priority.value.0
        }
        Some(priority) => {
            let span = v.span(source, priority);
            v.report(
                codes::DATA_SCHEMA,
                source,
                span,
                String::from("a priority must be a number from -10^15 to 10^15"),
                "this priority",
                Some(String::from(
                    "higher priorities sort first where a policy orders by them; `.nan` and `.inf` order nothing",
                )),
            );
            0.0
        }
    };
    Some(Provider {
        id: p.id.value.clone(),
        name: p
            .name
            .as_ref()
            .map_or_else(|| p.id.value.clone(), |name| name.value.clone()),
        aliases: p.aliases.iter().map(|alias| alias.value.clone()).collect(),
        format,
        endpoints,
        base_url: p.base_url.value.trim_end_matches('/').to_string(),
        priority,
        listed,
        capacity,
        credentials,
        attributes,
        at: at(v, source, &p.id),
    })
}

/// How a closed set of names is spoken of when a catalog writes another.
struct NameSet<'a> {
    names: &'a [&'a str],
    /// What the set holds, with its article: "a wire format".
    noun: &'a str,
    label: &'a str,
    /// The help when no name is close.
    otherwise: &'a str,
}

/// A name of `set`, as `parse` reads it; another is reported with the
/// closest name of the set.
fn known_name<T>(
    v: &mut Validator<'_>,
    source: SourceId,
    written: &Spanned<String>,
    parse: impl Fn(&str) -> Option<T>,
    set: NameSet<'_>,
) -> Option<T> {
    let parsed = parse(&written.value);
    if parsed.is_none() {
        let span = v.span(source, written);
        let help = suggest(&written.value, set.names.iter().copied()).map_or_else(
            || set.otherwise.to_string(),
            |close| format!("did you mean {close}?"),
        );
        v.report(
            codes::DATA_SCHEMA,
            source,
            span,
            format!("`{}` is not {}", written.value, set.noun),
            set.label,
            Some(help),
        );
    }
    parsed
}

fn wire_format(
    v: &mut Validator<'_>,
    source: SourceId,
    written: &Spanned<String>,
) -> Option<WireFormat> {
    let set = NameSet {
        names: &WireFormat::NAMES,
        noun: "a wire format",
        label: "unknown format",
        otherwise: "a provider speaks `openai` or `anthropic`",
    };
    known_name(v, source, written, WireFormat::parse, set)
}

/// The endpoints a provider serves: every one of its format unless the
/// catalog names them. An unknown name is reported and left out.
fn served_endpoints(
    v: &mut Validator<'_>,
    source: SourceId,
    format: WireFormat,
    written: Option<&Spanned<Vec<Spanned<String>>>>,
) -> Vec<Endpoint> {
    let Some(written) = written else {
        return Endpoint::ALL
            .into_iter()
            .filter(|endpoint| endpoint.wire() == format)
            .collect();
    };
    if written.value.is_empty() {
        let span = v.span(source, written);
        v.report(
            codes::DATA_SCHEMA,
            source,
            span,
            String::from("a provider must serve at least one endpoint"),
            "no endpoint",
            Some(String::from(
                "leave `endpoints` out for every endpoint of the provider's format",
            )),
        );
    }
    let names = Endpoint::ALL.map(Endpoint::name);
    let otherwise = format!("the endpoints are {}", names.join(", "));
    let named: Vec<Endpoint> = written
        .value
        .iter()
        .filter_map(|name| {
            let set = NameSet {
                names: &names,
                noun: "an endpoint",
                label: "unknown endpoint",
                otherwise: &otherwise,
            };
            known_name(v, source, name, Endpoint::parse, set)
        })
        .collect();
    Endpoint::ALL
        .into_iter()
        .filter(|endpoint| named.contains(endpoint))
        .collect()
}

/// A base URL must be a plain http(s) URL with a host, with no credentials
/// in it and nothing after its path.
fn check_base_url(v: &mut Validator<'_>, source: SourceId, base_url: &Spanned<String>) {
    let span = v.span(source, base_url);
    let text = base_url.value.as_str();
    let Some(rest) = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
    else {
        v.report(
            codes::DATA_SCHEMA,
            source,
            span,
            String::from("`base_url` must start with `http://` or `https://`"),
            "not an HTTP URL",
            Some(String::from(
                "write the provider's API root, as in `https://api.example.com/v1`",
            )),
        );
        return;
    };
    if text.contains("${") {
        v.report(
            codes::DATA_SCHEMA,
            source,
            span,
            String::from("`base_url` does not read environment variables"),
            "not read here",
            Some(String::from(
                "write the URL itself; only a credential's `key` reads `${NAME}`",
            )),
        );
        return;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let query = rest
        .split_once('?')
        .map_or("", |(_, query)| query)
        .to_ascii_lowercase();
    let path = rest.split(['?', '#']).next().unwrap_or("");
    // A query's or fragment's values, however their names are spelled.
    let mut values = rest
        .split_once(['?', '#'])
        .map_or("", |(_, after)| after)
        .split(['&', '#', '=']);
    if authority.contains('@')
        || ["key=", "token=", "secret=", "password="]
            .iter()
            .any(|marker| query.contains(marker))
        || values.any(crate::diagnostics::redact::looks_like_secret)
        || path
            .split('/')
            .any(crate::diagnostics::redact::looks_like_generated_key)
    {
        v.diagnostics
            .push(secret_diagnostic(source, span, "base_url"));
        return;
    }
    let problem = match url::Url::parse(text) {
        // The URL parser passes over them; the endpoint path would not.
        _ if text.chars().any(|c| c.is_whitespace() || c.is_control()) => Some(String::from(
            "`base_url` holds a space or a control character",
        )),
        Err(error) => Some(format!("`base_url` is not a URL: {error}")),
        // `http:///v1` reads as the host `v1`.
        Ok(_) if authority.is_empty() => Some(String::from("`base_url` names no host")),
        Ok(url) if url.port() == Some(0) => Some(String::from(
            "`base_url` names port 0, which no connection can reach",
        )),
        Ok(url) if url.query().is_some() || url.fragment().is_some() => Some(String::from(
            "`base_url` has a query or fragment, which the endpoint path would follow",
        )),
        Ok(_) => None,
    };
    if let Some(message) = problem {
        v.report(
            codes::DATA_SCHEMA,
            source,
            span,
            message,
            "not an API root",
            Some(String::from(
                "write the provider's API root, as in `https://api.example.com/v1`; \
                 the endpoint path (`/chat/completions`, ...) is appended to it",
            )),
        );
    }
}

fn validate_capacity(
    v: &mut Validator<'_>,
    source: SourceId,
    raw: &Spanned<RawCapacity>,
) -> Option<CapacityLimits> {
    let span = v.span(source, raw);
    let c = &raw.value;
    if let Some(concurrent) = &c.concurrent
        && concurrent.value.0 == 0
    {
        let span = v.span(source, concurrent);
        v.report(
            codes::DATA_SCHEMA,
            source,
            span,
            String::from("`concurrent` must be at least 1"),
            "zero",
            Some(String::from(
                "remove the provider's routes to stop using it",
            )),
        );
        return None;
    }
    let window = match (&c.requests, &c.window) {
        (Some(requests), Some(window)) => match super::schema::parse_duration(&window.value) {
            Some(ms) if ms > 0 && requests.value.0 > 0 => Some((requests.value.0, ms)),
            parsed => {
                let (message, span, label) = match parsed {
                    None => (
                        format!(
                            "`window: {}` {}",
                            window.value,
                            super::schema::why_not_a_duration(&window.value)
                        ),
                        v.span(source, window),
                        "this window",
                    ),
                    Some(0) => (
                        String::from("a request window must be longer than zero"),
                        v.span(source, window),
                        "this window",
                    ),
                    Some(_) => (
                        String::from("a request window must allow at least one request"),
                        v.span(source, requests),
                        "no request",
                    ),
                };
                v.report(
                    codes::DATA_SCHEMA,
                    source,
                    span,
                    message,
                    label,
                    Some(String::from(
                        "write it as `requests: 600` with `window: 60s`",
                    )),
                );
                return None;
            }
        },
        (None, None) => None,
        _ => {
            v.report(
                codes::DATA_SCHEMA,
                source,
                span,
                String::from("`requests` and `window` go together"),
                "only one of them is set",
                Some(String::from(
                    "set both, as in `requests: 600` with `window: 60s`, or neither",
                )),
            );
            return None;
        }
    };
    let concurrent = c.concurrent.as_ref().map(|concurrent| concurrent.value.0);
    // `capacity: {}` declares no limit.
    if concurrent.is_none() && window.is_none() {
        return None;
    }
    Some(CapacityLimits { concurrent, window })
}

fn validate_credential(
    v: &mut Validator<'_>,
    source: SourceId,
    raw: &Spanned<RawCredential>,
) -> Option<Credential> {
    let c = &raw.value;
    let key_span = v.span(source, &c.key);
    let env = match env_reference(&c.key.value) {
        Some(env) => env.to_string(),
        None => {
            // Whatever the value is, it does not belong in a data file: never
            // quote it back.
            let mut diagnostic = Diagnostic::new(
                codes::LITERAL_SECRET,
                format!("credential `{}` must reference an environment variable", c.id.value),
            )
            .at(source, key_span, "not a `${NAME}` reference")
            .help("write `key: ${NAME}` and export NAME where switchyard runs; if a real key was written here, rotate it");
            diagnostic.quote_source = false;
            v.diagnostics.push(diagnostic);
            return None;
        }
    };
    let attributes = v.attributes(
        source,
        Subject::Credential,
        &c.attributes,
        (&c.id.value, key_span),
    );
    Some(Credential {
        id: c.id.value.clone(),
        env,
        tenant: c.tenant.as_ref().map(|tenant| tenant.value.clone()),
        attributes,
        at: at(v, source, &c.id),
    })
}

fn validate_model(
    v: &mut Validator<'_>,
    source: SourceId,
    raw: &Spanned<RawModel>,
    providers: &HashMap<&str, usize>,
) -> Option<Model> {
    let m = &raw.value;
    let kind_names = NameSet {
        names: &ModelKind::NAMES,
        noun: "a model kind",
        label: "unknown kind",
        otherwise: "a model is a `chat`, `completion` or `embedding` model",
    };
    let kind = known_name(v, source, &m.kind, ModelKind::parse, kind_names);
    one_route_per_provider(v, source, m);
    let routes = m
        .routes
        .iter()
        .filter_map(|route| validate_route(v, source, &m.id.value, route, providers))
        .collect();
    let attributes = v.attributes(
        source,
        Subject::Model,
        &m.attributes,
        (&m.id.value, v.span(source, &m.id)),
    );
    Some(Model {
        id: m.id.value.clone(),
        kind: kind?,
        aliases: m.aliases.iter().map(|alias| alias.value.clone()).collect(),
        attributes,
        routes,
        at: at(v, source, &m.id),
    })
}

/// A model's routes name different providers: a pin (`provider/model`)
/// names a route by them, and a second route to one provider would only
/// spend an attempt on it again.
fn one_route_per_provider(v: &mut Validator<'_>, source: SourceId, model: &RawModel) {
    let mut seen: HashMap<&str, Span> = HashMap::default();
    for route in &model.routes {
        let provider = &route.value.provider;
        let span = v.span(source, provider);
        match seen.get(provider.value.as_str()) {
            Some(first) => {
                let first = *first;
                v.diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_ID,
                        format!(
                            "model `{}` has two routes to provider `{}`",
                            model.id.value, provider.value
                        ),
                    )
                    .at(source, span, "routed again here")
                    .also(source, first, "first routed here")
                    .help(
                        "a model has one route per provider (pins name a route by its \
                         provider); remove one",
                    ),
                );
            }
            None => {
                seen.insert(&provider.value, span);
            }
        }
    }
}

fn validate_route(
    v: &mut Validator<'_>,
    source: SourceId,
    model_id: &str,
    raw: &Spanned<RawRoute>,
    providers: &HashMap<&str, usize>,
) -> Option<Route> {
    let r = &raw.value;
    let Some(&provider) = providers.get(r.provider.value.as_str()) else {
        let span = v.span(source, &r.provider);
        let help = suggest(&r.provider.value, providers.keys().copied())
            .map(|close| format!("did you mean {close}?"))
            .unwrap_or_else(|| String::from("a route names a provider by its `id`"));
        v.report(
            codes::UNKNOWN_REFERENCE,
            source,
            span,
            format!("no provider has the id `{}`", r.provider.value),
            "unknown provider",
            Some(help),
        );
        return None;
    };
    let price = r
        .price
        .as_ref()
        .map(|price| validate_price(v, source, price))
        .unwrap_or_default();
    let attributes = v.attributes(
        source,
        Subject::Route,
        &r.attributes,
        (
            &format_args!("{model_id} via {}", r.provider.value),
            v.span(source, &r.provider),
        ),
    );
    Some(Route {
        provider,
        upstream_model: r
            .upstream
            .as_ref()
            .map_or_else(|| model_id.to_string(), |upstream| upstream.value.clone()),
        price,
        capabilities: r.capabilities.iter().map(|c| c.value.clone()).collect(),
        attributes,
        at: at(v, source, &r.provider),
    })
}

/// The largest number a catalog's priorities and prices may hold, as the
/// policy language's own numbers (beyond it, whole numbers lose their
/// exactness).
const MAX_NUMBER: f64 = 1e15;

fn validate_price(v: &mut Validator<'_>, source: SourceId, raw: &Spanned<RawPrice>) -> Price {
    let mut check = |field: &Option<Spanned<Plain<f64>>>| -> Option<f64> {
        let value = field.as_ref()?;
        let Plain(price) = value.value;
        if price.is_finite() && (0.0..=MAX_NUMBER).contains(&price) {
            Some(price)
        } else {
            let span = v.span(source, value);
            v.report(
                codes::DATA_SCHEMA,
                source,
                span,
                String::from("a price must be a number from 0 to 10^15"),
                "this price",
                Some(String::from("prices are USD per million tokens")),
            );
            None
        }
    };
    let p = &raw.value;
    Price {
        input: check(&p.input),
        output: check(&p.output),
        cache_read: check(&p.cache_read),
        cache_write: check(&p.cache_write),
    }
}

fn validate_aliases(
    v: &mut Validator<'_>,
    source: SourceId,
    raw: &RawCatalog,
    models: &[Model],
) -> Vec<Alias> {
    let mut taken: HashMap<String, Span> = HashMap::default();
    for model in &raw.models {
        taken.insert(
            model.value.id.value.clone(),
            v.span(source, &model.value.id),
        );
    }
    let mut aliases = Vec::new();
    let model_index = |id: &str| models.iter().position(|model| model.id == id);

    let mut claim = |v: &mut Validator<'_>, name: &Spanned<String>| -> bool {
        let span = v.span(source, name);
        if let Some(first) = taken.get(&name.value) {
            let first = *first;
            v.diagnostics.push(
                Diagnostic::new(
                    codes::DUPLICATE_ID,
                    format!("`{}` already names a model", name.value),
                )
                .at(source, span, "used again here")
                .also(source, first, "first used here")
                .help("model ids and aliases share one namespace"),
            );
            false
        } else {
            taken.insert(name.value.clone(), span);
            true
        }
    };

    for model in &raw.models {
        for alias in &model.value.aliases {
            if claim(v, alias)
                && let Some(target) = model_index(&model.value.id.value)
            {
                aliases.push(Alias {
                    name: alias.value.clone(),
                    targets: vec![target],
                    at: at(v, source, alias),
                });
            }
        }
    }
    for (name, target) in &raw.aliases.0 {
        if !claim(v, name) {
            continue;
        }
        let items: Vec<(String, Span)> = match &target.value {
            RawValue::String(id) => vec![(id.clone(), v.span(source, target))],
            RawValue::List(list) => list
                .iter()
                .filter_map(|item| match &item.value {
                    RawValue::String(id) => Some((id.clone(), v.span(source, item))),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        if items.is_empty() {
            let span = v.span(source, target);
            v.report(
                codes::DATA_SCHEMA,
                source,
                span,
                format!(
                    "alias `{}` must name a model id or a list of model ids",
                    name.value
                ),
                "not a model id",
                Some(String::from(
                    "write `ALIAS: model-id`, or `ALIAS: [model-id, ...]` for several in order",
                )),
            );
            continue;
        }
        let mut targets = Vec::new();
        for (id, span) in items {
            match model_index(&id) {
                Some(index) => targets.push(index),
                None => {
                    let help = suggest(&id, models.iter().map(|m| m.id.as_str()))
                        .map(|close| format!("did you mean {close}?"))
                        .or_else(|| Some(String::from(UNKNOWN_MODEL_HELP)));
                    v.report(
                        codes::UNKNOWN_REFERENCE,
                        source,
                        span,
                        format!("no model has the id `{id}`"),
                        "unknown model",
                        help,
                    );
                }
            }
        }
        aliases.push(Alias {
            name: name.value.clone(),
            targets,
            at: at(v, source, name),
        });
    }
    aliases
}
