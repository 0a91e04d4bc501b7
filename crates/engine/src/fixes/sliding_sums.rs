//! `sum` and `avg` of doubles over a sliding window frame (`ROWS BETWEEN 1 PRECEDING AND 1
//! FOLLOWING`, a `RANGE` of a day). DataFusion keeps one running sum, adds the rows entering
//! the frame and subtracts those leaving it. Once an infinity or a NaN has entered, the sum
//! stays NaN for good (`inf - inf`): every later frame answered NaN, `[4, NULL, 5]` included.
//! After a sum overflowed (`1e308 + 1e308`) it stayed infinite, and after a large value left,
//! the small ones beside it were lost (`1e308 + 1 - 1e308` is 0). Difftest seed 8484 found it
//! against DuckDB, whose answers are each frame's own sum.
//!
//! Here infinities and NaNs are counted, never added, so they leave the frame exactly; the
//! finite values are summed with Neumaier's compensation, which keeps what cancels; once their
//! sum overflows, each answer sums the frame's finite values again, scaled down, until it is
//! finite again.
//! Upstream: DataFusion's `SlidingSumAccumulator` and `AvgAccumulator::retract_batch`; no issue
//! filed yet. Goes when their sliding sums of doubles answer each frame as its own sum.

use std::collections::VecDeque;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{ScalarValue, internal_err};
use datafusion::error::Result;
use datafusion::logical_expr::Accumulator;
use datafusion::logical_expr::function::AccumulatorArgs;

/// What the frame's values answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Answer {
    #[default]
    Sum,
    Average,
}

/// The accumulator for a sliding frame of `args`, when they are doubles.
pub fn accumulator(answer: Answer, args: &AccumulatorArgs) -> Option<Box<dyn Accumulator>> {
    let doubles = args.exprs.len() == 1
        && !args.is_distinct
        && args.expr_fields[0].data_type() == &DataType::Float64
        && args.return_field.data_type() == &DataType::Float64;
    doubles.then(|| Box::new(SlidingSum { answer, ..Default::default() }) as Box<dyn Accumulator>)
}

#[derive(Debug, Default)]
struct SlidingSum {
    answer: Answer,
    /// The frame's finite values, oldest first (rows leave a frame in the order they came).
    finite: VecDeque<f64>,
    /// Their sum and its compensation (what the sum's rounding lost), unless it overflowed.
    sum: f64,
    compensation: f64,
    overflowed: bool,
    nans: usize,
    infinities: usize,
    negative_infinities: usize,
}

/// Finite values are summed scaled down by this when their sum overflowed, so that values that
/// cancel later still do (scaling by a power of two loses no precision).
const SCALE: f64 = 18446744073709551616.0; // 2^64

impl SlidingSum {
    /// Adds `x` (or takes it away) with Neumaier's compensation.
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if !t.is_finite() {
            self.overflowed = true;
        }
        if self.overflowed {
            return;
        }
        self.compensation += if self.sum.abs() >= x.abs() { (self.sum - t) + x } else { (x - t) + self.sum };
        self.sum = t;
    }

    fn values(&self) -> usize {
        self.finite.len() + self.nans + self.infinities + self.negative_infinities
    }

    fn total(&mut self) -> f64 {
        if self.nans > 0 || self.infinities > 0 && self.negative_infinities > 0 {
            return f64::NAN;
        }
        if self.infinities > 0 {
            return f64::INFINITY;
        }
        if self.negative_infinities > 0 {
            return f64::NEG_INFINITY;
        }
        if self.overflowed {
            // The frame's own sum, scaled down: infinite only if the frame's values overflow.
            let mut scaled = SlidingSum::default();
            for &x in &self.finite {
                scaled.add(x / SCALE);
            }
            let total = (scaled.sum + scaled.compensation) * SCALE;
            if !total.is_finite() {
                return total;
            }
            (self.sum, self.compensation, self.overflowed) = (total, 0.0, false);
        }
        self.sum + self.compensation
    }
}

impl Accumulator for SlidingSum {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        for x in values[0].as_primitive::<Float64Type>().iter().flatten() {
            match x {
                x if x.is_nan() => self.nans += 1,
                f64::INFINITY => self.infinities += 1,
                f64::NEG_INFINITY => self.negative_infinities += 1,
                x => {
                    self.finite.push_back(x);
                    self.add(x);
                }
            }
        }
        Ok(())
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        for x in values[0].as_primitive::<Float64Type>().iter().flatten() {
            match x {
                x if x.is_nan() => self.nans -= 1,
                f64::INFINITY => self.infinities -= 1,
                f64::NEG_INFINITY => self.negative_infinities -= 1,
                x => {
                    let at = self.finite.iter().position(|v| v.to_bits() == x.to_bits());
                    let Some(at) = at else { return internal_err!("{x} left a frame it was not in") };
                    self.finite.remove(at);
                    self.add(-x);
                }
            }
        }
        if self.finite.is_empty() {
            // Nothing left to round, or to have overflowed.
            (self.sum, self.compensation, self.overflowed) = (0.0, 0.0, false);
        }
        Ok(())
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let values = self.values();
        if values == 0 {
            return Ok(ScalarValue::Float64(None));
        }
        let total = self.total();
        Ok(ScalarValue::Float64(Some(match self.answer {
            Answer::Average => total / values as f64,
            Answer::Sum => total,
        })))
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.finite.capacity() * size_of::<f64>()
    }

    /// As the wrapped function's state: `[sum]`, or `[count, sum]` for an average.
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values = self.values();
        let total = ScalarValue::Float64((values > 0).then(|| self.total()));
        Ok(match self.answer {
            Answer::Average => vec![ScalarValue::UInt64(Some(values as u64)), total],
            Answer::Sum => vec![total],
        })
    }

    fn merge_batch(&mut self, _states: &[ArrayRef]) -> Result<()> {
        internal_err!("a sliding window frame's sum is never merged")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, RecordBatch};
    use arrow::datatypes::{Field, Schema};

    use crate::testing::{answer, session};

    /// Each frame's sum and average computed on its own, against the window's: infinities,
    /// NaNs, overflows, large values beside small ones, NULLs and empty frames.
    #[tokio::test]
    async fn every_frame_answers_its_own_sum() {
        let special = [1e308, 1e308, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -1e308, 1e16];
        let xs: Vec<Option<f64>> = (0..400)
            .map(|i: usize| match i % 11 {
                3 => None,
                7 => Some(special[(i / 11) % special.len()]),
                k => Some(k as f64 - 4.5),
            })
            .collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", arrow::datatypes::DataType::Int64, false),
            Field::new("x", arrow::datatypes::DataType::Float64, true),
        ]));
        let t = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..400)), Arc::new(Float64Array::from(xs.clone()))],
        )
        .unwrap();
        let ctx = session(&Default::default(), 64 << 20, &[("t", t)]);
        for (before, after) in [(1, 1), (3, 0), (0, 2), (12, 5)] {
            let sql = format!(
                "SELECT i, sum(x) OVER w AS s, avg(x) OVER w AS a FROM t \
                 WINDOW w AS (ORDER BY i ROWS BETWEEN {before} PRECEDING AND {after} FOLLOWING) ORDER BY i"
            );
            let got = answer(&ctx, &sql).await;
            // Rows come sorted as text: by their number again.
            let mut rows: Vec<Vec<&str>> = got
                .lines()
                .skip(3)
                .filter(|l| l.starts_with("| "))
                .map(|l| l.split('|').map(str::trim).skip(1).collect())
                .collect();
            rows.sort_by_key(|r| r[0].parse::<usize>().unwrap());
            assert_eq!(rows.len(), xs.len(), "{got}");
            for (i, cells) in rows.iter().enumerate() {
                let lo = i.saturating_sub(before);
                let hi = (i + after).min(xs.len() - 1);
                let frame: Vec<f64> = xs[lo..=hi].iter().flatten().copied().collect();
                let (sum, avg) = match exact_sum(&frame) {
                    None => ("".to_string(), "".to_string()),
                    Some(s) => (fmt(s), fmt(s / frame.len() as f64)),
                };
                assert!(
                    close(cells[1], &sum),
                    "frame {before}/{after} row {i} {frame:?}: sum {} vs {sum}",
                    cells[1]
                );
                assert!(
                    close(cells[2], &avg),
                    "frame {before}/{after} row {i} {frame:?}: avg {} vs {avg}",
                    cells[2]
                );
            }
        }
    }

    /// The frame's sum worked out by counting each large value (the others are small halves,
    /// whose sum is exact): what summing them without rounding would give, then rounded.
    fn exact_sum(frame: &[f64]) -> Option<f64> {
        if frame.is_empty() {
            return None;
        }
        let count = |v: f64| frame.iter().filter(|x| x.to_bits() == v.to_bits()).count() as f64;
        let (inf, neg_inf) = (count(f64::INFINITY), count(f64::NEG_INFINITY));
        if frame.iter().any(|x| x.is_nan()) || inf > 0.0 && neg_inf > 0.0 {
            return Some(f64::NAN);
        }
        if inf > 0.0 || neg_inf > 0.0 {
            return Some(if inf > 0.0 { f64::INFINITY } else { f64::NEG_INFINITY });
        }
        let small: f64 = frame.iter().filter(|x| x.abs() < 1e15).sum();
        Some((count(1e308) - count(-1e308)) * 1e308 + count(1e16) * 1e16 + small)
    }

    fn fmt(x: f64) -> String {
        format!("{}", arrow::array::Float64Array::from(vec![x]).value(0))
    }

    /// Equal, or both numbers within rounding of each other.
    fn close(got: &str, want: &str) -> bool {
        match (got.parse::<f64>(), want.parse::<f64>()) {
            (Ok(a), Ok(b)) if a.is_finite() && b.is_finite() => {
                (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
            }
            (Ok(a), Ok(b)) => a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
            _ => got == want,
        }
    }
}
