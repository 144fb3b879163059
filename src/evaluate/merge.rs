//! Merging a request's value with a default, as `merge` declares.

use crate::language::ast::MergeOp;
use crate::value::Value;
use std::cmp::Ordering;
use std::sync::Arc;

/// `op(request, default)`; an absent side counts as "not set".
pub fn combine(op: MergeOp, request: &Value, default: &Value) -> Value {
    match (request.is_null(), default.is_null()) {
        (true, true) => return Value::Null,
        (true, false) => return default.clone(),
        (false, true) => return request.clone(),
        (false, false) => {}
    }
    match op {
        MergeOp::Intersect => {
            let kept: Vec<Value> = request
                .items()
                .iter()
                .filter(|item| default.items().contains(item))
                .cloned()
                .collect();
            Value::List(Arc::from(kept))
        }
        MergeOp::Union => {
            let mut items: Vec<Value> = request.items().to_vec();
            for item in default.items() {
                if !items.contains(item) {
                    items.push(item.clone());
                }
            }
            Value::List(Arc::from(items))
        }
        MergeOp::Min => match request.compare(default) {
            Some(Ordering::Greater) => default.clone(),
            _ => request.clone(),
        },
        MergeOp::Max => match request.compare(default) {
            Some(Ordering::Less) => default.clone(),
            _ => request.clone(),
        },
        MergeOp::All => Value::Bool(
            matches!(request, Value::Bool(true)) && matches!(default, Value::Bool(true)),
        ),
        MergeOp::Any => Value::Bool(
            matches!(request, Value::Bool(true)) || matches!(default, Value::Bool(true)),
        ),
        MergeOp::First => request.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Value {
        Value::List(items.iter().map(|s| Value::string(s)).collect())
    }

    #[test]
    fn absent_sides_are_not_set() {
        assert_eq!(
            combine(MergeOp::Min, &Value::Null, &Value::Number(3.0)),
            Value::Number(3.0)
        );
        assert_eq!(
            combine(MergeOp::Intersect, &list(&["a"]), &Value::Null),
            list(&["a"])
        );
        assert_eq!(
            combine(MergeOp::First, &Value::Null, &Value::Null),
            Value::Null
        );
    }

    #[test]
    fn operators_combine_as_documented() {
        assert_eq!(
            combine(MergeOp::Intersect, &list(&["a", "b"]), &list(&["b", "c"])),
            list(&["b"])
        );
        assert_eq!(
            combine(MergeOp::Union, &list(&["a", "b"]), &list(&["b", "c"])),
            list(&["a", "b", "c"])
        );
        assert_eq!(
            combine(MergeOp::Min, &Value::Number(5.0), &Value::Number(3.0)),
            Value::Number(3.0)
        );
        assert_eq!(
            combine(MergeOp::Max, &Value::Number(5.0), &Value::Number(3.0)),
            Value::Number(5.0)
        );
        assert_eq!(
            combine(MergeOp::All, &Value::Bool(true), &Value::Bool(false)),
            Value::Bool(false)
        );
        assert_eq!(
            combine(MergeOp::Any, &Value::Bool(false), &Value::Bool(true)),
            Value::Bool(true)
        );
        assert_eq!(
            combine(MergeOp::First, &Value::Number(1.0), &Value::Number(2.0)),
            Value::Number(1.0)
        );
    }
}
