//! `GET /v1/models`: the models a key may call, as the policy decides.

use crate::compile::Snapshot;
use crate::data::{Model, ModelKind, WireFormat};
use crate::diagnostics::redact::redact;
use crate::evaluate::health::{HealthView, Healthy};
use crate::evaluate::{Caller, Endpoint, RequestContext, evaluate};
use serde_json::{Map, Value as Json, json};

/// Endpoints a model of this kind may be called on, in the order tried.
/// Every one, whatever the listing's own wire format: the list is what the
/// key may call, and a model reached only through `/v1/messages` is one.
fn endpoints(kind: ModelKind) -> &'static [Endpoint] {
    match kind {
        ModelKind::Chat => &[
            Endpoint::ChatCompletions,
            Endpoint::Messages,
            Endpoint::Responses,
        ],
        ModelKind::Completion => &[Endpoint::Completions],
        ModelKind::Embedding => &[Endpoint::Embeddings],
    }
}

/// Every catalog model for which some endpoint of its kind gets a plan for
/// this caller with a candidate of that model (not only of models the
/// policy adds after it), once, with the policy's `listing` fields. Which models are
/// listed does not depend on health (a paused provider is still one the key
/// may call); the listing fields describe the plan under `health` as it is
/// now (say, the provider that would answer first), or under full health
/// when the current state leaves no plan.
///
/// OpenAI's list is whole. Anthropic's comes a page at a time, as its API
/// sends it: `page` says which; a page that cannot be given is `Err` with
/// what is wrong.
pub fn list(
    snapshot: &Snapshot,
    caller: Caller,
    wire: WireFormat,
    health: &dyn HealthView,
    page: &Page,
) -> Result<Json, String> {
    let entries: Vec<Json> = snapshot
        .data
        .catalog
        .models
        .iter()
        .enumerate()
        .filter_map(|(index, model)| entry(snapshot, caller, wire, health, (index, model)))
        .collect();
    Ok(match wire {
        WireFormat::OpenAi => json!({ "object": "list", "data": entries }),
        WireFormat::Anthropic => {
            let (entries, has_more) = page.of(entries)?;
            let first = entries.first().and_then(|e| e.get("id")).cloned();
            let last = entries.last().and_then(|e| e.get("id")).cloned();
            json!({ "data": entries, "has_more": has_more, "first_id": first, "last_id": last })
        }
    })
}

/// Which part of Anthropic's model list a request asks for: `limit` entries
/// (1 to 1,000; 20 unless it says) after the model `after_id` or before the
/// model `before_id`, or from the start.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    limit: usize,
    after_id: Option<String>,
    before_id: Option<String>,
}

impl Default for Page {
    fn default() -> Page {
        Page {
            limit: Page::DEFAULT_LIMIT,
            after_id: None,
            before_id: None,
        }
    }
}

impl Page {
    const DEFAULT_LIMIT: usize = 20;
    const MAX_LIMIT: usize = 1_000;

    /// The page a query string asks for (its values already decoded);
    /// other parameters are not this list's and are passed over.
    pub fn from_query<'a>(
        parameters: impl Iterator<Item = (&'a str, String)>,
    ) -> Result<Page, String> {
        let mut page = Page::default();
        for (name, value) in parameters {
            match name {
                "limit" => {
                    page.limit = value
                        .parse()
                        .ok()
                        .filter(|limit| (1..=Page::MAX_LIMIT).contains(limit))
                        .ok_or_else(|| {
                            format!(
                                "`limit` must be a whole number from 1 to {}",
                                Page::MAX_LIMIT
                            )
                        })?;
                }
                "after_id" => page.after_id = Some(value),
                "before_id" => page.before_id = Some(value),
                _ => {}
            }
        }
        if page.after_id.is_some() && page.before_id.is_some() {
            return Err(String::from("give `after_id` or `before_id`, not both"));
        }
        Ok(page)
    }

    /// This page of `entries`, and whether more lie beyond it in the
    /// direction it was asked for.
    fn of(&self, mut entries: Vec<Json>) -> Result<(Vec<Json>, bool), String> {
        let position = |id: &str| {
            entries
                .iter()
                .position(|entry| entry.get("id").and_then(Json::as_str) == Some(id))
                .ok_or_else(|| format!("`{}` is no model of this list", redact(id)))
        };
        if let Some(before) = &self.before_id {
            let end = position(before)?;
            let start = end.saturating_sub(self.limit);
            entries.truncate(end);
            return Ok((entries.split_off(start), start > 0));
        }
        let start = match &self.after_id {
            Some(after) => position(after)? + 1,
            None => 0,
        };
        let mut page = entries.split_off(start.min(entries.len()));
        let has_more = page.len() > self.limit;
        page.truncate(self.limit);
        Ok((page, has_more))
    }
}

/// `GET /v1/models/{id}`: the list's entry for the catalog model `id`;
/// `None` when there is none or this key may not call it.
pub fn one(
    snapshot: &Snapshot,
    caller: Caller,
    wire: WireFormat,
    health: &dyn HealthView,
    id: &str,
) -> Option<Json> {
    let model = snapshot
        .data
        .catalog
        .models
        .iter()
        .enumerate()
        .find(|(_, model)| model.id == id)?;
    entry(snapshot, caller, wire, health, model)
}

/// A model's entry in the list, when some endpoint of its kind gets a plan.
fn entry(
    snapshot: &Snapshot,
    caller: Caller,
    wire: WireFormat,
    health: &dyn HealthView,
    (index, model): (usize, &Model),
) -> Option<Json> {
    // One id for every listing's decisions, so a listing of many models
    // allocates none per decision.
    static LISTING_ID: std::sync::LazyLock<std::sync::Arc<str>> =
        std::sync::LazyLock::new(|| std::sync::Arc::from("models"));
    let body = json!({ "model": model.id });
    let context = |endpoint: Endpoint| RequestContext {
        id: LISTING_ID.clone(),
        endpoint,
        body: Ok(&body),
        body_bytes: 0,
        headers: &[],
        caller,
        seed: 0,
        rotation: &0,
    };
    // A plan for it whose candidates serve it: a policy may add other
    // models after the one asked for (fallbacks), which say nothing of it.
    let serves_it = |plan: &crate::evaluate::Plan| {
        plan.candidates
            .iter()
            .any(|candidate| candidate.model == Some(index))
    };
    let (endpoint, healthy_plan) = endpoints(model.kind).iter().find_map(|endpoint| {
        let plan = evaluate(snapshot, &context(*endpoint), &Healthy)
            .result
            .ok()
            .filter(serves_it)?;
        Some((*endpoint, plan))
    })?;
    let (plan, health) = match evaluate(snapshot, &context(endpoint), health)
        .result
        .ok()
        .filter(serves_it)
    {
        Some(plan) => (plan, health),
        None => (healthy_plan, &Healthy as &dyn HealthView),
    };
    let mut entry = Map::new();
    entry.insert(String::from("id"), json!(model.id));
    match wire {
        WireFormat::OpenAi => {
            entry.insert(String::from("object"), json!("model"));
            entry.insert(String::from("created"), json!(0));
            entry.insert(String::from("owned_by"), json!("switchyard"));
        }
        WireFormat::Anthropic => {
            entry.insert(String::from("type"), json!("model"));
            entry.insert(String::from("display_name"), json!(model.id));
            entry.insert(String::from("created_at"), json!("1970-01-01T00:00:00Z"));
        }
    }
    for (name, value) in plan.listing(snapshot, health) {
        entry.insert(name, value.to_json());
    }
    Some(Json::Object(entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(query: &[(&'static str, &str)]) -> Result<Page, String> {
        Page::from_query(query.iter().map(|(name, value)| (*name, value.to_string())))
    }

    fn ids(query: &[(&'static str, &str)], count: usize) -> Result<(Vec<String>, bool), String> {
        let entries = (0..count).map(|n| json!({"id": format!("m{n}")})).collect();
        let (entries, has_more) = page(query)?.of(entries)?;
        let ids = entries
            .iter()
            .map(|entry| entry["id"].as_str().unwrap_or_default().to_string())
            .collect();
        Ok((ids, has_more))
    }

    #[test]
    fn anthropic_pages_go_forward_from_the_start_or_an_id() {
        let listed = |query, count| ids(query, count).expect("a page");
        assert_eq!(
            listed(&[], 3),
            (vec!["m0".into(), "m1".into(), "m2".into()], false)
        );
        assert_eq!(listed(&[], 25).0.len(), 20, "20 unless the request says");
        assert_eq!(
            listed(&[("limit", "2")], 3),
            (vec!["m0".into(), "m1".into()], true)
        );
        assert_eq!(
            listed(&[("limit", "2"), ("after_id", "m1")], 3),
            (vec!["m2".into()], false)
        );
        assert_eq!(listed(&[("after_id", "m2")], 3), (vec![], false));
    }

    #[test]
    fn anthropic_pages_go_back_before_an_id() {
        let listed = |query, count| ids(query, count).expect("a page");
        assert_eq!(
            listed(&[("limit", "2"), ("before_id", "m3")], 4),
            (vec!["m1".into(), "m2".into()], true)
        );
        assert_eq!(
            listed(&[("before_id", "m1")], 4),
            (vec!["m0".into()], false)
        );
        assert_eq!(listed(&[("before_id", "m0")], 4), (vec![], false));
    }

    #[test]
    fn a_page_that_cannot_be_given_says_why() {
        for limit in ["0", "1001", "-1", "2.5", "ten", ""] {
            assert!(page(&[("limit", limit)]).is_err(), "{limit}");
        }
        assert!(page(&[("after_id", "a"), ("before_id", "b")]).is_err());
        let unknown = ids(
            &[("after_id", "sk-ant-api03-abcdefghijklmnopqrstuvwxyz")],
            2,
        );
        let problem = unknown.expect_err("an id the list does not have");
        assert!(!problem.contains("abcdefghijklmnop"), "{problem}");
        assert_eq!(page(&[("beta", "true")]), Ok(Page::default()));
    }
}
