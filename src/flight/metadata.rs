//! What Flight SQL clients ask about before they query: catalogs, schemas, tables, table
//! types and the server's SQL capabilities. Listings come from the same catalog SQL sees, so a
//! versioned table (`glass.events`) is listed as the union SQL reads.

use std::collections::HashSet;

use arrow::array::AsArray;
use arrow::datatypes::Schema;
use arrow::record_batch::RecordBatch;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetTableTypes, CommandGetTables, SqlInfo,
    SqlNullOrdering, SqlSupportedCaseSensitivity, SqlSupportedTransaction,
};
use datafusion::datasource::TableType;
use datafusion::prelude::SessionContext;
use skiff_engine::{CATALOG, Engine, response_schema};

use crate::error::{Result, SkiffError};

const TABLE_TYPES: [&str; 2] = ["TABLE", "VIEW"];

fn table_type_name(t: TableType) -> &'static str {
    match t {
        TableType::Base | TableType::Temporary => "TABLE",
        TableType::View => "VIEW",
    }
}

pub fn catalogs(cmd: CommandGetCatalogs) -> Result<RecordBatch> {
    let mut b = cmd.into_builder();
    b.append(CATALOG);
    Ok(b.build()?)
}

pub fn schemas(engine: &Engine, cmd: CommandGetDbSchemas) -> Result<RecordBatch> {
    let mut b = cmd.into_builder();
    if let Some(catalog) = engine.catalog() {
        for schema in catalog.schema_names() {
            b.append(CATALOG, schema);
        }
    }
    b.build().map_err(bad_pattern)
}

/// The builders filter by the client's LIKE patterns when they build: what fails there is the
/// client's pattern.
fn bad_pattern(e: arrow_flight::error::FlightError) -> SkiffError {
    SkiffError::BadRequest(format!("the filter pattern does not compile: {e}"))
}

pub fn table_types(cmd: CommandGetTableTypes) -> Result<RecordBatch> {
    let mut b = cmd.into_builder();
    for t in TABLE_TYPES {
        b.append(t);
    }
    Ok(b.build()?)
}

/// Tables matching the client's filters; with `include_schema`, each one's Arrow schema.
/// The filters are applied before any table is loaded, so a broken table that the client did
/// not ask about cannot fail its listing.
pub async fn tables(engine: &Engine, cmd: CommandGetTables) -> Result<RecordBatch> {
    let Some(catalog) = engine.catalog() else { return Ok(cmd.into_builder().build()?) };
    let mut all = Vec::new();
    for schema_name in catalog.schema_names() {
        let Some(schema) = catalog.schema(&schema_name) else { continue };
        for table in schema.table_names() {
            let kind = schema.table_type(&table).await?.unwrap_or(TableType::Base);
            all.push((schema_name.clone(), table, table_type_name(kind)));
        }
    }
    // The builder owns the LIKE-pattern and type filters: run it once without schemas to learn
    // which tables pass them.
    let mut probe = CommandGetTables { include_schema: false, ..cmd.clone() }.into_builder();
    for (s, t, k) in &all {
        probe.append(CATALOG, s, t, k, &Schema::empty())?;
    }
    let wanted: HashSet<(String, String)> = {
        let batch = probe.build().map_err(bad_pattern)?;
        let s = batch.column(1).as_string::<i32>();
        let t = batch.column(2).as_string::<i32>();
        (0..batch.num_rows()).map(|i| (s.value(i).to_string(), t.value(i).to_string())).collect()
    };
    let include_schema = cmd.include_schema;
    let mut b = cmd.into_builder();
    for (s, t, k) in all {
        if !wanted.contains(&(s.clone(), t.clone())) {
            continue;
        }
        let table_schema = if include_schema {
            let provider = catalog
                .schema(&s)
                .ok_or_else(|| SkiffError::TableNotFound(format!("schema not found: {s}")))?
                .table(&t)
                .await?
                .ok_or_else(|| SkiffError::TableNotFound(format!("table not found: {s}.{t}")))?;
            response_schema(&provider.schema()).as_ref().clone()
        } else {
            Schema::empty()
        };
        b.append(CATALOG, &s, &t, k, &table_schema)?;
    }
    Ok(b.build()?)
}

/// The answers to `GetSqlInfo`, built once: what JDBC's `DatabaseMetaData` and ADBC's
/// `get_info` ask for.
pub fn sql_info(ctx: &SessionContext) -> SqlInfoData {
    let state = ctx.state();
    let functions: HashSet<&str> = state
        .scalar_functions()
        .keys()
        .chain(state.aggregate_functions().keys())
        .chain(state.window_functions().keys())
        .map(String::as_str)
        .collect();
    // Only functions this session really has are claimed.
    let have = |names: &[&str]| -> Vec<String> {
        names.iter().filter(|n| functions.contains(*n)).map(|n| n.to_string()).collect()
    };
    let keywords: Vec<String> =
        datafusion::sql::sqlparser::keywords::ALL_KEYWORDS.iter().map(|k| k.to_string()).collect();

    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "skiff");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, arrow_flight_version());
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(SqlInfo::FlightSqlServerTransaction, SqlSupportedTransaction::None as i32);
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, false);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    // Unquoted identifiers fold to lower case; quoted ones keep their case.
    b.append(SqlInfo::SqlIdentifierCase, SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32,
    );
    b.append(SqlInfo::SqlAllTablesAreSelectable, true);
    // DataFusion sorts NULLs last ascending, first descending: "high".
    b.append(SqlInfo::SqlNullOrdering, SqlNullOrdering::SqlNullsSortedHigh as i32);
    b.append(SqlInfo::SqlKeywords, keywords);
    b.append(
        SqlInfo::SqlNumericFunctions,
        have(&[
            "abs", "acos", "asin", "atan", "atan2", "cbrt", "ceil", "cos", "degrees", "exp", "floor", "ln",
            "log", "log10", "log2", "pi", "power", "radians", "random", "round", "signum", "sin", "sqrt",
            "tan", "trunc",
        ]),
    );
    b.append(
        SqlInfo::SqlStringFunctions,
        have(&[
            "ascii",
            "btrim",
            "char_length",
            "chr",
            "concat",
            "concat_ws",
            "initcap",
            "left",
            "length",
            "lower",
            "lpad",
            "ltrim",
            "md5",
            "regexp_like",
            "regexp_match",
            "regexp_replace",
            "repeat",
            "replace",
            "reverse",
            "right",
            "rpad",
            "rtrim",
            "split_part",
            "starts_with",
            "strpos",
            "substr",
            "to_hex",
            "translate",
            "trim",
            "upper",
        ]),
    );
    b.append(SqlInfo::SqlSystemFunctions, have(&["arrow_typeof", "version"]));
    b.append(
        SqlInfo::SqlDatetimeFunctions,
        have(&[
            "current_date",
            "current_time",
            "date_bin",
            "date_part",
            "date_trunc",
            "from_unixtime",
            "now",
            "to_char",
            "to_date",
            "to_timestamp",
            "to_timestamp_millis",
            "to_timestamp_seconds",
            "to_unixtime",
        ]),
    );
    b.append(SqlInfo::SqlSearchStringEscape, "\\");
    b.append(SqlInfo::SqlExtraNameCharacters, "");
    b.append(SqlInfo::SqlSupportsColumnAliasing, true);
    b.append(SqlInfo::SqlNullPlusNullIsNull, true);
    b.append(SqlInfo::SqlSupportsTableCorrelationNames, true);
    b.append(SqlInfo::SqlSupportsDifferentTableCorrelationNames, false);
    b.append(SqlInfo::SqlSupportsExpressionsInOrderBy, true);
    b.append(SqlInfo::SqlSupportsOrderByUnrelated, true);
    b.append(SqlInfo::SqlSupportsLikeEscapeClause, true);
    b.append(SqlInfo::SqlSupportsNonNullableColumns, true);
    b.append(SqlInfo::SqlSupportsIntegrityEnhancementFacility, false);
    b.append(SqlInfo::SqlSchemaTerm, "schema");
    b.append(SqlInfo::SqlProcedureTerm, "procedure");
    b.append(SqlInfo::SqlCatalogTerm, "catalog");
    b.append(SqlInfo::SqlCatalogAtStart, true);
    b.append(SqlInfo::SqlSelectForUpdateSupported, false);
    b.append(SqlInfo::SqlStoredProceduresSupported, false);
    b.append(SqlInfo::SqlCorrelatedSubqueriesSupported, true);
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.append(SqlInfo::SqlBatchUpdatesSupported, false);
    b.append(SqlInfo::SqlSavepointsSupported, false);
    b.append(SqlInfo::SqlNamedParametersSupported, false);
    b.append(SqlInfo::SqlLocatorsUpdateCopy, false);
    b.append(SqlInfo::SqlStoredFunctionsUsingCallSyntaxSupported, false);
    b.append(SqlInfo::SqlDataDefinitionCausesTransactionCommit, false);
    b.append(SqlInfo::SqlDataDefinitionsInTransactionsIgnored, false);
    b.build().expect("static SqlInfo values are well-formed")
}

/// The Arrow version the Flight front end is built on (the crates share one version number).
fn arrow_flight_version() -> &'static str {
    "58"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_types_are_listed() {
        let batch = table_types(CommandGetTableTypes {}).unwrap();
        let col = batch.column(0).as_string::<i32>();
        let got: Vec<&str> = col.iter().flatten().collect();
        assert_eq!(got, TABLE_TYPES);
    }
}
