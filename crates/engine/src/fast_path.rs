//! A built-in scalar function with a faster evaluation for some arguments.
//!
//! The wrapper takes everything that shapes a plan (name, signature, types, simplification,
//! orderings, bounds, placement) from the function itself, so plans are unchanged; only
//! evaluation goes through the [`FastPath`] first, and a path may keep a call from being
//! simplified away.

use std::any::Any;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::preimage::PreimageResult;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How to evaluate some calls faster than the function does.
pub trait FastPath: Debug + PartialEq + Eq + Hash + Send + Sync + 'static {
    /// Evaluates `args`, calling `function` for anything the fast path does not cover.
    fn invoke(&self, function: &ScalarUDF, args: ScalarFunctionArgs) -> Result<ColumnarValue>;

    /// The function's own rewrite of a call, unless the path evaluates the call itself.
    fn simplify(
        &self,
        function: &ScalarUDF,
        args: Vec<Expr>,
        info: &SimplifyContext,
    ) -> Result<ExprSimplifyResult> {
        function.simplify(args, info)
    }
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

impl<P: FastPath> WithFastPath<P> {
    /// The function `f` evaluates, when `f` is this path's wrapper.
    pub fn wrapped(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
        f.as_any().downcast_ref::<Self>().map(|w| w.function.as_ref())
    }
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

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.path.simplify(&self.function, args, info)
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.function.inner().schema_name(args)
    }

    fn preimage(&self, args: &[Expr], lit_expr: &Expr, info: &SimplifyContext) -> Result<PreimageResult> {
        self.function.inner().preimage(args, lit_expr, info)
    }

    fn short_circuits(&self) -> bool {
        self.function.short_circuits()
    }

    fn conditional_arguments<'a>(&self, args: &'a [Expr]) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.function.conditional_arguments(args)
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> Result<Interval> {
        self.function.inner().evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> Result<Option<Vec<Interval>>> {
        self.function.inner().propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.function.inner().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.function.inner().preserves_lex_ordering(inputs)
    }
}
