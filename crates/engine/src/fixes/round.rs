//! `round(x, d)` of a double near the ends of its range. DataFusion 53.1 computes
//! `(x * 10^d).round() / 10^d`, so `round(1e308, 1)` overflows to `inf / inf` and answers NaN
//! (and `round(1.5, 400)` too, with `10^400 = inf`). The right answer is `x` itself whenever
//! `x * 10^d` is beyond the range, since a double that large is already a whole number at
//! every digit `d >= 0` can name; with `d < 0` so large that `10^d` is 0, it is 0. Upstream:
//! `datafusion/functions/src/math/round.rs` (`round_float`); no issue filed yet.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float32Array, Float64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, Float32Type, Float64Type, Int32Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};

/// DataFusion's `round`, with the overflow above answered right.
pub fn round() -> ScalarUDF {
    ScalarUDF::new_from_impl(Round(datafusion::functions::math::round()))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Round(Arc<ScalarUDF>);

/// DataFusion's `round`, when `f` is the fixed one.
pub fn wrapped(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
    f.as_any().downcast_ref::<Round>().map(|r| r.0.as_ref())
}

impl ScalarUDFImpl for Round {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    fn aliases(&self) -> &[String] {
        self.0.aliases()
    }

    fn signature(&self) -> &Signature {
        self.0.signature()
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.0.coerce_types(args)
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.0.return_type(args)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.0.return_field_from_args(args)
    }

    fn output_ordering(&self, input: &[ExprProperties]) -> Result<SortProperties> {
        self.0.output_ordering(input)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let x = args.args[0].clone();
        let d = args.args.get(1).cloned();
        let out = self.0.invoke_with_args(args)?;
        if !matches!(out.data_type(), DataType::Float64 | DataType::Float32) {
            return Ok(out);
        }
        let scalar = matches!(x, ColumnarValue::Scalar(_))
            && d.as_ref().is_none_or(|d| matches!(d, ColumnarValue::Scalar(_)));
        let (x, rounded) = (x.into_array(rows)?, out.into_array(rows)?);
        let places: Option<ArrayRef> = match d {
            Some(d) => Some(cast(&d.into_array(rows)?, &DataType::Int32)?),
            None => None,
        };
        let place = |i: usize| places.as_ref().map_or(0, |p| p.as_primitive::<Int32Type>().value(i));
        let fixed: ArrayRef = match rounded.data_type() {
            DataType::Float64 => {
                let (x, r) = (x.as_primitive::<Float64Type>(), rounded.as_primitive::<Float64Type>());
                Arc::new(Float64Array::from_iter(
                    (0..r.len()).map(|i| r.is_valid(i).then(|| settle(x.value(i), r.value(i), place(i)))),
                ))
            }
            _ => {
                let (x, r) = (x.as_primitive::<Float32Type>(), rounded.as_primitive::<Float32Type>());
                Arc::new(Float32Array::from_iter((0..r.len()).map(|i| {
                    r.is_valid(i).then(|| settle(x.value(i) as f64, r.value(i) as f64, place(i)) as f32)
                })))
            }
        };
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&fixed, 0)?)
        } else {
            ColumnarValue::Array(fixed)
        })
    }
}

/// The rounded value, or what it is when the scaling left the range of a double.
fn settle(x: f64, rounded: f64, places: i32) -> f64 {
    if rounded.is_finite() || !x.is_finite() {
        rounded
    } else if places >= 0 {
        x
    } else {
        0.0_f64.copysign(x)
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{answer, session};

    #[tokio::test]
    async fn round_near_the_ends_of_the_range_of_doubles() {
        let ctx = session(&Default::default(), 64 << 20, &[]);
        let sql = "SELECT round(CAST(1e308 AS DOUBLE), 1) AS a, round(CAST(2.5e307 AS DOUBLE), 2) AS b, \
                   round(1.25, 400) AS c, round(CAST(-1e308 AS DOUBLE), -400) AS d, round(2.345, 2) AS e, \
                   round(CAST('NaN' AS DOUBLE), 1) AS f, round(CAST(1e308 AS FLOAT), 1) AS g";
        let text = answer(&ctx, sql).await;
        assert!(text.contains("| 1e308 | 2.5e307 | 1.25 | -0.0 | 2.35 | NaN | inf |"), "{text}");
        // per row, from columns
        let rows = "SELECT round(x, d) AS r FROM (VALUES (CAST(1e308 AS DOUBLE), 1), (1.5, 400), (1.25, 1), \
                    (CAST(NULL AS DOUBLE), 1)) t(x, d)";
        let text = answer(&ctx, rows).await;
        for want in ["| 1e308 |", "| 1.5   |", "| 1.3   |", "|       |"] {
            assert!(text.contains(want), "{want} in {text}");
        }
    }
}
