//! JSON functions given an untyped NULL.

use std::any::Any;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ExpressionPlacement, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};

/// `json_get_str(NULL, 'q')` is NULL, as in Basin SQL: datafusion-functions-json 0.53 refuses
/// an argument of SQL's untyped NULL ("expected a string, got Null"), so such an argument is
/// taken as a NULL string. Upstream: datafusion-functions-json checks argument types in
/// `return_type_check`, which has no case for `Null`.
pub fn null_args_as_strings(function: Arc<ScalarUDF>) -> ScalarUDF {
    let volatility = function.signature().volatility;
    ScalarUDF::new_from_impl(NullArgsAsStrings { function, signature: Signature::user_defined(volatility) })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct NullArgsAsStrings {
    function: Arc<ScalarUDF>,
    signature: Signature,
}

/// The JSON function `f` takes untyped NULLs for, when `f` is such a wrapper.
pub fn wrapped(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
    f.as_any().downcast_ref::<NullArgsAsStrings>().map(|w| w.function.as_ref())
}

impl ScalarUDFImpl for NullArgsAsStrings {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.function.name()
    }

    fn aliases(&self) -> &[String] {
        self.function.aliases()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        Ok(args.iter().map(|t| if t.is_null() { DataType::Utf8 } else { t.clone() }).collect())
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.function.return_type(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.function.invoke_with_args(args)
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.function.inner().placement(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.function.documentation()
    }
}
