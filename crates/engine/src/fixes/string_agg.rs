//! `string_agg(x, d ORDER BY y DESC)` over input already sorted by `y` ascending: DataFusion
//! 53.1 reverses the aggregate to use the input's order (`reverse_expr` is `Reversed`), and the
//! reversed string_agg answered in ascending order, the order its input came in. skiff's
//! `string_agg` cannot be reversed, so DataFusion sorts its input as the ORDER BY says.
//! Upstream: `datafusion/functions-aggregate/src/string_agg.rs`; no issue filed yet.

use std::any::Any;
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, ReversedUDAF, Signature,
};

pub fn string_agg() -> AggregateUDF {
    AggregateUDF::new_from_impl(NotReversed(datafusion::functions_aggregate::string_agg::string_agg_udaf()))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct NotReversed(Arc<AggregateUDF>);

impl AggregateUDFImpl for NotReversed {
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

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.0.return_type(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.0.state_fields(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.0.accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::NotSupported
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use crate::testing::on_and_off;

    /// `string_agg(… ORDER BY … DESC)` over input sorted ascending (a sorted CTE read twice)
    /// answers in descending order, with skiff's rules and without.
    #[tokio::test]
    async fn an_ordered_string_agg_over_input_sorted_the_other_way() {
        let names = ["AE", "AR", "BR", "DE", "US", "ZA"];
        let countries = StringArray::from_iter_values((0..6000).map(|i| names[i % 6]));
        let schema = Arc::new(Schema::new(vec![Field::new("country", DataType::Utf8, false)]));
        let events = RecordBatch::try_new(schema, vec![Arc::new(countries)]).unwrap();
        let sql = "WITH c AS (SELECT country FROM e ORDER BY 1 LIMIT 5000) \
                   SELECT (SELECT count(*) FROM c) AS n, \
                   (SELECT substr(string_agg(country, '' ORDER BY country DESC), 1, 6) FROM c) AS s";
        let (on, off) = on_and_off(&[("e", events)], sql).await;
        assert!(off.contains("| 5000 | USUSUS |"), "{off}");
        assert_eq!(on, off);
    }
}
