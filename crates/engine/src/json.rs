//! The JSON functions of datafusion-functions-json, each evaluated once per distinct document
//! in a batch.
//!
//! Event properties repeat: a page view's `{"$title": …}` has as many values as the site has
//! pages. Parsing is the cost (`json_get_str` over 9.6M rows was 1.2 s of CPU in the
//! property_values query at 30M events), so when a batch's documents repeat, each distinct one
//! is parsed once and the answers are spread back to the rows. A batch whose first rows are
//! mostly distinct goes straight to the function, having cost one hash per row sampled.

use std::sync::Arc;

use arrow::array::{Array, ArrayAccessor, ArrayRef, AsArray, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::execution::{FunctionRegistry, SessionStateBuilder};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF};
use datafusion::prelude::SessionContext;
use hashbrown::HashMap;

use super::fast_path::{self, FastPath};

/// Rows looked at before deciding whether a batch's documents repeat enough.
const SAMPLE: usize = 1024;

/// Registers the JSON functions, each taking an untyped NULL argument as a string
/// (`fixes::null_args_as_strings`) and, with `once_per_document`, wrapped to parse a repeated
/// document once.
pub fn register(ctx: &mut SessionContext, once_per_document: bool) -> Result<()> {
    datafusion_functions_json::register_all(ctx)?;
    // The crate's functions are those it registers into a registry that starts empty.
    let mut own = SessionStateBuilder::new().build();
    datafusion_functions_json::register_all(&mut own)?;
    let names: Vec<String> = own.scalar_functions().keys().cloned().collect();
    for name in &names {
        let function = ctx.udf(name)?;
        // A function registered under several names is met once per name.
        if function.name() == name.as_str() {
            ctx.register_udf(Arc::new(super::fixes::null_args_as_strings(function)))?;
        }
    }
    if once_per_document {
        for name in &names {
            fast_path::register(ctx, name, OncePerDocument)?;
        }
    }
    Ok(())
}

/// Parses each distinct document of a batch once.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct OncePerDocument;

impl FastPath for OncePerDocument {
    fn invoke(&self, function: &ScalarUDF, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let Some((docs, firsts, of_row)) = repeated(&args.args) else {
            return function.invoke_with_args(args);
        };
        args.args[0] = ColumnarValue::Array(take(docs.as_ref(), &firsts, None)?);
        args.number_rows = firsts.len();
        let answers: ArrayRef = function.invoke_with_args(args)?.into_array(firsts.len())?;
        Ok(ColumnarValue::Array(take(answers.as_ref(), &of_row, None)?))
    }
}

/// For a string array of documents with scalar paths: the documents, and what `distinct`
/// finds in them.
fn repeated(args: &[ColumnarValue]) -> Option<(ArrayRef, UInt32Array, UInt32Array)> {
    let (ColumnarValue::Array(docs), paths) = args.split_first()? else { return None };
    if !paths.iter().all(|p| matches!(p, ColumnarValue::Scalar(_))) {
        return None;
    }
    let (firsts, of_row) = match docs.data_type() {
        DataType::Utf8View => distinct(docs.as_string_view()),
        DataType::Utf8 => distinct(docs.as_string::<i32>()),
        DataType::LargeUtf8 => distinct(docs.as_string::<i64>()),
        _ => None,
    }?;
    Some((docs.clone(), firsts, of_row))
}

/// The first row of each distinct document (null is one of them) and, for every row, the
/// index of its document among those; `None` when the sample shows most rows are distinct.
fn distinct<'a, A: ArrayAccessor<Item = &'a str>>(docs: A) -> Option<(UInt32Array, UInt32Array)> {
    let mut index: HashMap<Option<&str>, u32> = HashMap::new();
    let mut firsts = Vec::new();
    let mut of_row = Vec::with_capacity(docs.len());
    for row in 0..docs.len() {
        if row == SAMPLE && firsts.len() * 2 > SAMPLE {
            return None;
        }
        let doc = docs.is_valid(row).then(|| docs.value(row));
        let i = *index.entry(doc).or_insert_with(|| {
            firsts.push(row as u32);
            firsts.len() as u32 - 1
        });
        of_row.push(i);
    }
    Some((UInt32Array::from(firsts), UInt32Array::from(of_row)))
}

#[cfg(test)]
mod tests {
    use arrow::array::{StringArray, StringViewArray};
    use arrow::datatypes::Field;
    use datafusion::common::ScalarValue;
    use datafusion::config::ConfigOptions;
    use datafusion::execution::FunctionRegistry;
    use std::sync::Arc;

    use super::*;
    use crate::fast_path::WithFastPath;

    async fn udf(name: &str) -> (Arc<ScalarUDF>, Arc<ScalarUDF>) {
        let mut ctx = SessionContext::new();
        datafusion_functions_json::register_all(&mut ctx).unwrap();
        let plain = ctx.udf(name).unwrap();
        register(&mut ctx, true).unwrap();
        let wrapped = ctx.udf(name).unwrap();
        let once = wrapped.inner().as_any().downcast_ref::<WithFastPath<OncePerDocument>>().expect("wrapped");
        assert!(
            !once.function.inner().as_any().is::<WithFastPath<OncePerDocument>>(),
            "{name} is wrapped twice"
        );
        (plain, wrapped)
    }

    #[test]
    fn the_crates_functions_and_only_those_are_wrapped() {
        use datafusion_functions_json::udfs;
        let json: Vec<String> = [
            udfs::json_get_udf(),
            udfs::json_get_bool_udf(),
            udfs::json_get_float_udf(),
            udfs::json_get_int_udf(),
            udfs::json_get_json_udf(),
            udfs::json_get_array_udf(),
            udfs::json_as_text_udf(),
            udfs::json_get_str_udf(),
            udfs::json_contains_udf(),
            udfs::json_length_udf(),
            udfs::json_object_keys_udf(),
            udfs::json_from_scalar_udf(),
        ]
        .iter()
        .map(|f| f.name().to_string())
        .collect();
        let mut ctx = SessionContext::new();
        register(&mut ctx, true).unwrap();
        for (name, f) in ctx.state().scalar_functions() {
            let once = WithFastPath::<OncePerDocument>::wrapped(f.inner().as_ref()).is_some();
            assert_eq!(once, json.contains(&f.name().to_string()), "{name}");
        }
    }

    fn call(f: &ScalarUDF, docs: ArrayRef, path: &[&str], returns: DataType) -> ArrayRef {
        let mut args = vec![ColumnarValue::Array(docs.clone())];
        let mut arg_fields = vec![Arc::new(Field::new("docs", docs.data_type().clone(), true))];
        for p in path {
            args.push(ColumnarValue::Scalar(ScalarValue::Utf8(Some(p.to_string()))));
            arg_fields.push(Arc::new(Field::new("p", DataType::Utf8, false)));
        }
        let args = ScalarFunctionArgs {
            args,
            arg_fields,
            number_rows: docs.len(),
            return_field: Arc::new(Field::new("r", returns, true)),
            config_options: Arc::new(ConfigOptions::default()),
        };
        f.invoke_with_args(args).unwrap().into_array(docs.len()).unwrap()
    }

    /// Repeated page-view documents, a few others, nulls and broken JSON.
    fn docs(n: usize, distinct_every: usize) -> Vec<Option<String>> {
        (0..n)
            .map(|i| match i % 7 {
                0 => None,
                1 => Some("{not json".to_string()),
                2 => Some(format!(r#"{{"a": {{"b": {}}}, "$title": "t{}"}}"#, i % 5, i % 4)),
                _ if distinct_every > 0 && i % distinct_every == 0 => {
                    Some(format!(r#"{{"$title": "only {i}"}}"#))
                }
                _ => Some(format!(r#"{{"$title": "page {}", "amount": {}.5}}"#, i % 13, i % 3)),
            })
            .collect()
    }

    #[tokio::test]
    async fn answers_equal_the_plain_function() {
        let cases: [(&str, &[&str]); 7] = [
            ("json_get_str", &["$title"]),
            ("json_get_float", &["amount"]),
            ("json_get_int", &["a", "b"]),
            ("json_contains", &["amount"]),
            ("json_get", &["a"]),
            ("json_object_keys", &[]),
            ("json_as_text", &["a"]),
        ];
        for (name, path) in cases {
            let (plain, wrapped) = udf(name).await;
            let mut types = vec![DataType::Utf8View];
            types.extend(path.iter().map(|_| DataType::Utf8));
            let returns = plain.return_type(&types).unwrap();
            for every in [0, 3, 1] {
                let rows = docs(5000, every);
                let view: ArrayRef = Arc::new(StringViewArray::from(rows.clone()));
                let utf8: ArrayRef = Arc::new(StringArray::from(rows));
                for input in [view, utf8] {
                    let want = call(&plain, input.clone(), path, returns.clone());
                    let got = call(&wrapped, input, path, returns.clone());
                    assert_eq!(&got, &want, "{name} {path:?}, distinct every {every}");
                }
            }
        }
    }

    #[test]
    fn repeated_documents_are_parsed_once_and_distinct_ones_are_left_alone() {
        let repeated = StringViewArray::from(docs(5000, 0));
        let (firsts, of_row) = distinct(&repeated).unwrap();
        assert!(firsts.len() < 70, "{} distinct documents", firsts.len());
        assert_eq!(of_row.len(), 5000);
        for row in 0..5000 {
            let first = firsts.value(of_row.value(row) as usize) as usize;
            assert_eq!(repeated.is_valid(first), repeated.is_valid(row));
            assert_eq!(repeated.value(first), repeated.value(row));
        }
        let unique =
            StringViewArray::from((0..5000).map(|i| format!(r#"{{"id": {i}}}"#)).collect::<Vec<_>>());
        assert!(distinct(&unique).is_none());
    }
}
