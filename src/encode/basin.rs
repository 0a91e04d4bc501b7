//! Basin SQL's response envelope and its names for Arrow types.
//!
//! Success: `{"success": true, "errors": [], "result": {"request_id", "schema", "rows",
//! "metrics"}, "messages": []}`; failure: `{"success": false, "errors": [{"code",
//! "message"}], "messages": [], "result": null}`. Rows use the JSON encoding of `json`.

use arrow::datatypes::{DataType, Field, SchemaRef};
use serde_json::{Value, json};

use crate::error::SkiffError;

/// Basin prints Arrow types the way arrow-rs's `Debug` does (`Timestamp(Microsecond, None)`),
/// which newer arrow's `Display` no longer matches. A union (`json_get`'s values) is `Union`:
/// its `Debug` lists every member with its metadata, in an order that changes run to run.
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Union(..) => "Union".to_string(),
        _ => format!("{t:?}"),
    }
}

fn is_nested(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
            | DataType::Struct(_)
            | DataType::Map(..)
    )
}

/// A schema entry: `{"name", "type"}`, or `{"name", "descriptor"}` for nested types.
pub fn schema_entry(f: &Field) -> Value {
    if is_nested(f.data_type()) {
        json!({"name": f.name(), "descriptor": descriptor(f)})
    } else {
        json!({"name": f.name(), "type": type_name(f.data_type())})
    }
}

fn descriptor(f: &Field) -> Value {
    json!({"type": type_descriptor(f.data_type()), "nullable": f.is_nullable()})
}

fn type_descriptor(t: &DataType) -> Value {
    match t {
        DataType::List(c) | DataType::LargeList(c) | DataType::ListView(c) | DataType::LargeListView(c) => {
            json!({"name": "list", "item": descriptor(c)})
        }
        DataType::FixedSizeList(c, n) => json!({"name": "list", "size": n, "item": descriptor(c)}),
        DataType::Struct(fields) => json!({
            "name": "struct",
            "fields": fields.iter().map(|f| json!({"name": f.name(), "descriptor": descriptor(f)})).collect::<Vec<_>>(),
        }),
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                json!({"name": "map", "key": descriptor(&kv[0]), "value": descriptor(&kv[1])})
            }
            other => json!({"name": type_name(other)}),
        },
        other => json!({"name": type_name(other)}),
    }
}

pub fn schema(schema: &SchemaRef) -> Value {
    Value::Array(schema.fields().iter().map(|f| schema_entry(f)).collect())
}

/// The failure envelope.
pub fn failure(e: &SkiffError) -> Value {
    json!({
        "success": false,
        "errors": [{"code": e.basin_code(), "message": e.to_string()}],
        "messages": [],
        "result": null,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::TimeUnit;

    use super::*;

    #[test]
    fn names_as_basin_prints_them() {
        assert_eq!(type_name(&DataType::Int64), "Int64");
        assert_eq!(type_name(&DataType::Utf8), "Utf8");
        assert_eq!(
            type_name(&DataType::Timestamp(TimeUnit::Microsecond, None)),
            "Timestamp(Microsecond, None)"
        );
        assert_eq!(
            type_name(&DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from("UTC")))),
            "Timestamp(Microsecond, Some(\"UTC\"))"
        );
        let list = Field::new("l", DataType::List(Arc::new(Field::new("item", DataType::Int64, true))), true);
        assert_eq!(
            schema_entry(&list),
            json!({"name": "l", "descriptor": {"type": {"name": "list", "item": {"type": {"name": "Int64"}, "nullable": true}}, "nullable": true}})
        );
    }
}
