//! Ordering candidates by sort keys, and the load-balancing reshuffles.

use super::compiled::{Key, Keys};
use super::machine::{Focus, Machine, Operand};
use crate::language::ir::{OrderPart, SortKeySpec, StrategySpec};
use crate::value::Value;
use std::borrow::Cow;
use std::cmp::Ordering;

/// Which way a sort key orders its values.
pub trait KeyOrder {
    fn descending(&self) -> bool;
    fn nulls_first(&self) -> bool;
}

/// A sort key: as written (interpreted) or compiled.
pub trait SortKey: KeyOrder {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value>;

    /// The value without building a [`Value`], for a key whose type lets
    /// it be read plainly; `None` for any other key.
    fn plain(&self, _machine: &mut Machine<'_>, _focus: &Focus) -> Option<Plain> {
        None
    }
}

/// A sort key's value read plainly: absent, a boolean or a number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plain {
    Absent,
    Bool(bool),
    Number(f64),
}

/// A key's direction alone, for ordering values already computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Direction {
    pub descending: bool,
    pub nulls_first: bool,
}

impl KeyOrder for Direction {
    fn descending(&self) -> bool {
        self.descending
    }

    fn nulls_first(&self) -> bool {
        self.nulls_first
    }
}

impl SortKey for SortKeySpec {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        self.term.value(machine, focus)
    }
}

impl KeyOrder for SortKeySpec {
    fn descending(&self) -> bool {
        self.descending
    }

    fn nulls_first(&self) -> bool {
        self.nulls_first
    }
}

impl SortKey for Key {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Key::value(self, machine, focus)
    }

    fn plain(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<Plain> {
        Key::plain(self, machine, focus)
    }
}

impl KeyOrder for Key {
    fn descending(&self) -> bool {
        self.descending
    }

    fn nulls_first(&self) -> bool {
        self.nulls_first
    }
}

impl<K: SortKey + ?Sized> SortKey for &K {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        (**self).value(machine, focus)
    }

    fn plain(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<Plain> {
        (**self).plain(machine, focus)
    }
}

impl<K: KeyOrder + ?Sized> KeyOrder for &K {
    fn descending(&self) -> bool {
        (**self).descending()
    }

    fn nulls_first(&self) -> bool {
        (**self).nulls_first()
    }
}

impl SortKey for OrderKey<'_> {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        self.spec.value(machine, focus)
    }
}

impl KeyOrder for OrderKey<'_> {
    fn descending(&self) -> bool {
        self.spec.descending
    }

    fn nulls_first(&self) -> bool {
        self.spec.nulls_first
    }
}

/// Sorts by the compiled keys a request chose.
pub fn sort_by_chosen(machine: &mut Machine<'_>, candidates: &mut [usize], keys: &Keys<'_>) {
    match keys {
        Keys::Fixed(keys) => sort_by_keys(machine, candidates, keys),
        Keys::Chosen(keys) => sort_by_keys(machine, candidates, keys),
    }
}

/// Stable-sorts candidate indices by the keys (the first key that differs
/// decides).
pub fn sort_by_keys<K: SortKey>(machine: &mut Machine<'_>, candidates: &mut [usize], keys: &[K]) {
    if keys.is_empty() || candidates.len() < 2 {
        return;
    }
    if Packed::fits(candidates.len(), keys.len()) {
        // Filled in place: the rows are too large to move around cheaply.
        let mut packed = Packed::new(keys.len());
        if packed
            .fill(machine, candidates.iter().copied(), keys)
            .is_some()
        {
            packed.insertion_sort(candidates);
            return;
        }
    }
    // Keys that do not pack: every key of every candidate, evaluated once
    // (again, for those packed before one did not).
    let width = keys.len();
    let mut values = Vec::with_capacity(candidates.len() * width);
    for candidate in candidates.iter() {
        let focus = &Focus::on(*candidate);
        for key in keys {
            values.push(SortValue::of_key(key, machine, focus));
        }
    }
    if candidates.len() <= INSERTION_SORT_MAX {
        insertion_sort(candidates, &mut values, width, keys);
        return;
    }
    // (candidate, row) pairs, sorted by the rows' keys.
    let mut rows: Vec<(usize, usize)> = candidates.iter().copied().zip(0..).collect();
    rows.sort_by(|(_, a), (_, b)| {
        let row = |r: usize| values.get(r * width..(r + 1) * width).unwrap_or(&[]);
        compare_rows(row(*a), row(*b), keys)
    });
    for (slot, (candidate, _)) in candidates.iter_mut().zip(&rows) {
        *slot = *candidate;
    }
}

/// Up to this many candidates (the usual case) are sorted in place, rows
/// moving with their candidates, without a vector of (candidate, row) pairs.
const INSERTION_SORT_MAX: usize = 16;

/// A stable insertion sort of the candidates and, in step, of the rows of
/// `values` (row `i` the keys of candidate `i`).
fn insertion_sort<K: KeyOrder>(
    candidates: &mut [usize],
    values: &mut [SortValue<'_>],
    width: usize,
    keys: &[K],
) {
    for next in 1..candidates.len() {
        let mut at = next;
        while at > 0 {
            let (before, from) = values.split_at_mut(at * width);
            let (Some(earlier), Some(row)) =
                (before.get_mut((at - 1) * width..), from.get_mut(..width))
            else {
                break;
            };
            if compare_rows(row, earlier, keys) != Ordering::Less {
                break;
            }
            earlier.swap_with_slice(row);
            candidates.swap(at - 1, at);
            at -= 1;
        }
    }
}

/// Room for this many key values (candidates × keys) in [`Packed`] rows,
/// and for this many keys.
const PACKED_MAX: usize = 32;
const PACKED_KEYS_MAX: usize = 8;

/// Candidates' key values packed into integers that order as the keys
/// order them, direction and the place of absent values included. A row
/// then compares as a plain array: nothing to allocate, match or drop,
/// which is what a sort of a handful of candidates spends most on. Only
/// keys whose present values are all of one totally ordered kind pack:
/// values of different kinds tie, NaN ties with everything and text
/// compares as text, so such keys sort as [`SortValue`]s.
struct Packed {
    entries: [u128; PACKED_MAX],
    /// The kind of each key's present values, once one is seen.
    kinds: [Option<PackedKind>; PACKED_KEYS_MAX],
    width: usize,
    len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PackedKind {
    Bool,
    Number,
    Duration,
    Date,
    Rank,
}

impl Packed {
    fn new(width: usize) -> Packed {
        Packed {
            entries: [0; PACKED_MAX],
            kinds: [None; PACKED_KEYS_MAX],
            width,
            len: 0,
        }
    }

    /// Whether rows of this many candidates and keys fit.
    fn fits(candidates: usize, keys: usize) -> bool {
        keys <= PACKED_KEYS_MAX && candidates.saturating_mul(keys) <= PACKED_MAX
    }

    /// Every key of every candidate, evaluated once and packed; `None` as
    /// soon as a value does not pack or the rows do not fit.
    fn fill<K: SortKey>(
        &mut self,
        machine: &mut Machine<'_>,
        candidates: impl Iterator<Item = usize>,
        keys: &[K],
    ) -> Option<()> {
        let mut focus = Focus::default();
        for candidate in candidates {
            focus.current = Some(candidate);
            for (column, key) in keys.iter().enumerate() {
                match key.plain(machine, &focus) {
                    Some(plain) => self.push_plain(column, plain, key)?,
                    None => self.push_value(column, &key.value(machine, &focus), key)?,
                }
            }
        }
        Some(())
    }

    fn push_value(&mut self, column: usize, value: &Value, key: &impl KeyOrder) -> Option<()> {
        let word = match value {
            Value::Null => None,
            present => Some(packed_word(present)?),
        };
        self.push(column, word, key)
    }

    fn push_plain(&mut self, column: usize, plain: Plain, key: &impl KeyOrder) -> Option<()> {
        let word = match plain {
            Plain::Absent => None,
            Plain::Bool(b) => Some((PackedKind::Bool, u64::from(b))),
            Plain::Number(n) => Some((PackedKind::Number, number_word(n)?)),
        };
        self.push(column, word, key)
    }

    /// Adds the next value, absent or packed, that of key `column`: rows
    /// are filled key by key, `width` to a row.
    fn push(
        &mut self,
        column: usize,
        word: Option<(PackedKind, u64)>,
        key: &impl KeyOrder,
    ) -> Option<()> {
        let entry = match word {
            None if key.nulls_first() => 0,
            None => 2 << 64,
            Some((kind, word)) => {
                let seen = self.kinds.get_mut(column)?;
                if seen.is_some_and(|seen| seen != kind) {
                    return None;
                }
                *seen = Some(kind);
                let word = if key.descending() { !word } else { word };
                (1 << 64) | u128::from(word)
            }
        };
        *self.entries.get_mut(self.len)? = entry;
        self.len += 1;
        Some(())
    }

    fn row(&self, row: usize) -> &[u128] {
        self.entries
            .get(row * self.width..(row + 1) * self.width)
            .unwrap_or(&[])
    }

    /// The first of the rows that sort first.
    fn first(&self) -> Option<usize> {
        let rows = self.len.checked_div(self.width)?;
        let mut best = 0;
        for row in 1..rows {
            if self.row(row) < self.row(best) {
                best = row;
            }
        }
        (rows > 0).then_some(best)
    }

    /// A stable insertion sort of the candidates (row `i` the keys of
    /// candidate `i`), rows moving with them.
    fn insertion_sort(&mut self, candidates: &mut [usize]) {
        let width = self.width;
        for next in 1..candidates.len() {
            let mut at = next;
            while at > 0 {
                let (before, from) = self.entries.split_at_mut(at * width);
                let (Some(earlier), Some(row)) =
                    (before.get_mut((at - 1) * width..), from.get_mut(..width))
                else {
                    break;
                };
                if *row >= *earlier {
                    break;
                }
                earlier.swap_with_slice(row);
                candidates.swap(at - 1, at);
                at -= 1;
            }
        }
    }
}

/// A present value as an integer whose order is [`Value::compare`]'s among
/// values of its kind; `None` for values that do not order totally.
fn packed_word(value: &Value) -> Option<(PackedKind, u64)> {
    Some(match *value {
        Value::Bool(b) => (PackedKind::Bool, u64::from(b)),
        Value::Number(n) => (PackedKind::Number, number_word(n)?),
        Value::Duration(ms) => (PackedKind::Duration, ms),
        Value::Date(days) => (PackedKind::Date, days.cast_unsigned() ^ SIGN),
        Value::Enum(ref member) => (PackedKind::Rank, u64::from(member.rank)),
        _ => return None,
    })
}

const SIGN: u64 = 1 << 63;

/// A number as an integer in the same order; `None` for NaN, which orders
/// with nothing.
fn number_word(n: f64) -> Option<u64> {
    if n.is_nan() {
        return None;
    }
    // Zero of either sign is one value; a negative number's bits order
    // backwards, a positive one's after every negative one.
    let bits = if n == 0.0 { 0 } else { n.to_bits() };
    Some(if bits & SIGN == 0 { bits | SIGN } else { !bits })
}

/// The candidate a stable sort by the keys would put first (the earliest of
/// those that tie), without sorting: each candidate's keys evaluated once,
/// then one pass.
pub fn first_by_keys<K: SortKey>(
    machine: &mut Machine<'_>,
    candidates: impl Iterator<Item = usize> + Clone,
    keys: &[K],
) -> Option<usize> {
    if keys.is_empty() {
        return candidates.clone().next();
    }
    if Packed::fits(candidates.clone().count(), keys.len()) {
        let mut packed = Packed::new(keys.len());
        if packed.fill(machine, candidates.clone(), keys).is_some() {
            return candidates.clone().nth(packed.first()?);
        }
    }
    let width = keys.len();
    let mut values = Vec::new();
    for candidate in candidates.clone() {
        let focus = Focus::on(candidate);
        for key in keys {
            values.push(SortValue::of(key.value(machine, &focus)));
        }
    }
    let mut rows = values.chunks(width);
    let mut best = (0, rows.next()?);
    for (index, row) in rows.enumerate() {
        if compare_rows(row, best.1, keys) == Ordering::Less {
            best = (index + 1, row);
        }
    }
    candidates.clone().nth(best.0)
}

/// Sorts as [`sort_by_keys`] does and returns each candidate's key values,
/// for the trace (none when nothing needed sorting).
pub fn sort_by_keys_traced<K: SortKey>(
    machine: &mut Machine<'_>,
    candidates: &mut [usize],
    keys: &[K],
) -> Vec<(usize, Vec<Value>)> {
    if keys.is_empty() {
        return Vec::new();
    }
    // Terms are pure: the values the sort compares are these. A lone
    // candidate has its values shown too, though nothing compares them.
    let values = candidates
        .iter()
        .map(|candidate| {
            let focus = &Focus::on(*candidate);
            let row = keys
                .iter()
                .map(|key| key.value(machine, focus).into_owned())
                .collect();
            (*candidate, row)
        })
        .collect();
    sort_by_keys(machine, candidates, keys);
    values
}

/// Each row's rank in the order `directions` give to the rows' key values
/// (`value(row, key)`): rows that tie share a rank, so comparing two rows'
/// ranks orders them as comparing their values would. `None` when a key's
/// values are not all of one comparable kind, or a number is NaN: such
/// values do not order totally, and no rank can stand in for them.
pub fn dense_ranks<'v>(
    rows: usize,
    directions: &[Direction],
    value: impl Fn(usize, usize) -> &'v Value,
) -> Option<Vec<u32>> {
    let width = directions.len();
    let mut values = Vec::with_capacity(rows * width);
    for row in 0..rows {
        for key in 0..width {
            values.push(SortValue::of(Cow::Borrowed(value(row, key))));
        }
    }
    for key in 0..width {
        let mut kind = None;
        for value in values.iter().skip(key).step_by(width.max(1)) {
            let this = match value {
                SortValue::Absent => continue,
                SortValue::Number(n) if n.is_nan() => return None,
                SortValue::Other(other) if !matches!(**other, Value::String(_)) => return None,
                _ => std::mem::discriminant(value),
            };
            if kind.is_some_and(|kind| kind != this) {
                return None;
            }
            kind = Some(this);
        }
    }
    let row = |r: usize| values.get(r * width..(r + 1) * width).unwrap_or(&[]);
    let mut sorted: Vec<usize> = (0..rows).collect();
    sorted.sort_by(|a, b| compare_rows(row(*a), row(*b), directions));
    let mut ranks = vec![0; rows];
    let mut rank: u32 = 0;
    let mut previous = None;
    for current in sorted {
        if let Some(previous) = previous
            && compare_rows(row(previous), row(current), directions) != Ordering::Equal
        {
            rank = rank.checked_add(1)?;
        }
        *ranks.get_mut(current)? = rank;
        previous = Some(current);
    }
    Some(ranks)
}

/// A sort key's value in the form the sort compares: plain numbers, days,
/// milliseconds and enumeration ranks; the value itself only for text,
/// lists and records. Built once per candidate and key, so comparing rows
/// neither follows `Cow`s nor matches `Value`s pairwise.
enum SortValue<'k> {
    Absent,
    Bool(bool),
    Number(f64),
    Duration(u64),
    Date(i64),
    Rank(u32),
    Other(Cow<'k, Value>),
}

impl<'k> SortValue<'k> {
    /// A key's value for a candidate: plainly if the key can give it so.
    fn of_key<'a: 'k, K: SortKey>(
        key: &'k K,
        machine: &mut Machine<'a>,
        focus: &Focus,
    ) -> SortValue<'k> {
        match key.plain(machine, focus) {
            Some(Plain::Absent) => SortValue::Absent,
            Some(Plain::Bool(b)) => SortValue::Bool(b),
            Some(Plain::Number(n)) => SortValue::Number(n),
            None => SortValue::of(key.value(machine, focus)),
        }
    }

    fn of(value: Cow<'k, Value>) -> SortValue<'k> {
        match *value {
            Value::Null => SortValue::Absent,
            Value::Bool(b) => SortValue::Bool(b),
            Value::Number(n) => SortValue::Number(n),
            Value::Duration(ms) => SortValue::Duration(ms),
            Value::Date(days) => SortValue::Date(days),
            Value::Enum(ref member) => SortValue::Rank(member.rank),
            Value::String(_) | Value::List(_) | Value::Record(_) => SortValue::Other(value),
        }
    }

    /// [`Value::compare`] of two present values; values of different types
    /// tie.
    fn compare(&self, other: &SortValue<'_>) -> Ordering {
        match (self, other) {
            (SortValue::Bool(a), SortValue::Bool(b)) => a.cmp(b),
            (SortValue::Number(a), SortValue::Number(b)) => {
                a.partial_cmp(b).unwrap_or(Ordering::Equal)
            }
            (SortValue::Duration(a), SortValue::Duration(b)) => a.cmp(b),
            (SortValue::Date(a), SortValue::Date(b)) => a.cmp(b),
            (SortValue::Rank(a), SortValue::Rank(b)) => a.cmp(b),
            (SortValue::Other(a), SortValue::Other(b)) => a.compare(b).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        }
    }
}

/// Orders two candidates' rows of key values: the first key that differs
/// decides; absent values sort last (or first, if asked) in either
/// direction.
fn compare_rows<K: KeyOrder>(a: &[SortValue<'_>], b: &[SortValue<'_>], keys: &[K]) -> Ordering {
    for ((x, y), key) in a.iter().zip(b).zip(keys) {
        let ordering = match (x, y) {
            (SortValue::Absent, SortValue::Absent) => Ordering::Equal,
            // Absent values keep their place (last, or first) whatever the direction.
            (SortValue::Absent, _) if key.nulls_first() => Ordering::Less,
            (SortValue::Absent, _) => Ordering::Greater,
            (_, SortValue::Absent) if key.nulls_first() => Ordering::Greater,
            (_, SortValue::Absent) => Ordering::Less,
            _ if key.descending() => y.compare(x),
            _ => x.compare(y),
        };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    Ordering::Equal
}

/// A sort key `order` applies, with the named sort it came from.
pub struct OrderKey<'p> {
    pub spec: &'p SortKeySpec,
    pub sort: Option<&'p str>,
}

/// The sort keys `order` applies for this request.
pub fn order_keys<'p>(machine: &mut Machine<'_>, parts: &'p [OrderPart]) -> Vec<OrderKey<'p>> {
    let mut keys = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            OrderPart::By(spec) => keys.push(OrderKey { spec, sort: None }),
            OrderPart::UseSort { selector, sorts } => {
                let chosen = machine.eval(selector, &Focus::default());
                let name = chosen.as_str().unwrap_or("");
                if let Some((sort_name, sort_keys)) =
                    sorts.iter().find(|(sort_name, _)| sort_name == name)
                {
                    keys.extend(sort_keys.iter().map(|spec| OrderKey {
                        spec,
                        sort: Some(sort_name.as_str()),
                    }));
                }
            }
        }
    }
    keys
}

/// A small, fast, seedable generator (SplitMix64): load balancing is
/// reproducible from the request's seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn shuffle(&mut self, items: &mut [usize]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// Applies a load-balancing strategy to ordered candidates. It only ever
/// permutes them.
pub fn balance(
    machine: &mut Machine<'_>,
    order: &mut [usize],
    strategy: &StrategySpec,
    seed: u64,
    rotation: &dyn super::Turns,
) {
    let mut rng = Rng::new(seed);
    match strategy {
        StrategySpec::Random => rng.shuffle(order),
        StrategySpec::RoundRobin => {
            if !order.is_empty() {
                let by = (rotation.next_turn() % order.len() as u64) as usize;
                order.rotate_left(by);
            }
        }
        StrategySpec::LeastBusy => {
            let busy: Vec<(usize, u32)> = order
                .iter()
                .map(|candidate| {
                    (
                        *candidate,
                        machine.health.of(*candidate).map_or(0, |h| h.in_flight),
                    )
                })
                .collect();
            order.sort_by_key(|candidate| {
                busy.iter()
                    .find(|(c, _)| c == candidate)
                    .map_or(0, |(_, n)| *n)
            });
        }
        StrategySpec::Weighted(weight) => {
            // Weighted random permutation: sort by u^(1/w), highest first.
            let mut keyed: Vec<(usize, f64)> = order
                .iter()
                .map(|candidate| {
                    let w = machine
                        .eval(weight, &Focus::on(*candidate))
                        .as_number()
                        .unwrap_or(0.0);
                    let u = rng.unit().max(f64::MIN_POSITIVE);
                    let key = if w > 0.0 && w.is_finite() {
                        u.powf(1.0 / w)
                    } else {
                        -1.0
                    };
                    (*candidate, key)
                })
                .collect();
            keyed.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(Ordering::Equal));
            for (slot, (candidate, _)) in order.iter_mut().zip(keyed) {
                *slot = candidate;
            }
        }
        StrategySpec::Share {
            key,
            tolerance,
            among,
        } => {
            let Some(&head) = order.first() else { return };
            let score = |machine: &mut Machine<'_>, candidate: usize| {
                machine.eval(&key.term, &Focus::on(candidate))
            };
            let best = numeric(&score(machine, head));
            let head_group: Vec<Value> = among
                .iter()
                .map(|term| machine.eval(term, &Focus::on(head)))
                .collect();
            // Compared term by term, without collecting each candidate's values.
            let same_group = |machine: &mut Machine<'_>, candidate: usize| {
                among.iter().zip(&head_group).all(|(term, head_value)| {
                    *machine.eval_ref(term, &Focus::on(candidate)) == *head_value
                })
            };
            let mut size = 1;
            for candidate in order.iter().skip(1) {
                let value = numeric(&score(machine, *candidate));
                // Within P% of the first one's, either way: behind an order
                // that did not sort by the key, a far better one is no
                // close rival of the first.
                let within = match (best, value) {
                    (Some(best), Some(value)) => (value - best).abs() <= best.abs() * tolerance,
                    _ => false,
                };
                if !within || !same_group(machine, *candidate) {
                    break;
                }
                size += 1;
            }
            if let Some(group) = order.get_mut(..size) {
                rng.shuffle(group);
            }
        }
    }
}

fn numeric(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => Some(*n),
        Value::Duration(ms) => Some(*ms as f64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::language::ir::{Term, TermKind};
    use crate::source::Span;
    use proptest::prelude::*;

    fn key(descending: bool, nulls_first: bool) -> SortKeySpec {
        SortKeySpec {
            term: Term {
                kind: TermKind::Const(Value::Null),
                span: Span::default(),
            },
            descending,
            nulls_first,
        }
    }

    fn order(a: Value, b: Value, key: &SortKeySpec) -> Ordering {
        let (a, b) = (SortValue::of(Cow::Owned(a)), SortValue::of(Cow::Owned(b)));
        compare_rows(&[a], &[b], std::slice::from_ref(key))
    }

    #[test]
    fn absent_values_sort_last_unless_asked_whatever_the_direction() {
        let one = || Value::Number(1.0);
        assert_eq!(
            order(Value::Null, one(), &key(false, false)),
            Ordering::Greater
        );
        assert_eq!(
            order(Value::Null, one(), &key(true, false)),
            Ordering::Greater
        );
        assert_eq!(order(Value::Null, one(), &key(false, true)), Ordering::Less);
        assert_eq!(
            order(Value::Null, Value::Null, &key(false, false)),
            Ordering::Equal
        );
    }

    #[test]
    fn present_values_compare_within_their_type_and_tie_across_types() {
        let ascending = key(false, false);
        assert_eq!(
            order(Value::Number(1.0), Value::Number(2.0), &ascending),
            Ordering::Less
        );
        assert_eq!(
            order(Value::Number(1.0), Value::Number(2.0), &key(true, false)),
            Ordering::Greater
        );
        assert_eq!(
            order(Value::string("b"), Value::string("a"), &ascending),
            Ordering::Greater
        );
        assert_eq!(
            order(Value::Number(1.0), Value::Duration(2), &ascending),
            Ordering::Equal
        );
    }

    fn ranks(rows: &[Vec<Value>], directions: &[Direction]) -> Option<Vec<u32>> {
        let absent = Value::Null;
        dense_ranks(rows.len(), directions, |row, key| {
            rows.get(row).and_then(|r| r.get(key)).unwrap_or(&absent)
        })
    }

    const ASCENDING: Direction = Direction {
        descending: false,
        nulls_first: false,
    };
    const DESCENDING: Direction = Direction {
        descending: true,
        nulls_first: false,
    };

    #[test]
    fn ranks_follow_the_keys_and_ties_share_a_rank() {
        let row = |priority: f64, price: Option<f64>| {
            vec![
                Value::Number(priority),
                price.map_or(Value::Null, Value::Number),
            ]
        };
        let rows = [
            row(8.0, Some(2.0)),
            row(10.0, None),
            row(8.0, Some(1.0)),
            row(10.0, Some(5.0)),
            row(8.0, Some(2.0)),
        ];
        assert_eq!(
            ranks(&rows, &[DESCENDING, ASCENDING]),
            Some(vec![3, 1, 2, 0, 3])
        );
        let nulls_first = Direction {
            descending: false,
            nulls_first: true,
        };
        assert_eq!(
            ranks(&rows, &[DESCENDING, nulls_first]),
            Some(vec![3, 0, 2, 1, 3])
        );
    }

    #[test]
    fn ranks_compare_as_the_rows_they_stand_for() {
        let rows: Vec<Vec<Value>> = [
            (Some("b"), 2.0),
            (None, 1.0),
            (Some("a"), 3.0),
            (Some("b"), 1.0),
            (Some("a"), 3.0),
        ]
        .into_iter()
        .map(|(name, n)| vec![name.map_or(Value::Null, Value::string), Value::Number(n)])
        .collect();
        let directions = [ASCENDING, DESCENDING];
        let ranked = ranks(&rows, &directions).unwrap_or_default();
        let values: Vec<Vec<SortValue<'_>>> = rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|v| SortValue::of(Cow::Borrowed(v)))
                    .collect()
            })
            .collect();
        for (a, row_a) in values.iter().enumerate() {
            for (b, row_b) in values.iter().enumerate() {
                assert_eq!(
                    ranked.get(a).cmp(&ranked.get(b)),
                    compare_rows(row_a, row_b, &directions),
                    "rows {a} and {b}"
                );
            }
        }
    }

    /// A value of one of the kinds a key can produce (`kind` 0 to 6), or
    /// absent; kind 7 is any of them, so a key's values may mix kinds.
    fn key_value(kind: u8) -> BoxedStrategy<Value> {
        let present = match kind {
            0 => any::<bool>().prop_map(Value::Bool).boxed(),
            1 => prop_oneof![
                Just(0.0),
                Just(-0.0),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY),
                (-3i8..3).prop_map(f64::from),
                -3.0..3.0f64,
            ]
            .prop_map(Value::Number)
            .boxed(),
            2 => Just(Value::Number(f64::NAN)).boxed(),
            3 => (0u64..4).prop_map(Value::Duration).boxed(),
            4 => (-2i64..2).prop_map(Value::Date).boxed(),
            5 => (0u32..3)
                .prop_map(|rank| {
                    Value::Enum(crate::value::EnumMember {
                        rank,
                        name: std::sync::Arc::from("member"),
                    })
                })
                .boxed(),
            6 => "[ab]?".prop_map(|text| Value::string(&text)).boxed(),
            _ => (0u8..7).prop_flat_map(key_value).boxed(),
        };
        prop_oneof![1 => Just(Value::Null), 3 => present].boxed()
    }

    /// Rows of key values, each key's values drawn from one kind, and the
    /// keys' directions.
    fn any_rows() -> impl Strategy<Value = (Vec<Vec<Value>>, Vec<Direction>)> {
        (1usize..=3, 0usize..=12).prop_flat_map(|(width, rows)| {
            let directions = proptest::collection::vec(
                (any::<bool>(), any::<bool>()).prop_map(|(descending, nulls_first)| Direction {
                    descending,
                    nulls_first,
                }),
                width,
            );
            let columns = proptest::collection::vec(0u8..=7, width).prop_flat_map(move |kinds| {
                let row: Vec<BoxedStrategy<Value>> = kinds.into_iter().map(key_value).collect();
                proptest::collection::vec(row, rows)
            });
            (columns, directions)
        })
    }

    /// Whether every key's present values are of one kind that orders
    /// totally: what packing needs.
    fn orders_totally(rows: &[Vec<Value>], width: usize) -> bool {
        (0..width).all(|key| {
            let present: Vec<&Value> = rows
                .iter()
                .filter_map(|row| row.get(key))
                .filter(|v| !v.is_null())
                .collect();
            let orderable = present.iter().all(|v| packed_word(v).is_some());
            let one_kind = present.windows(2).all(|pair| {
                matches!(pair, [a, b] if std::mem::discriminant(*a) == std::mem::discriminant(*b))
            });
            orderable && one_kind
        })
    }

    proptest! {
        /// Packed rows sort exactly as the values they stand for, and pack
        /// whenever they fit and every key's values order totally.
        #[test]
        fn packed_rows_sort_as_their_values((rows, directions) in any_rows()) {
            let width = directions.len();
            let mut by_values: Vec<usize> = (0..rows.len()).collect();
            let mut values: Vec<SortValue<'_>> = rows
                .iter()
                .flatten()
                .map(|v| SortValue::of(Cow::Borrowed(v)))
                .collect();
            insertion_sort(&mut by_values, &mut values, width, &directions);

            let mut packed = Packed::new(width);
            let packs = rows.iter().all(|row| {
                row.iter()
                    .zip(&directions)
                    .enumerate()
                    .all(|(column, (value, direction))| {
                        packed.push_value(column, value, direction).is_some()
                    })
            });
            let fits = rows.len() * width <= PACKED_MAX;
            prop_assert_eq!(packs, fits && orders_totally(&rows, width));
            if packs {
                prop_assert_eq!(packed.first(), by_values.first().copied());
                let mut by_packed: Vec<usize> = (0..rows.len()).collect();
                packed.insertion_sort(&mut by_packed);
                prop_assert_eq!(by_packed, by_values);
            }
        }
    }

    #[test]
    fn plain_values_pack_and_sort_as_the_values_they_stand_for() {
        let plain = [
            Plain::Absent,
            Plain::Bool(false),
            Plain::Bool(true),
            Plain::Number(-2.5),
            Plain::Number(-0.0),
            Plain::Number(0.0),
            Plain::Number(1e300),
            Plain::Number(f64::NAN),
        ];
        let value = |plain: Plain| match plain {
            Plain::Absent => Value::Null,
            Plain::Bool(b) => Value::Bool(b),
            Plain::Number(n) => Value::Number(n),
        };
        for direction in [ASCENDING, DESCENDING] {
            for item in plain {
                let (mut by_plain, mut by_value) = (Packed::new(1), Packed::new(1));
                let packs = by_plain.push_plain(0, item, &direction);
                assert_eq!(packs, by_value.push_value(0, &value(item), &direction));
                assert_eq!(by_plain.entries, by_value.entries, "{item:?}");
            }
        }
    }

    #[test]
    fn values_that_do_not_order_totally_are_not_ranked() {
        let mixed = [vec![Value::Number(1.0)], vec![Value::Duration(2)]];
        assert_eq!(ranks(&mixed, &[ASCENDING]), None);
        let nan = [vec![Value::Number(f64::NAN)], vec![Value::Number(1.0)]];
        assert_eq!(ranks(&nan, &[ASCENDING]), None);
        let lists = [
            vec![Value::List(vec![Value::Number(1.0)].into())],
            vec![Value::Null],
        ];
        assert_eq!(ranks(&lists, &[ASCENDING]), None);
        let absent_only = [vec![Value::Null], vec![Value::Null]];
        assert_eq!(ranks(&absent_only, &[ASCENDING]), Some(vec![0, 0]));
    }
}
