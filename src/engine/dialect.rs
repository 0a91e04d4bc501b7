//! Basin SQL statements DataFusion does not plan itself, rewritten to the queries that
//! answer them. Everything else goes to DataFusion unchanged.

/// The rewritten SQL, or `None` when the statement needs no rewriting.
pub fn rewrite(sql: &str) -> Option<String> {
    let words: Vec<String> =
        sql.trim().trim_end_matches(';').split_whitespace().map(|w| w.to_ascii_uppercase()).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["SHOW", "DATABASES" | "NAMESPACES" | "SCHEMAS"] => Some(format!(
            "SELECT schema_name AS namespace FROM information_schema.schemata \
             WHERE catalog_name = '{}' AND schema_name <> 'information_schema' ORDER BY 1",
            super::CATALOG
        )),
        ["SHOW", "TABLES", "IN" | "FROM", _] => {
            let ns = sql.trim().trim_end_matches(';').split_whitespace().nth(3)?;
            let ns = ns.trim_matches('"').replace('\'', "''");
            Some(format!(
                "SELECT table_schema AS namespace, table_name FROM information_schema.tables \
                 WHERE table_catalog = '{}' AND table_schema = '{ns}' ORDER BY 2",
                super::CATALOG
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites() {
        assert!(rewrite("show databases;").unwrap().contains("information_schema.schemata"));
        assert!(rewrite("SHOW NAMESPACES").is_some());
        assert!(rewrite("SHOW TABLES IN glass").unwrap().contains("table_schema = 'glass'"));
        assert!(rewrite("SHOW TABLES IN gl'ass").unwrap().contains("'gl''ass'"));
        assert_eq!(rewrite("SELECT 1"), None);
        assert_eq!(rewrite("SHOW TABLES"), None);
    }
}
