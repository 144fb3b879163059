//! From requested model ids to candidates: pins, model ids, aliases and the
//! fallback tiers for unknown ids; then one candidate per route and usable
//! credential, as `credentials` says.

use super::health::CandidateHealth;
use super::machine::{Focus, Machine};
use super::order::{first_by_keys, sort_by_keys};
use super::{Candidate, RequestState, Requested, ResolutionKind};
use crate::compile::{ModelName, Snapshot};
use crate::diagnostics::redact::redact;
use crate::language::ast::PinTarget;
use crate::language::ir::{CredentialSpec, ErrorRef, Read, SortKeySpec, TermKind};
use crate::value::Value;
use std::borrow::Cow;
use std::sync::Arc;

/// Why no candidate came out: the error, and what was wrong (for the trace).
#[derive(Debug, Clone, PartialEq)]
pub struct Unresolved {
    pub error: ErrorRef,
    pub detail: String,
}

/// A route of a model that a requested id resolved to, before credentials.
struct RouteChoice {
    model: Option<usize>,
    route: Option<usize>,
    provider: usize,
    /// `Some` when a pin names one credential.
    credential: Option<usize>,
    requested: Requested,
    /// The route's first credential's row of precomputed parts.
    static_row: Option<usize>,
}

/// Calls `each` with the requested ids, in order: each `from` source's
/// string or list items, with what the catalog names so when that is
/// already known (`model_named`, for the body's `model`); stops at the
/// first error it returns.
fn for_each_requested_id<'s, E>(
    snapshot: &Snapshot,
    request: &RequestState,
    model_named: Option<&'s ModelName>,
    mut each: impl FnMut(&Arc<str>, Option<Option<&'s ModelName>>) -> Result<(), E>,
) -> Result<(), E> {
    // Made for the first source that needs one: the usual only source, the
    // body's `model`, is the request's own.
    let mut machine: Option<Machine<'_>> = None;
    for source in &snapshot.program.models.sources {
        if let TermKind::Read(Read::RequestModel) = source.kind {
            // An empty id (a body without `model`) requests nothing.
            if !request.model.is_empty() {
                each(&request.model, Some(model_named))?;
            }
            continue;
        }
        let machine = machine.get_or_insert_with(|| Machine::new(snapshot, request, &[], &[]));
        match &*machine.eval_ref(source, &Focus::default()) {
            Value::String(id) if !id.is_empty() => each(id, None)?,
            Value::List(items) => {
                for item in items.iter() {
                    if let Value::String(id) = item
                        && !id.is_empty()
                    {
                        each(id, None)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

const USUAL_CANDIDATES: usize = 8;

/// The candidates for the requested ids; `model_named` is what the
/// catalog names the body's `model`, as the request already looked it up.
pub fn resolve(
    snapshot: &Snapshot,
    request: &RequestState,
    model_named: Option<&ModelName>,
) -> Result<Vec<Candidate>, Unresolved> {
    let models = &snapshot.program.models;
    // The id is the client's: one shaped like an API key is masked, as
    // everywhere it is shown.
    let unknown = |id: &str| Unresolved {
        error: models.unknown_error,
        detail: if id.is_empty() {
            String::from("the request names no model")
        } else {
            format!("`{}` names no model", redact(id))
        },
    };
    // Each route an id resolves to goes straight to its credentials, with no
    // list of routes in between.
    // Room for the usual handful of candidates, so the vector seldom grows.
    let mut candidates: Vec<Candidate> = Vec::with_capacity(USUAL_CANDIDATES);
    let mut any_id = false;
    let mut position = 0usize;
    for_each_requested_id(snapshot, request, model_named, |id, named| {
        any_id = true;
        let mut routes = 0usize;
        let mut choose = |choice: RouteChoice| {
            routes += 1;
            with_credentials(snapshot, request, choice, &mut candidates);
        };
        if !resolve_pin(
            snapshot,
            id,
            request.caller.tenant,
            &mut position,
            &mut choose,
        )? && !resolve_name(snapshot, id, named, &mut position, &mut choose)
        {
            resolve_unknown(snapshot, request, id, &mut position, &mut choose);
        }
        if routes == 0 {
            return Err(unknown(id));
        }
        Ok(())
    })?;
    if !any_id {
        return Err(unknown(""));
    }
    if candidates.is_empty() {
        return Err(Unresolved {
            error: models.credentials_error,
            detail: String::from("no route of the model has a usable credential"),
        });
    }
    Ok(candidates)
}

/// `text.split_once(separator)`. A pin's separator is usually one ASCII
/// character (`/`, `:`), and a `str` pattern sets up a two-way searcher
/// per call: that set-up was 13 % of a decision that asks two ids of a
/// pin template. A `char` pattern searches with `memchr` instead.
fn split_at_separator<'a>(text: &'a str, separator: &str) -> Option<(&'a str, &'a str)> {
    match separator.as_bytes() {
        // A one-byte `str` is ASCII, so the byte is the whole character.
        [byte] => text.split_once(char::from(*byte)),
        _ => text.split_once(separator),
    }
}

/// What a pinned id names.
pub(crate) struct Pinned<'s, 'i> {
    /// The providers the pin names (one, for a credential pin); borrowed
    /// from the snapshot for a provider pin: every pinned request asks,
    /// for its settings and its candidates.
    pub providers: Cow<'s, [usize]>,
    /// The credential a credential pin names.
    pub credential: Option<usize>,
    /// The model part of the id.
    pub model_id: &'i str,
}

/// The first pin template `id` matches, naming a provider or credential;
/// asked by a caller of `tenant`. A credential pin names only a credential
/// that caller may use, the platform's or its own tenant's: another
/// tenant's is as unknown to it as one that does not exist, so that its
/// answer does not tell it one exists.
pub(crate) fn match_pin<'s, 'i>(
    snapshot: &'s Snapshot,
    id: &'i str,
    tenant: usize,
) -> Option<Pinned<'s, 'i>> {
    snapshot.program.models.pins.iter().find_map(|pin| {
        let rest = id.strip_prefix(pin.prefix.as_str())?;
        let (target, model_id) = split_at_separator(rest, &pin.separator)?;
        let (providers, credential) = match pin.target {
            PinTarget::Provider => (Cow::Borrowed(snapshot.providers_named(target)), None),
            PinTarget::Credential => {
                let (provider, credential) =
                    snapshot
                        .credential_with_id(target)
                        .filter(|(provider, credential)| {
                            snapshot.credential_usable_by(*provider, *credential, tenant)
                        })?;
                (Cow::Owned(vec![provider]), Some(credential))
            }
        };
        (!providers.is_empty()).then_some(Pinned {
            providers,
            credential,
            model_id,
        })
    })
}

/// Tries the pin templates; `Ok(false)` when the id is not a pin.
fn resolve_pin(
    snapshot: &Snapshot,
    id: &Arc<str>,
    tenant: usize,
    position: &mut usize,
    choose: &mut impl FnMut(RouteChoice),
) -> Result<bool, Unresolved> {
    let Some(Pinned {
        providers,
        credential,
        model_id,
    }) = match_pin(snapshot, id, tenant)
    else {
        return Ok(false);
    };
    let models: &[usize] = match snapshot.model_named(model_id) {
        Some(ModelName::Model(model)) => std::slice::from_ref(model),
        Some(ModelName::Alias(models)) => models,
        None => &[],
    };
    for &model in models {
        let requested = Requested {
            index: *position,
            kind: ResolutionKind::Pin,
            id: id.clone(),
        };
        for entry in snapshot.routes_of(model) {
            if providers.contains(&entry.provider) {
                choose(route_choice(
                    snapshot,
                    model,
                    entry.route,
                    entry.provider,
                    credential,
                    requested.clone(),
                ));
            }
        }
        *position += 1;
    }
    Ok(true)
}

/// A model id or alias (`named`, when already looked up); `false` when
/// the catalog has no such name.
fn resolve_name(
    snapshot: &Snapshot,
    id: &Arc<str>,
    named: Option<Option<&ModelName>>,
    position: &mut usize,
    choose: &mut impl FnMut(RouteChoice),
) -> bool {
    // The snapshot's own list of models: none is built per request.
    let named = named.unwrap_or_else(|| snapshot.model_named(id));
    let (models, kind) = match named {
        Some(ModelName::Model(model)) => {
            let is_alias = snapshot
                .data
                .catalog
                .models
                .get(*model)
                .is_some_and(|m| *m.id != **id);
            (
                std::slice::from_ref(model),
                if is_alias {
                    ResolutionKind::Alias
                } else {
                    ResolutionKind::Bare
                },
            )
        }
        Some(ModelName::Alias(models)) => (models.as_slice(), ResolutionKind::Alias),
        None => return false,
    };
    for &model in models {
        let requested = Requested {
            index: *position,
            kind,
            id: id.clone(),
        };
        // The last route takes `requested` itself.
        if let Some((last, others)) = snapshot.routes_of(model).split_last() {
            for entry in others {
                choose(route_choice(
                    snapshot,
                    model,
                    entry.route,
                    entry.provider,
                    None,
                    requested.clone(),
                ));
            }
            choose(route_choice(
                snapshot,
                model,
                last.route,
                last.provider,
                None,
                requested,
            ));
        }
        *position += 1;
    }
    true
}

impl RouteChoice {
    /// The candidate for one of the route's credentials.
    fn candidate(&self, snapshot: &Snapshot, credential: usize) -> Candidate {
        Candidate {
            model: self.model,
            route: self.route,
            provider: self.provider,
            credential,
            requested: self.requested.clone(),
            static_row: self
                .static_row
                .map(|first| snapshot.statics.credential_row(first, credential)),
        }
    }

    /// The route's last (usually only) candidate, which takes the choice's
    /// shared names instead of counting another reference to each.
    fn into_candidate(self, snapshot: &Snapshot, credential: usize) -> Candidate {
        Candidate {
            model: self.model,
            route: self.route,
            provider: self.provider,
            credential,
            requested: self.requested,
            static_row: self
                .static_row
                .map(|first| snapshot.statics.credential_row(first, credential)),
        }
    }
}

fn route_choice(
    snapshot: &Snapshot,
    model: usize,
    route: usize,
    provider: usize,
    credential: Option<usize>,
    requested: Requested,
) -> RouteChoice {
    RouteChoice {
        model: Some(model),
        route: Some(route),
        provider,
        credential,
        requested,
        static_row: snapshot.statics.row(Some(model), Some(route), 0),
    }
}

/// The longest id an `unknown serve` tier passes on. Model ids are short;
/// the proxy keeps health state per route, and an unknown id's route is
/// keyed by the id as sent, so a longer one is not served: it gets the
/// unknown error.
pub const MAX_UNKNOWN_ID_BYTES: usize = 256;

/// The `unknown serve` tiers: the first provider of the first tier whose
/// condition holds serves the id as its upstream model name.
fn resolve_unknown(
    snapshot: &Snapshot,
    request: &RequestState,
    id: &Arc<str>,
    position: &mut usize,
    choose: &mut impl FnMut(RouteChoice),
) {
    if id.len() > MAX_UNKNOWN_ID_BYTES {
        return;
    }
    let providers: Vec<Candidate> = (0..snapshot.data.catalog.providers.len())
        .map(|provider| Candidate {
            model: None,
            route: None,
            provider,
            credential: 0,
            requested: Requested {
                index: *position,
                kind: ResolutionKind::Unknown,
                id: id.clone(),
            },
            static_row: None,
        })
        .collect();
    let health = vec![CandidateHealth::default(); providers.len()];
    for tier in &snapshot.program.models.unknown_serve {
        let mut machine = Machine::new(snapshot, request, &providers, &health);
        let mut matching: Vec<usize> = (0..providers.len())
            .filter(|index| machine.truth(&tier.condition, &Focus::on(*index)))
            .collect();
        if matching.is_empty() {
            continue;
        }
        sort_by_keys(&mut machine, &mut matching, &tier.keys);
        if let Some(chosen) = matching.first().and_then(|index| providers.get(*index)) {
            choose(RouteChoice {
                model: None,
                route: None,
                provider: chosen.provider,
                credential: None,
                requested: chosen.requested.clone(),
                static_row: None,
            });
            *position += 1;
            return;
        }
    }
}

/// Adds the candidates of one route: one per usable credential, or the best
/// one; a candidate already there is not added again.
fn with_credentials(
    snapshot: &Snapshot,
    request: &RequestState,
    choice: RouteChoice,
    candidates: &mut Vec<Candidate>,
) {
    let Some(provider) = snapshot.provider(choice.provider) else {
        return;
    };
    let (only, provider_index) = (choice.credential, choice.provider);
    let usable = (0..provider.credentials.len())
        .filter(move |index| only.is_none_or(|only| only == *index))
        .filter(|index| {
            snapshot.credential_usable_by(provider_index, *index, request.caller.tenant)
        })
        .filter(move |index| snapshot.secret(provider_index, *index).is_some());
    // A model's routes are distinct, and so are a route's credentials:
    // only a model visited again (an id or alias repeating it, a pin and a
    // name for it) can repeat a candidate, and the first visit is at
    // position 0.
    let may_repeat = choice.requested.index > 0;
    let mut add = |candidate: Candidate| {
        // Ids the catalog does not know have no model or route: the id
        // itself, sent upstream as it is, tells them apart.
        let duplicate = may_repeat
            && candidates.iter().any(|c| {
                c.model == candidate.model
                    && c.route == candidate.route
                    && c.provider == candidate.provider
                    && c.credential == candidate.credential
                    && (c.model.is_some() || c.requested.id == candidate.requested.id)
            });
        if !duplicate {
            candidates.push(candidate);
        }
    };
    let mut usable = usable.peekable();
    match &snapshot.program.models.credentials {
        CredentialSpec::Each => {
            while let Some(credential) = usable.next() {
                if usable.peek().is_none() {
                    add(choice.into_candidate(snapshot, credential));
                    break;
                }
                add(choice.candidate(snapshot, credential));
            }
        }
        CredentialSpec::One(keys) => {
            // Usually one credential is usable: it needs no list and no sort.
            match (usable.next(), usable.next()) {
                (None, _) => {}
                (Some(only), None) => add(choice.into_candidate(snapshot, only)),
                (Some(first), Some(second)) => {
                    let all = [first, second]
                        .into_iter()
                        .chain(usable)
                        .map(|credential| choice.candidate(snapshot, credential))
                        .collect();
                    if let Some(best) = best_credential(snapshot, request, all, keys) {
                        add(best);
                    }
                }
            }
        }
    }
}

fn best_credential(
    snapshot: &Snapshot,
    request: &RequestState,
    mut candidates: Vec<Candidate>,
    keys: &[SortKeySpec],
) -> Option<Candidate> {
    // No health is known while candidates are resolved: every read of it
    // is its default, as for a candidate without a record.
    let mut machine = Machine::new(snapshot, request, &candidates, &[]);
    let best = first_by_keys(&mut machine, 0..candidates.len(), keys)?;
    drop(machine);
    (best < candidates.len()).then(|| candidates.swap_remove(best))
}

#[cfg(test)]
mod tests {
    use super::split_at_separator;

    #[test]
    fn splitting_at_a_separator_agrees_with_split_once() {
        let texts = [
            "openai/gpt-4o",
            "a/b/c",
            "/model",
            "provider/",
            "no-separator",
            "",
            "bedrock::claude::v2",
            "ümlaut/ß",
            "x→y",
        ];
        let separators = ["/", ":", "::", "→", "/b/"];
        for text in texts {
            for separator in separators {
                assert_eq!(
                    split_at_separator(text, separator),
                    text.split_once(separator),
                    "{text:?} at {separator:?}"
                );
            }
        }
    }
}
