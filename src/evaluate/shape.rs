//! What a term's structure guarantees of its values, as far as compiled
//! nodes use it: a term built of number literals, reads that give numbers
//! and arithmetic over them evaluates to a number or to absent, never to
//! anything else, so its node can compute with plain `f64`s instead of
//! building and matching [`crate::value::Value`]s; the same for booleans.
//! A term whose shape is not seen so (an input, an attribute, a field)
//! is `Any` and is evaluated as a value.

use crate::language::ast::{Aggregate, BinaryOp};
use crate::language::ir::{Function, Program, Read, Term, TermKind};
use crate::value::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Always absent: the literal `null`.
    Absent,
    /// A number, or absent.
    Number,
    /// A boolean, or absent.
    Boolean,
    /// Anything else, or not known.
    Any,
}

impl Shape {
    /// The shape of a value that is one or the other.
    fn or(self, other: Shape) -> Shape {
        match (self, other) {
            (Shape::Absent, shape) | (shape, Shape::Absent) => shape,
            (a, b) if a == b => a,
            _ => Shape::Any,
        }
    }

    /// Whether a value of this shape is a number whenever it is present.
    pub fn numeric(self) -> bool {
        matches!(self, Shape::Number | Shape::Absent)
    }

    /// Whether a value of this shape is a boolean whenever it is present.
    pub fn boolean(self) -> bool {
        matches!(self, Shape::Boolean | Shape::Absent)
    }
}

/// The shapes of a program's definitions, found once, so the shape of a
/// term that uses one is found without walking the definition again.
pub struct Shapes {
    lets: Vec<Shape>,
}

impl Shapes {
    pub fn of(program: &Program) -> Shapes {
        let mut found: Vec<Option<Shape>> = vec![None; program.lets.len()];
        for index in 0..program.lets.len() {
            let_shape(program, index, &mut found);
        }
        Shapes {
            lets: found
                .into_iter()
                .map(|shape| shape.unwrap_or(Shape::Any))
                .collect(),
        }
    }

    pub fn of_term(&self, term: &Term) -> Shape {
        shape(term, &mut |index| {
            self.lets.get(index).copied().unwrap_or(Shape::Any)
        })
    }
}

fn let_shape(program: &Program, index: usize, found: &mut Vec<Option<Shape>>) -> Shape {
    if let Some(Some(shape)) = found.get(index) {
        return *shape;
    }
    let Some(spec) = program.lets.get(index) else {
        return Shape::Any;
    };
    // A definition under way (a cycle the checker refuses) is not known.
    if let Some(slot) = found.get_mut(index) {
        *slot = Some(Shape::Any);
    }
    // Definitions may read definitions declared after them, so a chain of
    // them nests as deep as it is long.
    let shape = stacker::maybe_grow(
        crate::language::check::STACK_RED_ZONE,
        crate::language::check::STACK_SEGMENT,
        || shape(&spec.term, &mut |other| let_shape(program, other, found)),
    );
    if let Some(slot) = found.get_mut(index) {
        *slot = Some(shape);
    }
    shape
}

fn shape(term: &Term, definition: &mut dyn FnMut(usize) -> Shape) -> Shape {
    let mut of = |term: &Term| shape(term, definition);
    match &term.kind {
        TermKind::Const(Value::Null) => Shape::Absent,
        TermKind::Const(Value::Number(_)) => Shape::Number,
        TermKind::Const(Value::Bool(_)) => Shape::Boolean,
        TermKind::Const(_) => Shape::Any,
        TermKind::Read(read) => read_shape(read),
        TermKind::Static(_, inner) | TermKind::Hoisted(_, inner) | TermKind::At(_, inner) => {
            of(inner)
        }
        TermKind::Let(index) => definition(*index),
        TermKind::Not(_) => Shape::Boolean,
        TermKind::Negate(inner) if of(inner).numeric() => Shape::Number,
        TermKind::Binary(
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div,
            lhs,
            rhs,
        ) => {
            if of(lhs).numeric() && of(rhs).numeric() {
                Shape::Number
            } else {
                Shape::Any
            }
        }
        // Connectives and comparisons.
        TermKind::Binary(..) => Shape::Boolean,
        TermKind::If(_, then, otherwise) => of(then).or(of(otherwise)),
        TermKind::Call(function, args) => match function {
            Function::Seconds | Function::Len | Function::IndexOf => Shape::Number,
            Function::Present
            | Function::Empty
            | Function::Intersects
            | Function::Subset
            | Function::Contains
            | Function::StartsWith => Shape::Boolean,
            // One of their arguments, or absent.
            Function::Coalesce | Function::Min | Function::Max | Function::Clamp => args
                .iter()
                .fold(Shape::Absent, |shape, arg| shape.or(of(arg))),
            Function::Lower | Function::Backoff => Shape::Any,
        },
        TermKind::Aggregate(function, value, _) => match function {
            Aggregate::CountOf => Shape::Number,
            Aggregate::AllOf | Aggregate::AnyOf => Shape::Boolean,
            Aggregate::MinOf | Aggregate::MaxOf => of(value),
            Aggregate::AvgOf if of(value).numeric() => Shape::Number,
            Aggregate::AvgOf | Aggregate::ListOf => Shape::Any,
        },
        TermKind::Grouped(_, _, aggregate) => of(aggregate),
        TermKind::Negate(_)
        | TermKind::Merge(_)
        | TermKind::Field(..)
        | TermKind::List(_)
        | TermKind::Record(_)
        | TermKind::ToEnum(..) => Shape::Any,
    }
}

fn read_shape(read: &Read) -> Shape {
    match read {
        Read::RequestEstimatedTokens
        | Read::ProviderPriority
        | Read::RoutePrice(_)
        | Read::HealthStrikes
        | Read::StatsSamples
        | Read::StatsSuccessRate
        | Read::StatsThroughput
        | Read::CapacityInFlight
        | Read::RequestedIndex
        | Read::UpstreamStatus
        | Read::Attempt
        | Read::Attempts
        | Read::Retries => Shape::Number,
        Read::RequestStream
        | Read::RequestPinned
        | Read::CredentialOwned
        | Read::HealthPaused
        | Read::HealthPenalized
        | Read::CapacityFull
        | Read::Succeeded => Shape::Boolean,
        _ => Shape::Any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::language::ir::PriceField;
    use crate::source::Span;

    fn term(kind: TermKind) -> Term {
        Term::new(kind, Span::default())
    }

    fn boxed(kind: TermKind) -> Box<Term> {
        Box::new(term(kind))
    }

    fn of(kind: TermKind) -> Shape {
        shape(&term(kind), &mut |_| Shape::Any)
    }

    #[test]
    fn arithmetic_over_numbers_is_a_number_and_over_anything_else_is_not() {
        let price = || boxed(TermKind::Read(Read::RoutePrice(PriceField::Input)));
        let two = || boxed(TermKind::Const(Value::Number(2.0)));
        assert_eq!(
            of(TermKind::Binary(BinaryOp::Mul, two(), price())),
            Shape::Number
        );
        let ttft = boxed(TermKind::Read(Read::StatsTtft));
        assert_eq!(of(TermKind::Binary(BinaryOp::Mul, two(), ttft)), Shape::Any);
    }

    #[test]
    fn a_branch_of_null_keeps_the_other_branch_shape() {
        let condition = boxed(TermKind::Read(Read::HealthPenalized));
        let samples = boxed(TermKind::Read(Read::StatsSamples));
        let null = boxed(TermKind::Const(Value::Null));
        assert_eq!(
            of(TermKind::If(condition.clone(), samples, null.clone())),
            Shape::Number
        );
        let model = boxed(TermKind::Read(Read::ModelId));
        assert_eq!(of(TermKind::If(condition, model, null)), Shape::Any);
    }

    #[test]
    fn coalesce_of_numbers_and_booleans_is_neither() {
        let args = vec![
            term(TermKind::Read(Read::StatsSamples)),
            term(TermKind::Read(Read::HealthPaused)),
        ];
        assert_eq!(of(TermKind::Call(Function::Coalesce, args)), Shape::Any);
    }
}
