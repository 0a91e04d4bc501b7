//! A built-in scalar function with a faster evaluation for some arguments.
//!
//! The wrapper takes the function's name, signature, types and placement from the function
//! itself, so plans are unchanged; only evaluation goes through the [`FastPath`] first.

use std::any::Any;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How to evaluate some calls faster than the function does.
pub trait FastPath: Debug + PartialEq + Eq + Hash + Send + Sync + 'static {
    /// Evaluates `args`, calling `function` for anything the fast path does not cover.
    fn invoke(&self, function: &ScalarUDF, args: ScalarFunctionArgs) -> Result<ColumnarValue>;
}

/// Replaces the registered function `name` with itself plus `path`, once.
pub fn register<P: FastPath>(ctx: &mut SessionContext, name: &str, path: P) -> Result<()> {
    let function = ctx.udf(name)?;
    // A function registered under several names is met once per name.
    if !function.inner().as_any().is::<WithFastPath<P>>() {
        ctx.register_udf(Arc::new(ScalarUDF::new_from_impl(WithFastPath { function, path })))?;
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct WithFastPath<P> {
    pub function: Arc<ScalarUDF>,
    path: P,
}

impl<P: FastPath> ScalarUDFImpl for WithFastPath<P> {
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
        self.function.signature()
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.function.return_type(args)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.function.return_field_from_args(args)
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.function.coerce_types(args)
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.function.inner().placement(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.function.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.path.invoke(&self.function, args)
    }
}
