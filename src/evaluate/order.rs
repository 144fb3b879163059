//! Ordering candidates by sort keys, and the load-balancing reshuffles.

use super::machine::{Focus, Machine};
use crate::language::ir::{OrderPart, SortKeySpec, StrategySpec};
use crate::value::Value;
use std::borrow::Cow;
use std::cmp::Ordering;

/// Stable-sorts candidate indices by the keys (the first key that differs
/// decides).
pub fn sort_by_keys<K: AsRef<SortKeySpec>>(
    machine: &mut Machine<'_>,
    candidates: &mut [usize],
    keys: &[K],
) {
    sort_rows(machine, candidates, keys);
}

/// The candidate a stable sort by the keys would put first (the earliest of
/// those that tie), without sorting: each candidate's keys evaluated once,
/// then one pass.
pub fn first_by_keys<K: AsRef<SortKeySpec>>(
    machine: &mut Machine<'_>,
    candidates: impl Iterator<Item = usize> + Clone,
    keys: &[K],
) -> Option<usize> {
    if keys.is_empty() {
        return candidates.clone().next();
    }
    let width = keys.len();
    let mut values = Vec::new();
    for candidate in candidates.clone() {
        let focus = Focus::on(candidate);
        for key in keys {
            values.push(machine.eval_ref(&key.as_ref().term, &focus));
        }
    }
    let mut rows = values.chunks(width);
    let mut best = (0, rows.next()?);
    for (index, row) in rows.enumerate() {
        if compare_keys(row, best.1, keys) == Ordering::Less {
            best = (index + 1, row);
        }
    }
    candidates.clone().nth(best.0)
}

/// Sorts as [`sort_by_keys`] does and returns each candidate's key values,
/// for the trace.
pub fn sort_by_keys_traced<K: AsRef<SortKeySpec>>(
    machine: &mut Machine<'_>,
    candidates: &mut [usize],
    keys: &[K],
) -> Vec<(usize, Vec<Value>)> {
    let original: Vec<usize> = candidates.to_vec();
    let values = sort_rows(machine, candidates, keys);
    let width = keys.len();
    original
        .iter()
        .enumerate()
        .map(|(row, candidate)| {
            (
                *candidate,
                values
                    .get(row * width..(row + 1) * width)
                    .unwrap_or(&[])
                    .iter()
                    .map(|value| value.clone().into_owned())
                    .collect(),
            )
        })
        .collect()
}

/// Sorts the candidates; returns the key matrix, row `i` holding the keys
/// of the candidate that was at position `i` before the sort (empty when
/// nothing needed sorting).
fn sort_rows<'a: 'k, 'k, K: AsRef<SortKeySpec>>(
    machine: &mut Machine<'a>,
    candidates: &mut [usize],
    keys: &'k [K],
) -> Vec<Cow<'k, Value>> {
    if keys.is_empty() || candidates.len() < 2 {
        return Vec::new();
    }
    // Every key of every candidate, evaluated once.
    let width = keys.len();
    let mut values = Vec::with_capacity(candidates.len() * width);
    for candidate in candidates.iter() {
        let focus = &Focus::on(*candidate);
        for key in keys {
            values.push(machine.eval_ref(&key.as_ref().term, focus));
        }
    }
    // (candidate, row) pairs, sorted by the rows' keys.
    let mut rows: Vec<(usize, usize)> = candidates.iter().copied().zip(0..).collect();
    rows.sort_by(|(_, a), (_, b)| {
        let row = |r: usize| values.get(r * width..(r + 1) * width).unwrap_or(&[]);
        compare_keys(row(*a), row(*b), keys)
    });
    for (slot, (candidate, _)) in candidates.iter_mut().zip(&rows) {
        *slot = *candidate;
    }
    values
}

fn compare_keys<K: AsRef<SortKeySpec>>(
    a: &[Cow<'_, Value>],
    b: &[Cow<'_, Value>],
    keys: &[K],
) -> Ordering {
    for ((x, y), key) in a.iter().zip(b).zip(keys) {
        let key = key.as_ref();
        let ordering = if x.is_null() || y.is_null() {
            // Absent values keep their place (last, or first) whatever the direction.
            x.sort_cmp(y, key.nulls_first)
        } else if key.descending {
            y.sort_cmp(x, key.nulls_first)
        } else {
            x.sort_cmp(y, key.nulls_first)
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

impl AsRef<SortKeySpec> for OrderKey<'_> {
    fn as_ref(&self) -> &SortKeySpec {
        self.spec
    }
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
    rotation: u64,
) {
    let mut rng = Rng::new(seed);
    match strategy {
        StrategySpec::Random => rng.shuffle(order),
        StrategySpec::RoundRobin => {
            if !order.is_empty() {
                let by = (rotation % order.len() as u64) as usize;
                order.rotate_left(by);
            }
        }
        StrategySpec::LeastBusy => {
            let busy: Vec<(usize, u32)> = order
                .iter()
                .map(|candidate| {
                    (
                        *candidate,
                        machine.health.get(*candidate).map_or(0, |h| h.in_flight),
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
            let group_of = |machine: &mut Machine<'_>, candidate: usize| -> Vec<Value> {
                among
                    .iter()
                    .map(|term| machine.eval(term, &Focus::on(candidate)))
                    .collect()
            };
            let best = numeric(&score(machine, head));
            let head_group = group_of(machine, head);
            let mut size = 1;
            for candidate in order.iter().skip(1) {
                let value = numeric(&score(machine, *candidate));
                let within = match (best, value) {
                    (Some(best), Some(value)) => {
                        let margin = best.abs() * tolerance;
                        if key.descending {
                            value >= best - margin
                        } else {
                            value <= best + margin
                        }
                    }
                    _ => false,
                };
                if !within || group_of(machine, *candidate) != head_group {
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
