//! `GET /v1/models`: the models a key may call, as the policy decides.

use crate::compile::Snapshot;
use crate::data::{Model, ModelKind, WireFormat};
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
pub fn list(
    snapshot: &Snapshot,
    caller: Caller,
    wire: WireFormat,
    health: &dyn HealthView,
) -> Json {
    let entries: Vec<Json> = snapshot
        .data
        .catalog
        .models
        .iter()
        .enumerate()
        .filter_map(|(index, model)| entry(snapshot, caller, wire, health, (index, model)))
        .collect();
    match wire {
        WireFormat::OpenAi => json!({ "object": "list", "data": entries }),
        WireFormat::Anthropic => {
            let first = entries.first().and_then(|e| e.get("id")).cloned();
            let last = entries.last().and_then(|e| e.get("id")).cloned();
            json!({ "data": entries, "has_more": false, "first_id": first, "last_id": last })
        }
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
